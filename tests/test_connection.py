"""Where Temporal is: flags over the environment over a temporal.toml profile (testbed/engines/temporal/connection.py), what worker
processes inherit, and which chaos faults an external cluster cannot have. No server: these take milliseconds."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cli.options import add_connection_arguments
from testbed.engines import make_engine
from chaos.generator import schedule
from chaos.runner import skip_reason, unavailable_nemeses
from chaos.scenarios import SCENARIOS
from testbed.engines.temporal.connection import (CHILD_ENV, DEFAULT_ADDRESS, TemporalConnection,
                                connection_from_args, redact_argv)

TOML = """\
[profile.default]
address = "file.example:7233"
namespace = "from-file"

[profile.prod]
address = "prod.example:7233"
namespace = "prod-ns"
api_key = "file-secret-key"

[profile.prod.tls]
server_name = "prod.internal"
"""


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A clean environment (no TEMPORAL_* of the machine's, no inherited connection) whose config file is ours."""
    import os

    for key in list(os.environ):
        if key.startswith("TEMPORAL_") or key == CHILD_ENV:
            monkeypatch.delenv(key)
    config = tmp_path / "temporal.toml"
    config.write_text(TOML)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    return monkeypatch


def resolve(*argv: str, embedded_default: bool = True) -> TemporalConnection:
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser, embedded_default=embedded_default)
    return connection_from_args(parser.parse_args(list(argv)), embedded_default=embedded_default)


def test_the_default_profile_applies_without_flags_or_variables(env) -> None:
    conn = resolve()
    assert (conn.address, conn.namespace) == ("file.example:7233", "from-file")
    assert conn.sources == {"address": "profile default", "namespace": "profile default"}


def test_variables_override_the_profile_and_flags_override_both(env) -> None:
    env.setenv("TEMPORAL_NAMESPACE", "from-env")
    env.setenv("TEMPORAL_ADDRESS", "env.example:7233")
    conn = resolve()
    assert (conn.address, conn.namespace) == ("env.example:7233", "from-env")
    conn = resolve("--address", "flag.example:7233")
    assert (conn.address, conn.namespace) == ("flag.example:7233", "from-env")
    assert conn.sources["address"] == "flag" and conn.sources["namespace"] == "TEMPORAL_NAMESPACE"
    assert resolve("--namespace", "from-flag").namespace == "from-flag"


def test_a_named_profile_by_variable_or_flag_carries_its_tls_and_key(env) -> None:
    env.setenv("TEMPORAL_PROFILE", "prod")
    conn = resolve()
    assert (conn.address, conn.namespace, conn.tls_server_name) == ("prod.example:7233", "prod-ns", "prod.internal")
    assert conn.api_key == "file-secret-key" and conn.uses_tls
    env.delenv("TEMPORAL_PROFILE")
    assert resolve("--profile", "prod").namespace == "prod-ns"
    assert resolve("--profile", "prod", "--api-key", "flag-key").api_key == "flag-key"


def test_bad_environment_configuration_is_named(env, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Profile 'nope' not found"):
        resolve("--profile", "nope")
    env.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "missing.toml"))
    with pytest.raises(ValueError, match="TEMPORAL_CONFIG_FILE=.*missing.toml: no such file"):
        resolve()


def test_without_an_address_the_embedded_server_is_plain(env, tmp_path: Path) -> None:
    (tmp_path / "temporal.toml").write_text('[profile.default]\nnamespace = "ns"\napi_key = "k"\n')
    env.setenv("TEMPORAL_TLS", "true")
    conn = resolve()
    assert conn.embedded and conn.namespace == "ns"
    assert not conn.uses_tls and conn.api_key is None  # TLS and keys are for a cluster, not our dev server
    other = resolve(embedded_default=False)  # a command that never starts a server (dah worker, dah chat)
    assert other.address == DEFAULT_ADDRESS and other.uses_tls and other.api_key == "k"


def test_worker_processes_inherit_the_connection_through_a_proxy(env) -> None:
    env.setenv("TEMPORAL_PROFILE", "prod")
    parent = resolve("--tls-key-path", "/secret/k.pem", "--tls-cert-path", "/c.pem")
    child_env = parent.child_environment("127.0.0.1:40000")
    env.setenv(CHILD_ENV, child_env[CHILD_ENV])
    env.setenv("TEMPORAL_NAMESPACE", "ignored")  # a child reads its parent's connection, not the environment
    child = resolve("--address", "127.0.0.1:40000")
    assert (child.address, child.namespace, child.api_key) == ("127.0.0.1:40000", "prod-ns", "file-secret-key")
    assert child.tls_server_name == "prod.internal" and child.tls_key_path == "/secret/k.pem"
    # through a proxy, TLS verifies the cluster's own name when the profile gives none
    plain = TemporalConnection(address="cluster.example:7233", tls=True)
    assert json.loads(plain.child_environment("127.0.0.1:1")[CHILD_ENV])["tls_server_name"] == "cluster.example"
    # an embedded server's workers connect plainly whatever the machine's environment says
    assert json.loads(TemporalConnection().child_environment("127.0.0.1:2")[CHILD_ENV]) == {
        "address": "127.0.0.1:2", "namespace": "default"}


def test_secrets_never_reach_a_dump_or_a_recorded_command(env) -> None:
    env.setenv("TEMPORAL_PROFILE", "prod")
    env.setenv("TEMPORAL_TLS_CLIENT_KEY_DATA", "-----BEGIN PRIVATE KEY----- inline-secret")
    conn = resolve("--tls-cert-path", "/c.pem")
    dumped = f"{conn!r} {conn.redacted()}"
    assert "file-secret-key" not in dumped and "inline-secret" not in dumped
    assert conn.redacted()["api_key"] == conn.redacted()["tls_key_path"] == "<redacted>"
    assert redact_argv(["--api-key", "s1", "--api-key=s2", "--seed", "1"]) == [
        "--api-key", "<redacted>", "--api-key=<redacted>", "--seed", "1"]


def test_an_external_cluster_skips_server_restarts_and_never_draws_one() -> None:
    external = make_engine(connection=TemporalConnection(address="cluster.example:7233", namespace="ns"))
    embedded = make_engine()
    assert "cannot restart an external cluster" in skip_reason(external, SCENARIOS["server_restart"])
    assert skip_reason(external, SCENARIOS["kill_idle"]) is None and skip_reason(embedded, SCENARIOS["server_restart"]) is None
    mixed = SCENARIOS["mixed"]
    drawn = {e.op for seed in range(200)
             for e in schedule(mixed.events, mixed.random_events, mixed.fault_s, seed, unavailable_nemeses(external))}
    assert "restart_server" not in drawn and {"kill_worker", "partition"} <= drawn
    assert "restart_server" in {e.op for seed in range(200)
                                for e in schedule(mixed.events, mixed.random_events, mixed.fault_s, seed)}
    # a shared cluster: every run its own task queue; the embedded server's keeps the scenario's name
    assert external.task_queue(SCENARIOS["kill_idle"]) != external.task_queue(SCENARIOS["kill_idle"])
    assert embedded.task_queue(SCENARIOS["kill_idle"]) == "chaos-kill_idle"
    assert external.reproduce() == {"--address": "cluster.example:7233", "--namespace": "ns"}
