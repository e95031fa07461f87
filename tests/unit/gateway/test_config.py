"""Gateway settings: replica specs, YAML keys checked one by one, flags over the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtide.errors import ConfigError
from kvtide.gateway.config import ReplicaSpec, load_config


def test_replica_spec_with_model_and_event_endpoints() -> None:
    spec = ReplicaSpec.parse("http://127.0.0.1:8001/=smol,events=tcp://127.0.0.1:5557")
    assert spec == ReplicaSpec("http://127.0.0.1:8001", "smol", "tcp://127.0.0.1:5557", None)
    assert spec.replica_id == "127.0.0.1:8001"
    assert ReplicaSpec.parse("http://h:1").model is None


@pytest.mark.parametrize(
    ("text", "match"),
    [("localhost:8000", "expected http"), ("http://h:1,evnts=x", "unknown option 'evnts=x'")],
)
def test_bad_replica_spec_names_the_problem(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ReplicaSpec.parse(text)


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        "port: 9001\npolicy: chash\nreplicas:\n  - http://127.0.0.1:1=m\n"
        "  - {url: 'http://127.0.0.1:2', model: n}\nlimits: {max_body_bytes: 1000}\n"
        "failover: {eject_after: 5, eject_s: 1}\n"
    )
    config = load_config(str(path), {"policy": "cost", "port": None})
    assert (config.port, config.policy) == (9001, "cost")
    assert [r.model for r in config.replicas] == ["m", "n"]
    assert config.limits.max_body_bytes == 1000
    assert config.failover.eject_after == 5 and config.failover.eject_s == 1.0
    assert config.config_path == str(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("prot: 1\n", "unknown key 'prot'"),
        ("limits: {max_body: 1}\n", r"limits.max_body: unknown key"),
        ("limits: {max_body_bytes: lots}\n", r"limits.max_body_bytes: expected int"),
        ("port: '80'\n", "port: expected an integer"),
        ("state: memcached\n", "state: expected local or redis"),
        ("replicas: [http://h:1, http://h:1]\n", "the same host:port twice"),
        ("- a\n", "expected a mapping at the top level"),
        ("port: [\n", r"gw.yaml:\d+: not valid YAML"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(str(path))
