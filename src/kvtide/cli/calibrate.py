"""`kvtide calibrate`: fit the cost model's prefill coefficients to measured rows."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvtide.cli._checks import check_writable, write_text
from kvtide.cli.cost import add_model_arguments
from kvtide.costs.calibration import Calibration, fit_prefill, read_prefill_csv
from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import gpu_preset, resolve_model


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit prefill coefficients to measured rows",
        description=(
            "Fits prefill efficiency, attention coefficient and iteration overhead to a CSV of "
            "measured prefills (header new_tokens,cached_tokens,seconds), prints the fit error "
            "and writes a calibration file that kvtide cost --calibration loads."
        ),
    )
    parser.add_argument("rows", type=Path, metavar="ROWS.csv", help="measured prefill rows")
    add_model_arguments(parser)
    parser.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="calibration file to write"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_writable(args.out, "--out")
    gpu = gpu_preset(args.gpu)
    model = resolve_model(args.model)
    cost = CostModel(model, gpu, args.tp, args.dtype)
    rows = read_prefill_csv(args.rows)
    fit = fit_prefill(cost, rows)
    c, error = fit.coefficients, fit.error
    calibration = Calibration(
        c,
        model.name,
        gpu.name,
        args.tp,
        {
            "prefill_mape": error.mape,
            "prefill_max_error": error.max_error,
            "prefill_rows": error.num_rows,
        },
    )
    write_text(args.out, calibration.to_json())
    print(
        f"fitted {error.num_rows} rows: prefill efficiency {c.prefill_efficiency:.3f}, "
        f"attention coefficient {c.attention_coefficient:.3f}, "
        f"iteration overhead {c.iteration_overhead_s * 1e3:.3f} ms"
    )
    print(f"fit error: MAPE {error.mape:.2%}, max {error.max_error:.2%}")
    print(f"wrote {args.out}")
    return 0
