"""Gateway settings: replica specs, YAML keys checked one by one (bounds too), flags over the
file, the README's list of keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvtide.cli import build_parser
from kvtide.cli import serve as serve_cli
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
    [
        ("localhost:8000", "expected http"),
        ("http://h:1,evnts=x", "unknown option 'evnts=x'"),
        # the intake connects these only once the replica is added: checked before
        ("http://h:1,events=foo", r"'http://h:1,events=foo': events: expected a ZMQ endpoint"),
        ("http://h:1,replay=tcp://h", "replay: expected a ZMQ endpoint such as tcp://HOST:PORT"),
        ("http://h:1,events=", "events: expected a ZMQ endpoint"),
        ("http://:80", "expected http"),
        # urlsplit's and .port's ValueErrors, as ConfigErrors naming the flag
        ("http://[::1", r"^--replica 'http://\[::1': not a valid URL \(Invalid IPv6 URL\)"),
        ("http://h:99999", r"^--replica 'http://h:99999': not a valid URL \(Port out of range"),
        ("http://h:x", "not a valid URL"),
        ("http://h:0", "port 0 is not a port to connect to"),
        # the host:port is the replica's id (logs, metrics) and its Host header
        ("http://user:pw@h:1", "user or password in the URL is not supported"),
        ("http://h:1,role=prefil", r"role: expected one of both, prefill, decode, got 'prefil'"),
    ],
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
        ("limits: {max_body_bytes: true}\n", r"^limits.max_body_bytes: expected int, got True$"),
        (f"timeouts: {{read_s: {10**400}}}\n", r"^timeouts.read_s: expected float"),
        ("timeouts: {body_s: 0}\n", r"^timeouts.body_s: expected a finite number > 0, got 0.0$"),
        ("state: null\n", r"gw.yaml: state: expected a string, got None$"),
        ("overrides: x\n", "unknown key 'overrides'"),
        # wrong shapes: a ConfigError naming the key, not a TypeError (a SIGHUP logs it and
        # keeps the running config; at startup it is one line and exit 2)
        ("replicas: 5\n", r"gw.yaml: replicas: expected a list of URLs or mappings, got 5$"),
        ("replicas: [5]\n", r"gw.yaml: replicas\[0\]: expected a URL string or a mapping"),
        (
            "replicas: [http://h:1, {url: 'http://h:2', model: 5}]\n",
            r"gw.yaml: replicas\[1\].model: expected a string or null, got 5$",
        ),
        ("replicas: [{url: 'http://h:1', model: [m]}]\n", r"replicas\[0\].model: .* got \['m'\]$"),
        ("replicas: [{url: 'http://h:1', events: 5}]\n", r"replicas\[0\].events: expected a str"),
        ("replicas: [{url: 'http://h:1', replay: {}}]\n", r"replicas\[0\].replay: expected a str"),
        ("replicas: [{url: 'http://h:1', events: x}]\n", r"replicas\[0\].events: expected a ZMQ"),
        ("replicas: [{url: 'http://h:1', mdl: m}]\n", r"replicas\[0\]: unknown keys \['mdl'\]"),
        ("replicas: ['http://[::1']\n", r"gw.yaml: replicas\[0\] 'http://\[::1': not a valid URL"),
        ("replicas: [{url: 'http://u:p@h:1'}]\n", r"replicas\[0\].url 'http://u:p@h:1': user"),
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


_SHAPES: list[object] = [5, 1.5, True, None, "x", [1], ["x"], [{"url": 5}], {"a": 1}]


def _keys() -> list[str]:
    top = [f.name for f in dataclasses.fields(gateway_config.GatewayConfig)]
    nested = [
        f"{name}.{f.name}"
        for name, cls in gateway_config._SECTIONS.items()
        for f in dataclasses.fields(cls)
    ]
    return top + nested + ["replicas.0", "replicas.0.url", "replicas.0.model"]


def _doc(key: str, value: object) -> dict[str, Any]:
    """A config with ``value`` at ``key`` ("limits.max_body_bytes"; "replicas.0.model": in a
    list of one mapping with a url)."""
    doc: dict[str, Any] = {}
    *outer, last = key.split(".")
    node: Any = doc
    for part in outer:
        if part == "replicas":
            node = node.setdefault("replicas", [{"url": "http://h:1"}])
        elif part == "0":
            node = node[0]
        else:
            node = node.setdefault(part, {})
    node[int(last) if isinstance(node, list) else last] = value
    return doc


@pytest.mark.parametrize("key", _keys())
def test_a_value_of_any_shape_is_taken_or_one_config_error(tmp_path: Path, key: str) -> None:
    path = tmp_path / "gw.yaml"
    for value in _SHAPES:
        path.write_text(yaml.safe_dump(_doc(key, value)))
        try:
            load_config(str(path))
        except ConfigError as exc:  # anything else (a TypeError) fails the test
            assert "\n" not in str(exc)


def test_a_bad_replica_flag_is_named_as_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("replicas: [http://h:1]\n")
    with pytest.raises(ConfigError, match=r"^--replica 'http://h:1=m,x': unknown option"):
        load_config(str(path), {"replicas": ["http://h:1=m,x"]})


def test_a_replica_role_from_the_spec_a_mapping_or_the_flags(tmp_path: Path) -> None:
    assert ReplicaSpec.parse("http://h:1=m,role=decode").role == "decode"
    assert ReplicaSpec.parse("http://h:1").role == "both"
    raw = {"replicas": [{"url": "http://h:1", "role": "prefill"}]}
    assert gateway_config.from_mapping(raw).replicas[0].role == "prefill"
    with pytest.raises(ConfigError, match=r"replicas\[0\]\.role: expected one of"):
        gateway_config.from_mapping({"replicas": [{"url": "http://h:1", "role": "x"}]})
    args = build_parser().parse_args(
        ["serve", "--prefill", "http://h:1=m,events=tcp://h:9", "--decode", "http://h:2"]
    )
    assert [ReplicaSpec.parse(s).role for s in serve_cli._replicas(args)] == ["prefill", "decode"]
    bad = build_parser().parse_args(["serve", "--decode", "http://h:2,role=prefill"])
    with pytest.raises(ConfigError, match="--decode 'http://h:2,role=prefill': the flag gives"):
        serve_cli._replicas(bad)


def test_a_replica_mapping_keeps_the_model_its_url_names() -> None:
    raw = {"replicas": [{"url": "http://h:1=m", "events": "tcp://h:2"}]}
    (spec,) = gateway_config.from_mapping(raw).replicas
    assert spec == ReplicaSpec("http://h:1", "m", "tcp://h:2", None)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"admin_key": "a", "admin_key_sha256": "0" * 64}, "admin_key and admin_key_sha256"),
        ({"admin_key_sha256": "abc"}, "admin_key_sha256: expected 64 hex digits"),
        ({"admin_key_sha256": "g" * 64}, "admin_key_sha256: expected 64 hex digits"),
        ({"admin_key": ""}, "admin_key: empty"),
    ],
)
def test_admin_key_settings_are_checked(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        gateway_config.from_mapping(raw)


def test_an_admin_key_given_on_top_replaces_the_files_hash(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(f"admin_key_sha256: {'ab' * 32}\n")
    assert load_config(str(path)).admin_key_sha256 == "ab" * 32
    config = load_config(str(path), {"admin_key": "flag"})
    assert (config.admin_key, config.admin_key_sha256) == ("flag", None)
