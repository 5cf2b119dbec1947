"""Where Temporal is: the embedded dev server by default, or a cluster / Temporal Cloud.

Every command takes the same options (``--address``, ``--namespace``, TLS
files, ``--api-key``). Secrets never appear in a ``repr`` or in
``redacted()``, which is what configuration dumps print.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.service import KeepAliveConfig, TLSConfig


REDACTED = "<redacted>"


@dataclass
class TemporalConnection:
    address: str | None = None  # None: start the embedded dev server
    namespace: str = "default"
    tls: bool = False
    tls_cert_path: str | None = None
    tls_key_path: str | None = field(default=None, repr=False)
    tls_ca_path: str | None = None
    tls_server_name: str | None = None
    api_key: str | None = field(default=None, repr=False)

    @property
    def embedded(self) -> bool:
        return self.address is None

    def redacted(self) -> dict[str, Any]:
        """A configuration dump safe for logs and reports."""
        return {
            "address": self.address or "embedded",
            "namespace": self.namespace,
            "tls": self.tls or bool(self.tls_cert_path or self.tls_ca_path or self.api_key),
            "tls_cert_path": self.tls_cert_path,
            "tls_key_path": REDACTED if self.tls_key_path else None,
            "tls_ca_path": self.tls_ca_path,
            "tls_server_name": self.tls_server_name,
            "api_key": REDACTED if self.api_key else None,
        }

    def _tls(self) -> TLSConfig | bool:
        if not (self.tls_cert_path or self.tls_key_path or self.tls_ca_path or self.tls_server_name):
            return self.tls or bool(self.api_key)  # Temporal Cloud API keys need TLS
        if bool(self.tls_cert_path) != bool(self.tls_key_path):
            raise ValueError("--tls-cert-path and --tls-key-path must be given together (mTLS needs both)")

        def read(path: str | None, flag: str) -> bytes | None:
            if path is None:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror})") from None

        return TLSConfig(
            client_cert=read(self.tls_cert_path, "--tls-cert-path"),
            client_private_key=read(self.tls_key_path, "--tls-key-path"),
            server_root_ca_cert=read(self.tls_ca_path, "--tls-ca-path"),
            domain=self.tls_server_name,
        )

    async def connect(self, address: str | None = None, **kwargs: Any) -> Client:
        """A client (``address`` overrides this connection's own, e.g. an embedded server's); ``kwargs`` go to
        ``Client.connect`` (e.g. ``runtime=quiet_runtime()``)."""
        target = address or self.address
        if target is None:
            raise ValueError("no Temporal address: pass --address HOST:PORT or use a command that starts the embedded server")
        kwargs.setdefault("keep_alive_config", KEEP_ALIVE)
        return await Client.connect(target, namespace=self.namespace, tls=self._tls(), api_key=self.api_key, **kwargs)


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


def add_connection_arguments(parser: argparse.ArgumentParser, *, embedded_default: bool) -> None:
    g = parser.add_argument_group("Temporal connection")
    default_help = (
        "default: start an embedded dev server for this command" if embedded_default else "default: 127.0.0.1:7233"
    )
    g.add_argument("--address", default=None if embedded_default else "127.0.0.1:7233",
                   help=f"Temporal frontend HOST:PORT of an existing cluster or Temporal Cloud ({default_help})")
    g.add_argument("--namespace", default=os.environ.get("TEMPORAL_NAMESPACE", "default"),
                   help="Temporal namespace (default: $TEMPORAL_NAMESPACE or 'default')")
    g.add_argument("--tls", action="store_true", help="use TLS with the system's root certificates")
    g.add_argument("--tls-cert-path", help="client certificate for mTLS (PEM)")
    g.add_argument("--tls-key-path", help="client private key for mTLS (PEM)")
    g.add_argument("--tls-ca-path", help="server CA certificate (PEM), for private CAs")
    g.add_argument("--tls-server-name", help="server name to verify, if it differs from the address")
    g.add_argument("--api-key", default=None,
                   help="Temporal Cloud API key (default: $TEMPORAL_API_KEY); implies --tls; never printed")


def connection_from_args(args: argparse.Namespace) -> TemporalConnection:
    return TemporalConnection(
        address=args.address,
        namespace=args.namespace,
        tls=args.tls,
        tls_cert_path=args.tls_cert_path,
        tls_key_path=args.tls_key_path,
        tls_ca_path=args.tls_ca_path,
        tls_server_name=args.tls_server_name,
        api_key=args.api_key or os.environ.get("TEMPORAL_API_KEY") or None,
    )
