"""Tokenizing prompts: kvtide's fast path (``kvtide.text.fast_bpe``) against Hugging Face
``tokenizers`` on the same SmolLM2 tokenizer, and against the fast path's own full pattern on
the whole text (what it did before it cut around whitespace runs), on kinds of prompt text.
The fast path is timed as a list of ids (``encode``), as the int32 array the gateway hashes
(``encode_ids``, long pieces written by tiktoken with no list in between) and as that list
turned into the same array (what the gateway did before ``encode_ids``).

    nice python bench/tokenizer.py [--tokens 8000] [--runs 5] [--json FILE]

Texts, each rendered as one user message through SmolLM2's chat template (so it starts after
the template's newline) and seeded: ``words`` (one-token words after a leading space, as
``kvtide load`` sends a Mooncake trace's blocks), ``prose`` (paragraphs of 8 sentences, ~500
bytes, a blank line between them), ``prose, one line`` (the same sentences with single spaces
only), ``code`` (indented lines). Times are in this thread's CPU time per 1,000 tokens, the
median over ``--runs`` of a timed loop; ratios against kvtide's fast path. The ids are checked
equal first.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from kvtide.loadgen.prompts import one_token_vocabulary
from kvtide.text import Tokenizer, fast_bpe, smollm2
from revision import git_rev

SYSTEMS = (
    "kvtide fast path",
    "fast path, ids array",
    "list, then np.fromiter",
    "full pattern on the whole text",
    "hugging face tokenizers",
)
COLUMNS = ("list", "array", "list>array", "full pat.", "hf")
"""SYSTEMS as the table heads them (80 columns); the JSON keeps the names above."""
SENTENCE_WORDS = ("the", "a", "ship", "left", "port", "at", "dawn", "and", "we", "nine", "of")


def texts(tok: Tokenizer, num_tokens: int, seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    words = [w for w, _ in one_token_vocabulary(tok)]
    sentences = [
        " ".join(rng.choice(SENTENCE_WORDS) for _ in range(rng.randint(6, 18))).capitalize() + "."
        for _ in range(num_tokens // 12)
    ]
    paragraphs = [" ".join(sentences[i : i + 8]) for i in range(0, len(sentences), 8)]
    code = "\n".join(
        "    " * rng.randint(0, 3) + f"x{i} = compute(x{i - 1}, {rng.randint(0, 99)})  # step"
        for i in range(num_tokens // 14)
    )
    raw = {
        "words": "".join(rng.choice(words) for _ in range(num_tokens)),
        "prose": "\n\n".join(paragraphs),
        "prose, one line": " ".join(paragraphs),
        "code": code,
    }
    return {
        name: tok.apply_chat_template([{"role": "user", "content": text}])
        for name, text in raw.items()
    }


def _ratio(x: float) -> str:
    """Four characters and an x: 0.92x, 14.9x."""
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def per_1k_tokens_us(
    encode: Callable[[str], object], text: str, num_tokens: int, runs: int
) -> list[float]:
    out = []
    for _ in range(runs):
        loops = 0
        t0 = time.thread_time()
        while True:
            encode(text)
            loops += 1
            spent = time.thread_time() - t0
            if spent > 0.2:
                break
        out.append(spent / loops / num_tokens * 1e9)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8000, help="words per text, about its tokens")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, dest="json_path")
    args = p.parse_args(argv)
    if args.tokens < 100 or args.runs < 1:
        print("tokenizer: --tokens must be >= 100 and --runs >= 1", file=sys.stderr)
        return 2
    tok = smollm2()
    fast = tok.fast
    if fast is None:
        print(f"tokenizer: no fast path for smollm2 ({tok.fast_refusal})", file=sys.stderr)
        return 2
    print(f"bench/tokenizer.py rev {git_rev()} seed {args.seed} runs {args.runs}")

    def full_pattern(text: str) -> Iterable[int]:
        out = fast_bpe._IdsOut(as_arrays=False)
        fast._split(out, fast._full, text, fast._raw, fast._normalized)
        return out.to_list()

    encoders: tuple[Callable[[str], Iterable[int]], ...] = (
        lambda t: tok.encode(t, add_special_tokens=False),
        lambda t: tok.encode_ids(t, add_special_tokens=False),  # what the gateway calls
        lambda t: np.fromiter(tok.encode(t, add_special_tokens=False), dtype=np.int32),
        full_pattern,
        lambda t: tok.backend.encode(t, add_special_tokens=False).ids,
    )
    systems = dict(zip(SYSTEMS, encoders, strict=True))
    rows: dict[str, dict[str, float]] = {}
    print("us per 1,000 tokens, and x the list's:")
    for column, system in zip(COLUMNS, SYSTEMS, strict=True):
        print(f"  {column:<11} {system}")
    print(f"{'text':<15}{'tokens':>6}" + "".join(f"{c:>11}" for c in COLUMNS))
    for name, text in texts(tok, args.tokens, args.seed).items():
        expected = list(systems["hugging face tokenizers"](text))
        for system, encode in systems.items():
            if [int(i) for i in encode(text)] != expected:
                print(f"tokenizer: {system} gives other ids on {name!r}", file=sys.stderr)
                return 1
        n = len(expected)
        medians = {
            system: statistics.median(per_1k_tokens_us(encode, text, n, args.runs))
            for system, encode in systems.items()
        }
        rows[name] = {"tokens": n, **medians}
        base = medians["kvtide fast path"]
        cells = "".join(f"{us:>5.0f} {_ratio(us / base):>5}" for us in medians.values())
        print(f"{name:<15}{n:>6}{cells}")
    if args.json_path is not None:
        args.json_path.write_text(json.dumps({"rev": git_rev(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
