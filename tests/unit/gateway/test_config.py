"""Gateway settings: replica specs, YAML keys checked one by one (bounds too), flags over the
file, the README's list of keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from kvtide.errors import ConfigError
from kvtide.gateway import config as gateway_config
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
        (
            "timeouts: {connect_s: -1}\n",
            r"^timeouts.connect_s: expected a finite number > 0, got -1.0$",
        ),
        ("timeouts: {read_s: .inf}\n", r"^timeouts.read_s: expected a finite number > 0, got inf$"),
        ("timeouts: {keep_alive_s: 0}\n", r"^timeouts.keep_alive_s: expected a finite number > 0"),
        ("timeouts: {drain_s: -0.5}\n", r"^timeouts.drain_s: expected a finite number >= 0"),
        (
            "failover: {eject_after: 0}\n",
            r"^failover.eject_after: expected a finite number > 0, got 0$",
        ),
        ("failover: {scrape_interval_s: .nan}\n", r"^failover.scrape_interval_s: .* got nan$"),
        (
            "failover: {eject_s: 90}\n",
            r"^failover.max_eject_s: 60.0 is below failover.eject_s 90.0$",
        ),
        (
            "limits: {max_concurrency: 0}\n",
            r"^limits.max_concurrency: expected a finite number > 0",
        ),
        ("limits: {tokens_per_minute: -1}\n", r"^limits.tokens_per_minute: .* >= 0, got -1$"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(str(path))


def test_the_readme_lists_every_section_key_with_its_default() -> None:
    readme = Path(gateway_config.__file__).with_name("README.md").read_text()
    block = readme.split("**Settings.**", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    listed = yaml.safe_load(block)
    for name, cls in gateway_config._SECTIONS.items():
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        assert listed[name] == defaults, name
    assert set(listed) == set(gateway_config._SECTIONS)
