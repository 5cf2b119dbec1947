"""The agent's configuration file (YAML or JSON): model, tools, prompt, limits and environment.

    model: scripted            # or scripted:<scenario>, or a LiteLLM model such as openai/gpt-4o-mini
    tools: default             # a tool set name, or a list of tool names
    system_prompt: null        # null: the default prompt
    max_steps_per_turn: 10
    max_history_events: 0
    env:
      name: shell_local        # base | shell_local | browser_local | browser_docker
      timeout_s: 30            # the environment's own options (see agent.envs)
    local_tools: [calculator]  # short tools without side effects, run as local activities
    local_model: false         # true: model calls as local activities too (README: "Local activities")

Every key is optional. An unknown key, a wrong type, an unknown tool or
environment is refused with a message naming the key and what is allowed.
Command-line options given explicitly override the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.contracts import AgentConfig
from agent.envs.base import EnvConfigError
from agent.envs.registry import parse_env_config

KEYS: dict[str, str] = {
    "model": "a string",
    "tools": "a tool set name or a list of tool names",
    "system_prompt": "a string or null",
    "max_steps_per_turn": "a positive integer",
    "max_history_events": "an integer >= 0",
    "env": "a mapping with at least name",
    "local_tools": "a list of tool names without side effects, run as local activities",
    "local_model": "true or false (model calls as local activities)",
}


class ConfigFileError(ValueError):
    """The file cannot be used; the message names the file and the key."""


def _load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except (ValueError, Exception) as exc:  # yaml.YAMLError and json.JSONDecodeError
        raise ConfigFileError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'} "
                              f"({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: the top level must be a mapping of keys ({', '.join(KEYS)})")
    return data


def resolve_tools(value: Any, where: str) -> list[str]:
    from agent.tools import TOOL_SETS, known_tools

    if isinstance(value, str) and value in TOOL_SETS:
        return list(TOOL_SETS[value])
    names = [t.strip() for t in value.split(",")] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigFileError(f"{where}: must be {KEYS['tools']}, got {value!r}")
    unknown = [n for n in names if n not in known_tools()]
    if unknown:
        raise ConfigFileError(f"{where}: unknown tool(s) {', '.join(unknown)}; use a set "
                              f"({', '.join(TOOL_SETS)}) or a list of: {', '.join(known_tools())}")
    return [n for n in names if n]


def load_agent_config(path: str | Path) -> AgentConfig:
    path = Path(path)
    data = _load(path)
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ConfigFileError(f"{path}: unknown key {unknown[0]!r}; allowed keys: {', '.join(KEYS)}")
    cfg = AgentConfig()
    if "model" in data:
        if not isinstance(data["model"], str) or not data["model"].strip():
            raise ConfigFileError(f"{path}: model must be {KEYS['model']}, got {data['model']!r}")
        cfg.model = data["model"]
    if "tools" in data:
        cfg.tools = resolve_tools(data["tools"], f"{path}: tools")
    if "system_prompt" in data:
        if data["system_prompt"] is not None and not isinstance(data["system_prompt"], str):
            raise ConfigFileError(f"{path}: system_prompt must be {KEYS['system_prompt']}")
        cfg.system_prompt = data["system_prompt"]
    for key, minimum in (("max_steps_per_turn", 1), ("max_history_events", 0)):
        if key in data:
            value = data[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConfigFileError(f"{path}: {key} must be {KEYS[key]}, got {value!r}")
            setattr(cfg, key, value)
    if "local_tools" in data:
        from agent.tools import check_local_tools

        names = resolve_tools(data["local_tools"], f"{path}: local_tools")
        try:
            check_local_tools(names)
        except ValueError as exc:
            raise ConfigFileError(f"{path}: {exc}") from None
        cfg.local_tools = names
    if "local_model" in data:
        if not isinstance(data["local_model"], bool):
            raise ConfigFileError(f"{path}: local_model must be {KEYS['local_model']}, got {data['local_model']!r}")
        cfg.local_model = data["local_model"]
    try:
        cfg.env = parse_env_config(data.get("env"))
    except EnvConfigError as exc:
        raise ConfigFileError(f"{path}: {exc}") from None
    return cfg
