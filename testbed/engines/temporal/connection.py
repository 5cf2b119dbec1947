"""Where Temporal is: the embedded dev server by default, or a cluster / Temporal Cloud.

Every command that talks to Temporal (``dah``, ``python -m chaos``, ``python -m benchmarks``, ``python -m
migration_fuzz``) takes the same options (``cli.options.add_connection_arguments``) and reads Temporal's environment
configuration (``temporalio.envconfig``), most specific first:

    1. the flags: --address, --namespace, --tls, --tls-cert-path, --tls-key-path, --tls-ca-path,
       --tls-server-name, --api-key, --profile
    2. the environment: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS,
       TEMPORAL_TLS_CLIENT_CERT_PATH / _DATA, TEMPORAL_TLS_CLIENT_KEY_PATH / _DATA,
       TEMPORAL_TLS_SERVER_CA_CERT_PATH / _DATA, TEMPORAL_TLS_SERVER_NAME
    3. a profile of a ``temporal.toml`` file: ``--profile`` or $TEMPORAL_PROFILE (default ``default``), from
       $TEMPORAL_CONFIG_FILE or the default path (``~/.config/temporalio/temporal.toml``)

No address anywhere: commands that can start the embedded dev server start it (and use no TLS, no API key);
the others use 127.0.0.1:7233. Secrets (the API key, a client key's path or data) never appear in a ``repr`` or
in ``redacted()``, which is what configuration dumps print.

Processes the harness starts (worker processes) get the connection it resolved, whole, in
``DAH_TEMPORAL_CONNECTION`` (``child_environment``): they read that instead of the environment configuration,
so a worker never connects differently from the harness that started it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.service import KeepAliveConfig, TLSConfig


REDACTED = "<redacted>"
DEFAULT_ADDRESS = "127.0.0.1:7233"
#: a child process's connection, as the harness that started it resolved it (JSON; ``child_environment``)
CHILD_ENV = "DAH_TEMPORAL_CONNECTION"


@dataclass
class TemporalConnection:
    address: str | None = None  # None: start the embedded dev server
    namespace: str = "default"
    tls: bool = False  # TLS with the system's roots, even without TLS files
    tls_disabled: bool = False  # the environment configuration said no TLS (TEMPORAL_TLS=false, tls.disabled)
    tls_cert_path: str | None = None
    tls_key_path: str | None = field(default=None, repr=False)
    tls_ca_path: str | None = None
    tls_server_name: str | None = None
    api_key: str | None = field(default=None, repr=False)
    # PEM given inline (TEMPORAL_TLS_*_DATA, or ``*_data`` in a profile) rather than as files
    tls_cert_data: bytes | None = field(default=None, repr=False)
    tls_key_data: bytes | None = field(default=None, repr=False)
    tls_ca_data: bytes | None = field(default=None, repr=False)
    sources: dict[str, str] = field(default_factory=dict, compare=False)  # setting -> "flag" / "environment" / ...

    @property
    def embedded(self) -> bool:
        return self.address is None

    @property
    def uses_tls(self) -> bool:
        if self.tls_disabled:
            return False
        return self.tls or bool(self.api_key or self.tls_cert_path or self.tls_ca_path or self.tls_server_name
                                or self.tls_cert_data or self.tls_ca_data)

    def redacted(self) -> dict[str, Any]:
        """A configuration dump safe for logs and reports."""
        return {
            "address": self.address or "embedded",
            "namespace": self.namespace,
            "tls": self.uses_tls,
            "tls_cert_path": self.tls_cert_path or ("<inline>" if self.tls_cert_data else None),
            "tls_key_path": REDACTED if (self.tls_key_path or self.tls_key_data) else None,
            "tls_ca_path": self.tls_ca_path or ("<inline>" if self.tls_ca_data else None),
            "tls_server_name": self.tls_server_name,
            "api_key": REDACTED if self.api_key else None,
            "from": dict(self.sources),
        }

    def _tls(self) -> TLSConfig | bool:
        if not self.uses_tls:
            return False
        if not (self.tls_cert_path or self.tls_key_path or self.tls_ca_path or self.tls_server_name
                or self.tls_cert_data or self.tls_key_data or self.tls_ca_data):
            return True  # the system's roots (Temporal Cloud API keys need TLS)
        if bool(self.tls_cert_path or self.tls_cert_data) != bool(self.tls_key_path or self.tls_key_data):
            raise ValueError("--tls-cert-path and --tls-key-path must be given together (mTLS needs both)")

        def read(data: bytes | None, path: str | None, flag: str) -> bytes | None:
            if data is not None or path is None:
                return data
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror})") from None

        return TLSConfig(
            client_cert=read(self.tls_cert_data, self.tls_cert_path, "--tls-cert-path"),
            client_private_key=read(self.tls_key_data, self.tls_key_path, "--tls-key-path"),
            server_root_ca_cert=read(self.tls_ca_data, self.tls_ca_path, "--tls-ca-path"),
            domain=self.tls_server_name,
        )

    async def connect(self, address: str | None = None, **kwargs: Any) -> Client:
        """A client of this connection's cluster; ``address``: the embedded dev server's, which is plain (no TLS,
        no API key) whatever the flags or the environment say. ``kwargs`` go to ``Client.connect`` (e.g.
        ``runtime=quiet_runtime()``)."""
        kwargs.setdefault("keep_alive_config", KEEP_ALIVE)
        if address is not None:
            return await Client.connect(address, namespace=self.namespace, **kwargs)
        if self.address is None:
            raise ValueError("no Temporal address: pass --address HOST:PORT (or set TEMPORAL_ADDRESS) or use a "
                             "command that starts the embedded server")
        return await Client.connect(self.address, namespace=self.namespace, tls=self._tls(), api_key=self.api_key,
                                    **kwargs)

    def for_child(self, address: str) -> TemporalConnection:
        """This connection as a worker process reaches it at ``address`` (a fault proxy in front of the cluster, or
        the embedded server): the embedded server is plain; through a proxy, TLS still verifies the cluster's name."""
        if self.embedded:
            return TemporalConnection(address=address, namespace=self.namespace)
        server_name = self.tls_server_name
        if self.uses_tls and server_name is None and address != self.address:
            server_name = self.address.rsplit(":", 1)[0]  # type: ignore[union-attr]
        return replace(self, address=address, tls_server_name=server_name, sources={})

    def child_environment(self, address: str) -> dict[str, str]:
        """The environment variable that hands ``for_child(address)`` to a worker process whole (secrets in the
        environment, never on a command line that ``ps`` or a run record shows)."""
        child = self.for_child(address)
        data = {}
        for f in fields(child):
            value = getattr(child, f.name)
            if f.name == "sources" or value in (None, False):
                continue
            data[f.name] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
        return {CHILD_ENV: json.dumps(data)}


#: HTTP/2 keep-alive pings: a connection whose peer went silent (a blackholed link, a frozen server) is closed
#: and re-dialled within ~15 s instead of the SDK's default ~45 s, during which a worker's polls hang unanswered.
#: 10 s is the shortest interval a stock Temporal frontend accepts (its keepAliveMinTime); faster pings are
#: answered with GOAWAY ("too_many_pings").
KEEP_ALIVE = KeepAliveConfig(interval_millis=10_000, timeout_millis=5_000)

_quiet_runtime = None


def quiet_runtime() -> Any:
    """A Temporal runtime whose core logs only errors: a driver's retries during a fault are expected, not news."""
    global _quiet_runtime
    if _quiet_runtime is None:
        from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

        _quiet_runtime = Runtime(telemetry=TelemetryConfig(
            logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))))
    return _quiet_runtime


def redact_argv(argv: list[str]) -> list[str]:
    """A command line fit for a run record: the value of ``--api-key`` replaced by ``<redacted>``."""
    out, secret = [], False
    for arg in argv:
        if secret:
            out.append(REDACTED)
        elif arg.startswith("--api-key="):
            out.append("--api-key=" + REDACTED)
        else:
            out.append(arg)
        secret = arg == "--api-key"
    return out


def _split_source(source: Any) -> tuple[str | None, bytes | None]:
    """An envconfig data source as (path, inline data)."""
    if source is None:
        return None, None
    if isinstance(source, Path):
        return str(source), None
    return None, source.encode() if isinstance(source, str) else bytes(source)


def environment_connection(profile: str | None = None, env: dict[str, str] | None = None) -> TemporalConnection:
    """The connection Temporal's environment configuration describes (no flags); ValueError naming what is wrong
    (an unknown profile, a config file that is not there or not TOML)."""
    from temporalio.envconfig import ClientConfigProfile

    env = dict(os.environ if env is None else env)
    config_file = env.get("TEMPORAL_CONFIG_FILE")
    if config_file and not Path(config_file).is_file():
        raise ValueError(f"TEMPORAL_CONFIG_FILE={config_file}: no such file (unset it to use the default path)")
    try:
        loaded = ClientConfigProfile.load(profile=profile, override_env_vars=env)
    except Exception as exc:  # the SDK's ConfigError: an unknown profile, a malformed file
        where = config_file or "the default temporal.toml"
        raise ValueError(f"Temporal environment configuration ({where}): {exc}") from None
    from_env = {"address": "TEMPORAL_ADDRESS", "namespace": "TEMPORAL_NAMESPACE", "api_key": "TEMPORAL_API_KEY"}
    name = profile or env.get("TEMPORAL_PROFILE") or "default"
    conn = TemporalConnection(address=loaded.address or None, namespace=loaded.namespace or "default",
                              api_key=loaded.api_key or None)
    for key, var in from_env.items():
        if getattr(loaded, key):
            conn.sources[key] = var if env.get(var) else f"profile {name}"
    if loaded.tls is not None:
        t = loaded.tls
        conn.tls_disabled = t.disabled is True
        conn.tls = t.disabled is False
        conn.tls_cert_path, conn.tls_cert_data = _split_source(t.client_cert)
        conn.tls_key_path, conn.tls_key_data = _split_source(t.client_private_key)
        conn.tls_ca_path, conn.tls_ca_data = _split_source(t.server_root_ca_cert)
        conn.tls_server_name = t.server_name
        conn.sources["tls"] = ("environment" if any(k.startswith("TEMPORAL_TLS") for k in env)
                               else f"profile {name}")
    return conn


def _child_connection(text: str) -> TemporalConnection:
    data = json.loads(text)
    for name in ("tls_cert_data", "tls_key_data", "tls_ca_data"):
        if name in data:
            data[name] = base64.b64decode(data[name])
    return TemporalConnection(**data, sources={"all": CHILD_ENV})


def connection_from_args(args: argparse.Namespace, *, embedded_default: bool = True) -> TemporalConnection:
    """The flags over the environment over the profile (see the module's docstring); ValueError naming a bad
    setting. ``embedded_default=False``: no address anywhere means 127.0.0.1:7233, not the embedded server."""
    inherited = os.environ.get(CHILD_ENV)
    conn = _child_connection(inherited) if inherited else environment_connection(getattr(args, "temporal_profile",
                                                                                         None))
    flags = {"address": args.address, "namespace": args.namespace, "tls": args.tls,
             "tls_cert_path": args.tls_cert_path, "tls_key_path": args.tls_key_path, "tls_ca_path": args.tls_ca_path,
             "tls_server_name": args.tls_server_name, "api_key": args.api_key}
    for name, value in flags.items():
        if value is not None:
            setattr(conn, name, value)
            conn.sources[name] = "flag"
            if name == "tls":
                conn.tls_disabled = False
            elif name == "tls_cert_path":
                conn.tls_cert_data = None
            elif name == "tls_key_path":
                conn.tls_key_data = None
            elif name == "tls_ca_path":
                conn.tls_ca_data = None
    if conn.address is None and not embedded_default:
        conn.address = DEFAULT_ADDRESS
    if conn.embedded:
        # The embedded server is plain: TLS and API keys from the environment are for a cluster.
        conn = TemporalConnection(namespace=conn.namespace, sources={k: v for k, v in conn.sources.items()
                                                                     if k == "namespace"})
    return conn
