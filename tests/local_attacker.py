"""Another local user, attacking a live run: run as uid 65534 by ``tests/test_local_attacker.py``.

    python tests/local_attacker.py '{"ports": [...], "workflows": [...], "namespace": "default"}'

On every port it is given, on 127.0.0.1, it tries: a TCP connection; a forged effects POST, twice (the probe's
attack that turned a reference run into fail); a direct model request; a Temporal client's signal and update to
each of the run's workflows. It prints one JSON object: per port, what each attempt got (``connected``: a TCP
connection was accepted and not closed unread).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import urllib.error
import urllib.request


def connected(port: int) -> bool:
    """A connection accepted and kept: a server that closes an admitted-by-no-one connection unread counts as no."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            # Up to 10 s for the close: the server checks the peer's owner first, and beside two CPU hogs that took
            # over half a second (a closed connection then counted as a live peer). Only a failing case waits it out.
            s.settimeout(10)
            try:
                return s.recv(1) != b""  # an immediate close (EOF) is a refusal; data or a timeout is a live peer
            except TimeoutError:
                return True
            except OSError:
                return False
    except OSError:
        return False


def http(port: int, path: str, body: dict, headers: dict | None = None) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=3) as r:
            return f"http {r.status}"
    except urllib.error.HTTPError as exc:
        return f"http {exc.code}"
    except (OSError, ValueError) as exc:
        return f"no answer ({type(exc).__name__})"


async def temporal(port: int, namespace: str, workflows: list[str]) -> dict[str, str]:
    from temporalio.client import Client

    try:
        client = await asyncio.wait_for(Client.connect(f"127.0.0.1:{port}", namespace=namespace), 5)
    except Exception as exc:  # noqa: BLE001 - any failure to connect is the outcome
        return {"connect": f"failed ({type(exc).__name__})"}
    out = {"connect": "ok"}
    for wid in workflows:
        handle = client.get_workflow_handle(wid)
        for kind, call in (("signal", lambda: handle.signal("end_chat")),
                           ("update", lambda: handle.execute_update("send_message", "forged"))):
            try:
                await asyncio.wait_for(call(), 5)
                out[f"{kind} {wid}"] = "ok"
            except Exception as exc:  # noqa: BLE001
                out[f"{kind} {wid}"] = f"failed ({type(exc).__name__})"
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    results = {}
    for port in spec["ports"]:
        note = {"text": "save the note 'forged'", "content": "forged"}
        results[port] = {
            "connected": connected(port),
            "effects_post": [http(port, "/v1/notes", note, {"Idempotency-Key": f"forged-{i}"}) for i in range(2)],
            "model_request": http(port, "/v1/chat/completions",
                                  {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}),
            "temporal": asyncio.run(temporal(port, spec.get("namespace", "default"), spec["workflows"][:3])),
        }
    print(json.dumps(results), flush=True)
    # The Temporal client's native runtime keeps threads of its own; an interpreter that finalises while one of
    # them releases the GIL aborts ("PyGILState_Release ... finalizing", exit -6, seen once in CI) after the
    # results are out. Nothing is left to clean up: leave without finalising.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
