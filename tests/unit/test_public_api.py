"""The library surface: ``kvtide.__all__`` resolves, loads lazily, and imports no torch."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import kvtide

INIT = Path(kvtide.__file__)
HEAVY = ("torch", "rich", "yaml", "zmq", "redis", "kvtide.sim", "kvtide.cli", "kvtide.tensors")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_kvtide_loads_only_errors_types_and_clocks() -> None:
    loaded = {m for m in _modules_after("import kvtide") if m.startswith("kvtide")}
    assert loaded == {"kvtide", "kvtide.clock", "kvtide.errors", "kvtide.types"}


def test_the_whole_public_api_imports_without_torch_or_servers() -> None:
    loaded = _modules_after("from kvtide import *")
    assert not [m for m in loaded if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]


def test_every_name_in_all_resolves_to_the_object_its_module_defines() -> None:
    lazy = kvtide._LAZY
    for name in kvtide.__all__:
        value = getattr(kvtide, name)
        if name in lazy:
            assert value is getattr(importlib.import_module(lazy[name]), name), name
    assert set(lazy) <= set(kvtide.__all__)
    assert set(dir(kvtide)) >= set(kvtide.__all__)


def test_the_lazy_table_matches_what_type_checkers_see() -> None:
    """The TYPE_CHECKING imports (what mypy and IDEs read) name the same modules as _LAZY."""
    tree = ast.parse(INIT.read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If))
    seen = {
        alias.name: node.module
        for node in ast.walk(guarded)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == kvtide._LAZY


def test_main_entry_points_are_exported() -> None:
    wanted = {
        "KVCache",
        "CacheConfig",
        "TieredCache",
        "TieredCacheConfig",
        "TierSpec",
        "Router",
        "RoutingContext",
        "Request",
        "RouteRequest",
        "RouteDecision",
        "CostModel",
        "model_preset",
        "gpu_preset",
        "Namespace",
        "hash_tokens",
        "ManualClock",
        "WallClock",
        "KvtideError",
        "UsageError",
    }
    assert wanted <= set(kvtide.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'KVCachee'"):
        kvtide.KVCachee  # noqa: B018


def test_public_dataclasses_resolve_their_annotations() -> None:
    """typing.get_type_hints works on them (what pydantic, cattrs and IDEs call)."""
    checked = 0
    for name in kvtide.__all__:
        value = getattr(kvtide, name)
        if dataclasses.is_dataclass(value):
            typing.get_type_hints(value)
            checked += 1
    assert checked >= 8
