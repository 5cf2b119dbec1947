"""The browser service: one Chromium session behind a small HTTP API, driven through Playwright.

``BrowserEnv`` talks to it; the service outlives the worker that started it
(its own session, no parent-death signal), so a new worker re-attaches to
the same browser and page after a crash. It runs on the machine
(``browser_local``) or in a container (``browser_docker``), with the same
code and API:

    GET  /health          {"session": ..., "url": ...}
    GET  /tools           the tools it offers, as OpenAI function specs
    GET  /state           {"state": "<url, title, page text, numbered interactive elements>"}
    POST /call            {"name": ..., "arguments": {...}} -> {"ok": true, "content": ..., "url": ...}
                          or {"ok": false, "kind": "validation" | "execution", "content": ...}
    POST /shutdown        closes the browser and exits

Every request but /health must carry ``Authorization: Bearer <token>``
(the token comes from ``DAH_BROWSER_TOKEN``, never the command line). The
service exits by itself after ``--idle-timeout`` seconds without a request,
so a run that was never cleaned up does not leave a browser behind forever,
and at once when the harness named in ``DAH_OWNER`` exits (``harness.owner``:
a harness's worker outlives nothing of it, even SIGKILLed).

    python -m agent.envs.browser_service --port-file F [--executable /usr/bin/chromium] [--host H --port P]
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from harness.owner import ENV_OWNER, parse_owner, watch_owner

# Debian's Chromium in a closed network: no sandbox as root, no GPU, no background traffic
# (without these flags it floods a closed network with refused connections).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
                 "--disable-default-apps", "--disable-extensions"]
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
ALLOWED_SCHEMES = ("http://", "https://", "about:blank")

_INDEX_ATTR = "data-dah-index"
_MARK_ELEMENTS = """
(attr) => {
  document.querySelectorAll('[' + attr + ']').forEach(e => e.removeAttribute(attr));
  const sel = 'a[href], button, input, textarea, select, [role=button], [role=link], [onclick], [contenteditable=true]';
  const out = [];
  for (const el of document.querySelectorAll(sel)) {
    if (el.type === 'hidden' || el.disabled) continue;
    const style = getComputedStyle(el);
    const box = el.getBoundingClientRect();
    if (style.display === 'none' || style.visibility === 'hidden' || (box.width === 0 && box.height === 0)) continue;
    const i = out.length;
    el.setAttribute(attr, String(i));
    const tag = el.tagName.toLowerCase();
    const bits = [];
    for (const a of ['type', 'name', 'id', 'placeholder', 'href', 'aria-label']) {
      const v = el.getAttribute(a);
      if (v) bits.push(a + '="' + v.slice(0, 60) + '"');
    }
    let label = '';
    if (el.labels && el.labels.length) label = ' label="' + el.labels[0].innerText.trim().slice(0, 60) + '"';
    const value = ('value' in el && el.value && tag !== 'button') ? ' value="' + String(el.value).slice(0, 60) + '"' : '';
    const text = (el.innerText || '').trim().replace(/\\s+/g, ' ').slice(0, 80);
    out.push('[' + i + '] <' + tag + (bits.length ? ' ' + bits.join(' ') : '') + label + value + '>' +
             (text ? ' ' + text : ''));
  }
  return out;
}
"""

TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "go_to_url", "description": "Open a URL (http or https) in the browser.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["url"],
                       "properties": {"url": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "click_element",
        "description": "Click the interactive element with this index (the numbers in the page state).",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["index"],
                       "properties": {"index": {"type": "integer"}}}}},
    {"type": "function", "function": {
        "name": "input_text",
        "description": "Type text into the input element with this index (replacing what it holds).",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["index", "text"],
                       "properties": {"index": {"type": "integer"}, "text": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "get_page_text", "description": "The visible text of the current page.",
        "parameters": {"type": "object", "additionalProperties": False, "required": [], "properties": {}}}},
    {"type": "function", "function": {
        "name": "go_back", "description": "Go back to the previous page.",
        "parameters": {"type": "object", "additionalProperties": False, "required": [], "properties": {}}}},
]


def find_chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        if path := shutil.which(name):
            return path
    return None


class ToolFailure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class BrowserSession:
    """One browser, one page, driven with Playwright's sync API (all on the server's one thread)."""

    def __init__(self, executable: str, *, headless: bool, action_timeout_s: float, max_text_chars: int) -> None:
        from playwright.sync_api import sync_playwright

        self._user_data = tempfile.mkdtemp(prefix="dah-browser-")
        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=executable, headless=headless, args=CHROMIUM_ARGS)
        self.page = self.browser.new_page()
        self.page.set_default_timeout(action_timeout_s * 1000)
        self.max_text_chars = max_text_chars

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            self._pw.stop()
            shutil.rmtree(self._user_data, ignore_errors=True)

    def _text(self) -> str:
        try:
            text = self.page.inner_text("body")
        except Exception:  # no body yet (about:blank) or a page mid-navigation
            text = ""
        text = "\n".join(line.rstrip() for line in text.splitlines() if line.strip())
        if len(text) > self.max_text_chars:
            text = text[:self.max_text_chars] + f"\n[page text cut at {self.max_text_chars} characters]"
        return text

    def state(self) -> str:
        self._settle()
        try:
            elements = self.page.evaluate(_MARK_ELEMENTS, _INDEX_ATTR)
        except Exception:
            elements = []
        title = self.page.title() if self.page.url != "about:blank" else ""
        return (f"URL: {self.page.url}\nTitle: {title}\n\nPage text:\n{self._text() or '(empty)'}\n\n"
                f"Interactive elements:\n" + ("\n".join(elements) if elements else "(none)"))

    def _settle(self) -> None:
        try:
            self.page.wait_for_load_state("load", timeout=5000)
        except Exception:
            pass

    def _element(self, index: Any) -> Any:
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ToolFailure("validation", f"index must be a non-negative integer, got {index!r}")
        locator = self.page.locator(f"[{_INDEX_ATTR}=\"{index}\"]")
        if locator.count() == 0:
            raise ToolFailure("validation", f"no element [{index}] on this page; the page state lists the "
                                            "current elements and their numbers")
        return locator.first

    def call(self, name: str, args: dict[str, Any]) -> str:
        from playwright.sync_api import Error as PlaywrightError

        try:
            if name == "go_to_url":
                url = str(args.get("url", "")).strip()
                if not url.startswith(ALLOWED_SCHEMES):
                    raise ToolFailure("validation", f"go_to_url: {url!r} is not an http(s) URL")
                response = self.page.goto(url, wait_until="load")
                status = f" (HTTP {response.status})" if response is not None else ""
                return f"opened {self.page.url}{status}"
            if name == "click_element":
                element = self._element(args.get("index"))
                element.click()
                self._settle()
                return f"clicked [{args['index']}]; now at {self.page.url}"
            if name == "input_text":
                element = self._element(args.get("index"))
                element.fill(str(args.get("text", "")))
                return f"typed {str(args.get('text', ''))!r} into [{args['index']}]"
            if name == "get_page_text":
                return self._text() or "(the page has no text)"
            if name == "go_back":
                self.page.go_back(wait_until="load")
                return f"went back; now at {self.page.url}"
        except ToolFailure:
            raise
        except PlaywrightError as exc:
            raise ToolFailure("execution", f"{name}: {str(exc).splitlines()[0]}") from None
        raise ToolFailure("validation", f"unknown browser tool {name!r}; tools: "
                                        + ", ".join(t["function"]["name"] for t in TOOL_SPECS))


def serve(session: BrowserSession, server: HTTPServer, session_id: str, token: str, idle_timeout_s: float,
          owner: str | None = None) -> None:
    """Answer requests until /shutdown, ``idle_timeout_s`` without one, or the exit of ``owner`` (``harness.owner``)."""
    state = {"last": time.monotonic(), "stop": False}
    owner_gone = threading.Event()
    if owner:
        watch_owner(owner, owner_gone.set)

    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:  # quiet: the env logs what matters
            pass

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            given = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if hmac.compare_digest(given, token):
                return True
            self._send(401, {"error": "missing or wrong token"})
            return False

        def do_GET(self) -> None:
            state["last"] = time.monotonic()
            if self.path == "/health":
                return self._send(200, {"session": session_id, "url": session.page.url})
            if not self._authorised():
                return None
            if self.path == "/tools":
                return self._send(200, TOOL_SPECS)
            if self.path == "/state":
                return self._send(200, {"state": session.state(), "url": session.page.url})
            return self._send(404, {"error": f"no such endpoint {self.path}"})

        def do_POST(self) -> None:
            state["last"] = time.monotonic()
            if not self._authorised():
                return None
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                return self._send(400, {"error": "body is not JSON"})
            if self.path == "/shutdown":
                state["stop"] = True
                return self._send(200, {"ok": True})
            if self.path == "/call":
                try:
                    content = session.call(str(body.get("name")), dict(body.get("arguments") or {}))
                except ToolFailure as exc:
                    return self._send(200, {"ok": False, "kind": exc.kind, "content": str(exc)})
                return self._send(200, {"ok": True, "content": content, "url": session.page.url})
            return self._send(404, {"error": f"no such endpoint {self.path}"})

    server.RequestHandlerClass = Handler
    server.timeout = 1.0
    while not state["stop"]:
        server.handle_request()
        if owner_gone.is_set():
            print(f"the harness {owner} that owns this browser exited; exiting", flush=True)
            break
        if time.monotonic() - state["last"] > idle_timeout_s:
            print(f"idle for {idle_timeout_s:g} s; exiting", flush=True)
            break


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.envs.browser_service", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (written to --port-file)")
    p.add_argument("--port-file", type=Path, help="write the bound port here once the browser is ready")
    p.add_argument("--executable", help="Chromium to drive (default: chromium on PATH)")
    p.add_argument("--headed", action="store_true", help="show the window (needs a display)")
    p.add_argument("--session-id", default=f"session-{os.getpid()}")
    p.add_argument("--start-url", help="open this page first")
    p.add_argument("--action-timeout", type=float, default=10.0, help="seconds per browser action (default 10)")
    p.add_argument("--max-text-chars", type=int, default=4000, help="page text shown in the state (default 4000)")
    p.add_argument("--idle-timeout", type=float, default=1800.0, help="exit after this long unused (default 1800)")
    args = p.parse_args(argv)
    token = os.environ.get("DAH_BROWSER_TOKEN", "")
    if not token:
        p.error("DAH_BROWSER_TOKEN is not set: the service refuses to run without an access token")
    owner = os.environ.get(ENV_OWNER) or None
    if owner:
        try:
            parse_owner(owner)
        except ValueError as exc:
            p.error(str(exc))
    executable = args.executable or find_chromium()
    if not executable:
        p.error(f"no Chromium found (looked for {', '.join(CHROMIUM_CANDIDATES)}); install Debian's chromium "
                "package or pass --executable")
    server = HTTPServer((args.host, args.port), BaseHTTPRequestHandler)
    session = BrowserSession(executable, headless=not args.headed, action_timeout_s=args.action_timeout,
                             max_text_chars=args.max_text_chars)
    try:
        if args.start_url:
            session.call("go_to_url", {"url": args.start_url})
        if args.port_file:
            tmp = args.port_file.with_name(args.port_file.name + ".tmp")
            tmp.write_text(str(server.server_address[1]))
            os.replace(tmp, args.port_file)
        print(f"READY {server.server_address[1]}", flush=True)
        serve(session, server, args.session_id, token, args.idle_timeout, owner)
    finally:
        server.server_close()
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
