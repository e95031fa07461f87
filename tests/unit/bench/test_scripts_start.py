"""Every benchmark starts as its docstring says, ``python bench/NAME.py``, from anywhere: its
imports resolve (siblings through bench/ on sys.path, kvtide as installed) and ``--help``
prints its usage. A benchmark is run rarely, so a broken import would otherwise wait for the
next person who needs the numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
# the scripts, not the modules they share (revision.py, page_lru.py)
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if '__name__ == "__main__"' in p.read_text())


def test_every_benchmark_prints_its_usage(tmp_path: Path) -> None:
    assert len(SCRIPTS) >= 20, SCRIPTS  # the glob found the folder
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a shell starts it
    failed = []
    for batch in (SCRIPTS[i : i + 6] for i in range(0, len(SCRIPTS), 6)):
        procs = [
            (s, subprocess.Popen([sys.executable, str(s), "--help"], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            for s in batch
        ]  # fmt: skip
        for script, proc in procs:
            out, err = proc.communicate(timeout=120)
            if proc.returncode != 0 or "usage:" not in out:
                failed.append(f"{script.name}: rc {proc.returncode}: {err.strip()[-300:]}")
    assert not failed, "\n".join(failed)
