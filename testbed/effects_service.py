"""The external effects service: a scripted HTTP API (notes) that an agent's tools call, standing in for a real
external API, and the witness of every effect the agent has on the world.

Contract
--------
* ``POST /v1/notes`` with a JSON body ``{"text": "<note text>", "conversation": "<optional: workflow id>"}`` and
  an optional ``Idempotency-Key: <key>`` header applies one effect (a note) and answers 200
  ``{"note_id": "n-<n>", "text": ..., "replayed": false}``. A key already applied gets its stored response with
  ``"replayed": true`` and applies nothing; a request without a key is applied every time (recorded as keyless).
  A malformed request (not JSON, no string ``text``, a ``conversation`` that is not a string, a key over
  ``MAX_KEY_CHARS``, a body over ``MAX_BODY_BYTES``) is answered 400 ``{"error": "..."}``.
* ``GET /v1/notes`` (``?conversation=ID`` to filter) -> ``{"notes": [{"note_id", "text", "conversation"}]}``;
  ``GET /healthz`` -> 200 ``{"ok": true}``.
* The log (``log_path``, JSON lines, each line flushed as written so a SIGKILLed harness leaves it readable) has
  one line per request received and one per effect applied, plus faults and the service's start:
  ``{"event": "request", "time", "method", "path", "key", "conversation", "body" (at most ``LOG_BODY_CHARS``),
  "peer_port", "status" (null: no response was sent), "replayed"?, "note_id"?}``;
  ``{"event": "effect", "time", "kind": "note", "identity": "note:<text>", "text", "key", "note_id",
  "conversation", "peer_port"}``; ``{"event": "fault", "time", "fault", "outcome", ...}``; ``{"event": "started",
  "time", "url"}``. An effect's identity is its kind and its content: a duplicate is the same identity applied
  twice, whatever the keys (``chaos/checker/effects.py``).
* Admin routes (``GET /admin/stats``, ``POST|DELETE /admin/faults``; loopback only, with the admin token):
  ``POST /admin/faults`` ``{"faults": [EffectFault dicts]}`` replaces the armed faults (``testbed.faults.effects``
  holds them and their contracts):
  ``{"mode": "crash_after_effect", "count": 1, "match": null}``: the next ``count`` effects (null: each one)
  whose text contains ``match`` are applied and logged, then the service asks ``kill_caller`` (the harness) to
  kill the calling worker process *before* the response is sent, then drops the connection;
  ``{"mode": "status", "status": 503, "duration_s": 5.0, "count": null}``: note requests are answered that status
  (nothing applied) for ``duration_s`` seconds from arming, or ``count`` times.
* The harness's ``kill_caller`` (``testbed.faults.effects.kill_caller``) finds the calling worker process by its
  TCP port (``caller_pid``) and kills only a pid it started.
* The service plumbing is ``testbed.http_service``'s (its contract), as the scripted model's is: the admin token
  (401 without it, 403 with another), ``GET /healthz``, the bounds (here at most ``MAX_CONNECTIONS`` connections, a
  body over ``MAX_BODY_BYTES`` a 400); the service holds at most ``MAX_NOTES`` notes and ``MAX_KEYS`` keys.
* ``python -m testbed.effects_service --log FILE`` prints ``READY <url>`` and serves until SIGTERM/SIGINT; the
  admin token comes from ``DAH_EFFECTS_ADMIN_TOKEN``.

The notes routes are open to any local process: they are what the agent under test calls. Request headers are
never logged (the admin token travels in one).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from testbed.faults.effects import Armed, EffectFault, KillCaller
from testbed.http_service import HEADER_TIMEOUT_S, READ_TIMEOUT_S, HTTPService, ServiceHandler, serve_until_signalled

__all__ = ["EffectsService", "main", "ENV_EFFECTS_URL", "ADMIN_TOKEN_ENV"]

log = logging.getLogger(__name__)

#: what a worker process is told the service's base URL is (``{effects_url}`` in a worker command template)
ENV_EFFECTS_URL = "DAH_EFFECTS_URL"
ADMIN_TOKEN_ENV = "DAH_EFFECTS_ADMIN_TOKEN"
#: the largest request body: a note is a line of text, not a document
MAX_BODY_BYTES = 64 * 1024
MAX_KEY_CHARS = 256
#: what the service holds at most (a chaos run makes tens of notes): past it, notes are refused 503
MAX_NOTES = 20_000
MAX_KEYS = 20_000
#: how much of a request's body its log line keeps (the effect line keeps the whole note text)
LOG_BODY_CHARS = 2048
MAX_CONNECTIONS = 64
KIND_NOTE = "note"


def identity(kind: str, text: str) -> str:
    """An effect's identity: its kind and its content (the planned unique text), never its key."""
    return f"{kind}:{text}"


# --------------------------------------------------------------------------- the server


class _EffectsHandler(ServiceHandler):
    """The notes API and its admin routes, on the service plumbing (``testbed.http_service``)."""

    server_version = "DAHEffectsService/1.0"
    max_body_bytes = MAX_BODY_BYTES
    too_large_status = 400

    @property
    def service(self) -> EffectsService:
        return self.server.owner  # type: ignore[return-value]

    def error_payload(self, message: str, type_: str, code: str | None) -> Any:
        return {"error": message}

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code  # for the request's log line
        super().send_response(code, message)

    def handle_one_request(self) -> None:
        self._status: int | None = None
        self._record: dict[str, Any] | None = None
        try:
            super().handle_one_request()
        finally:
            if self._record is not None:  # a request was read: log it with how it was answered
                self.service._log_request({**self._record, "status": self._status})

    def _dispatch(self, body: bytes | None) -> None:
        key = self.headers.get("Idempotency-Key")
        text = (body or b"").decode("utf-8", errors="replace")
        self._record = {"event": "request", "time": time.time(), "method": self.command,
                        "path": self.path[:500], "key": key[:MAX_KEY_CHARS + 1] if key is not None else None,
                        "body": text[:LOG_BODY_CHARS], "peer_port": self.client_address[1]}
        super()._dispatch(body)

    def _list_notes(self, body: bytes) -> None:
        conversation = (parse_qs(urlsplit(self.path).query).get("conversation") or [None])[0]
        self._send_json(200, {"notes": self.service.notes(conversation)})

    def _clear_faults(self, body: bytes) -> None:
        self.service.set_faults([])
        self._send_json(200, {"ok": True, "faults": []})

    def _set_faults(self, raw: bytes) -> None:
        try:
            payload = json.loads(raw or b"{}")
            if not isinstance(payload, dict) or not isinstance(payload.get("faults"), list):
                raise ValueError('the body must be {"faults": [EffectFault objects]}')
            faults = [EffectFault.from_dict(f) for f in payload["faults"]]
        except (ValueError, TypeError) as exc:
            self._send_error(400, f"bad faults: {exc}")
            return
        self.service.set_faults(faults)
        self._send_json(200, {"ok": True, "faults": [asdict(f) for f in faults]})

    def _note(self, raw: bytes) -> None:
        assert self._record is not None
        key = self.headers.get("Idempotency-Key")
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            text, conversation = body.get("text"), body.get("conversation")
            if not isinstance(text, str):
                raise ValueError('the body needs "text": a string (the note)')
            if conversation is not None and not isinstance(conversation, str):
                raise ValueError('"conversation" must be a string (the workflow id) or absent')
            if key is not None and not (0 < len(key) <= MAX_KEY_CHARS):
                raise ValueError(f"the Idempotency-Key header must be 1 to {MAX_KEY_CHARS} characters")
        except (ValueError, RecursionError) as exc:
            self._send_error(400, f"malformed note request: {exc}")
            return
        self._record["conversation"] = conversation
        status = self.service._status_fault()
        if status is not None:
            self._send_error(status, f"the service is unavailable (injected fault: {status})")
            return
        try:
            answer, replayed, crash = self.service._apply(text, conversation, key, self.client_address[1])
        except OverflowError as exc:
            self._send_error(503, str(exc))
            return
        self._record.update(replayed=replayed, note_id=answer["note_id"])
        if crash is not None and self.service._crash(crash, answer, self.client_address[1], self.server.server_address[1]):
            self._reset_connection()  # the caller is dead: no response
            return
        self._send_json(200, {**answer, "replayed": replayed})

    routes = {**ServiceHandler.routes, ("GET", "/v1/notes"): _list_notes, ("POST", "/v1/notes"): _note,
              ("POST", "/admin/faults"): _set_faults, ("DELETE", "/admin/faults"): _clear_faults}


class EffectsService(HTTPService):
    """The notes API over HTTP, its JSON-lines log, and its faults (see the module docstring)."""

    handler = _EffectsHandler
    admin_token_env = ADMIN_TOKEN_ENV

    def __init__(self, log_path: Path | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 admin_token: str | None = None, kill_caller: KillCaller | None = None,
                 faults: list[EffectFault] | None = None, max_connections: int = MAX_CONNECTIONS,
                 read_timeout_s: float = READ_TIMEOUT_S, header_timeout_s: float = HEADER_TIMEOUT_S) -> None:
        """``kill_caller``: the harness's side of crash-after-effect (without one, that fault is logged as not
        injected and the request is answered)."""
        super().__init__(host=host, port=port, admin_token=admin_token, max_connections=max_connections,
                         read_timeout_s=read_timeout_s, header_timeout_s=header_timeout_s)
        self.log_path = Path(log_path) if log_path is not None else None
        self.kill_caller = kill_caller
        self._lock = threading.Lock()  # notes, keys, faults, counters
        self._log_lock = threading.Lock()
        self._log_file: Any = None
        self._notes: list[dict[str, Any]] = []
        self._keys: dict[str, dict[str, Any]] = {}
        self._armed: list[Armed] = []
        self._counts = {"requests": 0, "effects": 0, "replayed": 0, "keyless": 0, "crashes": 0, "status_faults": 0}
        self.set_faults(list(faults or []))

    def _started(self) -> None:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in _stopped()
        self._log({"event": "started", "time": time.time(), "url": self.url})
        log.debug("effects service listening on %s (log %s)", self.url, self.log_path)

    def _stopped(self) -> None:
        with self._log_lock:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    # -- what the harness reads and arms
    def notes(self, conversation: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(n) for n in self._notes if conversation is None or n["conversation"] == conversation]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self._counts, "notes": len(self._notes), "keys": len(self._keys),
                    "faults": [{**asdict(a.fault), "fired": a.fired} for a in self._armed]}

    def set_faults(self, faults: list[EffectFault]) -> None:
        now = time.monotonic()
        with self._lock:
            self._armed = [Armed(f, now) for f in faults]
        if self._httpd is not None:
            self._log({"event": "faults", "time": time.time(), "faults": [asdict(f) for f in faults]})

    # -- internals used by the handler
    def _log(self, record: dict[str, Any]) -> None:
        """One line, flushed: a harness SIGKILLed a moment later leaves it on disk (in the page cache)."""
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with self._log_lock:
            if self._log_file is not None:
                self._log_file.write(line)
                self._log_file.flush()

    def _log_request(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._counts["requests"] += 1
        self._log(record)

    def _status_fault(self) -> int | None:
        now = time.monotonic()
        with self._lock:
            for armed in self._armed:
                if armed.fault.mode == "status" and armed.active(now):
                    armed.fired += 1
                    self._counts["status_faults"] += 1
                    return armed.fault.status
        return None

    def _apply(self, text: str, conversation: str | None, key: str | None, peer_port: int
               ) -> tuple[dict[str, Any], bool, Armed | None]:
        """(the answer, whether it was a replay, the crash fault it fires); logs the effect before returning."""
        with self._lock:
            if key is not None and key in self._keys:
                self._counts["replayed"] += 1
                return dict(self._keys[key]), True, None
            if len(self._notes) >= MAX_NOTES or (key is not None and len(self._keys) >= MAX_KEYS):
                raise OverflowError(f"the service holds {len(self._notes)} notes and {len(self._keys)} keys, "
                                    f"its limit ({MAX_NOTES}); start a new one")
            note = {"note_id": f"n-{len(self._notes) + 1}", "text": text, "conversation": conversation}
            self._notes.append(note)
            answer = {"note_id": note["note_id"], "text": text}
            if key is not None:
                self._keys[key] = answer
            else:
                self._counts["keyless"] += 1
            self._counts["effects"] += 1
            crash = None
            now = time.monotonic()
            for armed in self._armed:
                if armed.fault.mode == "crash_after_effect" and armed.active(now) and (
                        armed.fault.match is None or armed.fault.match in text):
                    crash = armed
                    armed.fired += 1  # taken now: a concurrent effect does not fire it a second time
                    break
            # Logged under the lock: the log's order of effects is the order they were applied.
            self._log({"event": "effect", "time": time.time(), "kind": KIND_NOTE, "identity": identity(KIND_NOTE, text),
                       "text": text, "key": key, "note_id": note["note_id"], "conversation": conversation,
                       "peer_port": peer_port})
        return dict(answer), False, crash

    def _crash(self, armed: Armed, answer: dict[str, Any], peer_port: int, service_port: int) -> bool:
        """Ask the harness to kill the caller of an effect just applied; True if it did (send no response)."""
        record: dict[str, Any] = {"event": "fault", "fault": "crash_after_effect", "note_id": answer["note_id"],
                                  "peer_port": peer_port}
        killed = None
        if self.kill_caller is None:
            record["reason"] = "no harness is attached to kill the caller"
        else:
            try:
                killed = self.kill_caller(peer_port)
            except Exception as exc:  # noqa: BLE001 - a failed kill is recorded; the request is answered
                record["reason"] = f"the kill failed: {type(exc).__name__}: {exc}"
            else:
                if killed is None:
                    record["reason"] = ("no worker process the harness started holds the connection "
                                        f"from port {peer_port}")
        if killed is None:
            with self._lock:
                armed.fired -= 1  # not injected: the next matching effect tries again
        else:
            with self._lock:
                self._counts["crashes"] += 1
        self._log({**record, "time": time.time(), "outcome": "killed" if killed else "not_injected",
                   **({"killed": killed} if killed else {})})
        return killed is not None


# --------------------------------------------------------------------------- CLI


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.effects_service",
        description=("The scripted external effects service (a notes API honouring Idempotency-Key) with a "
                     "JSON-lines log of every request and effect. Prints 'READY <url>' once listening, then serves "
                     f"until SIGTERM/SIGINT. Admin routes need 'Authorization: Bearer TOKEN', TOKEN from "
                     f"${ADMIN_TOKEN_ENV} (unset: they are closed)."))
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free port (default: 0)")
    parser.add_argument("--log", type=Path, default=None, help="the JSON-lines log file (default: none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    return serve_until_signalled(EffectsService, args.log, host=args.host, port=args.port)


if __name__ == "__main__":
    sys.exit(main())
