"""A client for ``DahAgent/run`` invocations, addressed by their idempotency key (the run id).

* ``submit``: ``POST /DahAgent/run/send`` with ``idempotency-key: <run id>`` (again while the server is
  unreachable). A second submission with the same
  key does not start a second run: the ingress answers ``PreviouslyAccepted`` with the first one's invocation id
  (``tests/test_engine_restate.py`` checks it), whatever its body says;
* ``wait``: attach to the invocation (``GET /restate/invocation/DahAgent/run/<key>/attach``), again after a
  dropped connection (the server restarting) until the deadline;
* ``outcome``: ``GET .../<key>/output``: its result, its failure, or "not finished yet".
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import quote

import httpx

SERVICE, HANDLER = "DahAgent", "run"
QUEUED, DONE, FAILED = "queued", "done", "failed"
#: what the ingress answers for an invocation that has not finished (``.../output``)
NOT_READY = 470


class RestateRunError(RuntimeError):
    """The run ended with a terminal failure (a step gave up, or the model is misconfigured)."""


class RestateClient:
    def __init__(self, ingress_url: str) -> None:
        self.ingress_url = ingress_url.rstrip("/")
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0))

    async def close(self) -> None:
        await self._http.aclose()

    def _invocation(self, run_id: str) -> str:
        return f"{self.ingress_url}/restate/invocation/{SERVICE}/{HANDLER}/{quote(run_id, safe='')}"

    async def submit(self, run_id: str, body: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        """Start the run ``run_id`` unless it exists; the ingress's answer (``invocationId``, ``status``:
        ``Accepted`` or ``PreviouslyAccepted``). A connection that fails (the server restarting) is tried again
        until ``timeout_s``, as a Temporal client does: the idempotency key makes a repeat the same submission."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                resp = await self._http.post(f"{self.ingress_url}/{SERVICE}/{HANDLER}/send", json=body,
                                             headers={"idempotency-key": run_id})
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        if resp.status_code >= 300:
            raise RuntimeError(f"restate ingress refused run {run_id!r}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    async def call(self, handler: str, body: Any, timeout_s: float = 300.0) -> Any:
        """Call ``DahAgent/<handler>`` and wait for its answer (a request-response call, no idempotency key)."""
        resp = await self._http.post(f"{self.ingress_url}/{SERVICE}/{handler}", json=body,
                                     timeout=httpx.Timeout(timeout_s))
        if resp.status_code >= 300:
            raise RestateRunError(f"{SERVICE}/{handler} failed: HTTP {resp.status_code}: {_message(resp)}")
        return resp.json()

    async def wait(self, run_id: str, timeout_s: float) -> dict[str, Any]:
        """The run's result; RestateRunError if it failed; TimeoutError if it did not end within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                resp = await self._http.get(f"{self._invocation(run_id)}/attach", timeout=httpx.Timeout(left))
            except httpx.TimeoutException:
                break
            except httpx.TransportError:  # the server is restarting: attach again
                await asyncio.sleep(0.2)
                continue
            if resp.status_code == 200:
                return resp.json()
            if 400 <= resp.status_code < 500 and resp.status_code != 404:
                raise RestateRunError(f"run {run_id} failed: {_message(resp)}")
            await asyncio.sleep(0.2)  # 404 before the submission landed, 5xx while the server starts
        raise TimeoutError(f"run {run_id} did not end within {timeout_s:g} s")

    async def outcome(self, run_id: str) -> tuple[str, Any, str | None] | None:
        """(QUEUED / DONE / FAILED, result, error), or None if the server never heard of ``run_id``."""
        resp = await self._http.get(f"{self._invocation(run_id)}/output")
        if resp.status_code == 200:
            return DONE, resp.json(), None
        if resp.status_code == NOT_READY:
            return QUEUED, None, None
        if resp.status_code == 404:
            return None
        if 400 <= resp.status_code < 500:
            return FAILED, None, _message(resp)
        raise RuntimeError(f"restate ingress: HTTP {resp.status_code} reading run {run_id}: {resp.text[:300]}")


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("message", resp.text))
    except ValueError:
        return resp.text[:500]
