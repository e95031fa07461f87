"""The peer-libraries interpreter (vLLM's and SGLang's own classes, in the venv
bench/setup_peers.sh builds, never kvtide's) and one run of a peer script under it. A test
that needs it is skipped where the interpreter is absent or the script says a module is."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

PEER_PYTHON = Path(os.environ.get("KVTIDE_PEER_PYTHON", "/work/venvs/peerlibs/bin/python"))
MODULE_MISSING = 3
"""A peer script's exit status when a peer module does not import."""


def peer_python() -> Path:
    """The interpreter; the test is skipped without one."""
    if not PEER_PYTHON.exists():
        pytest.skip(f"no peer-libraries interpreter at {PEER_PYTHON}")
    return PEER_PYTHON


def run_peer(script: Path, *args: str, stdin: str | None = None, timeout_s: float = 240.0) -> Any:
    """``script``'s JSON answer, run with ``args`` (and ``stdin``) under the interpreter,
    warnings off (the peers' imports warn on stderr)."""
    proc = subprocess.run(
        [str(peer_python()), "-W", "ignore", str(script), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode == MODULE_MISSING:
        pytest.skip(f"a peer module is not importable: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)
