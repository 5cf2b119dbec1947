"""A worker's first model call imports nothing: ``llm.preload`` (run by the fork server before it forks workers,
and on a thread by every worker) has imported what LiteLLM would otherwise import lazily on that call. A lazy
import there holds the GIL for a fraction of a second inside the activity; after a kill, the first call of the
replacement worker is often the retried one, so it showed in every recovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import asyncio, json, sys
from testbed.model_server import ScriptedModelServer
from testbed.scripted_routes import respond
from agent import llm
llm.preload()
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "arithmetic",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
with ScriptedModelServer(respond) as model:
    before = set(sys.modules)
    for text in ("What is 6 * 7? Use the calculator.", "Reply with the number 7"):
        asyncio.run(llm.complete("scripted", [{"role": "user", "content": text}], TOOLS, scripted_base_url=model.url,
                                 run_key="preload-test", timeout_s=30.0))
    print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_after_preload_a_model_call_with_tools_imports_nothing_of_litellm_or_openai() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    new = json.loads(out.stdout.strip().splitlines()[-1])
    lazy = [m for m in new if m.split(".")[0] in ("litellm", "openai", "pydantic", "httpx", "aiohttp", "tiktoken")]
    assert lazy == [], f"imported by the first model call, not by llm.preload: {lazy}"
