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
    local_model: false         # true: model calls as local activities too (docs/benchmarks.md: "Local activities")

Every key is optional. Types are strict (``AgentConfigFile``): ``max_steps_per_turn: "5"`` is not 5, and
``local_model: "yes"`` is not true. An unknown key, a wrong type, an unknown tool or environment is refused in one
line naming the file, the key, the value and what is allowed. Command-line options given explicitly override the
file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError

from agent.contracts import AgentConfig
from agent.envs.base import EnvConfigError
from agent.envs.registry import parse_env_config
from agent.strict import NonEmpty, StrictModel, one_line


class ConfigFileError(ValueError):
    """The file cannot be used; the message names the file and the key."""


def _tool_names(value: Any) -> list[str]:
    """A tool set's name, a comma-separated string or a list of tool names -> the names (unknown ones refused)."""
    from agent.tools import TOOL_SETS, known_tools

    if isinstance(value, str) and value in TOOL_SETS:
        return list(TOOL_SETS[value])
    names = [t.strip() for t in value.split(",")] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("must be a tool set name or a list of tool names")
    unknown = [n for n in names if n not in known_tools()]
    if unknown:
        raise ValueError(f"names unknown tool(s) {', '.join(unknown)}; use a set ({', '.join(TOOL_SETS)}) or a list of: "
                         f"{', '.join(known_tools())}")
    return [n for n in names if n]


def _local_tool_names(value: Any) -> list[str]:
    from agent.tools import check_local_tools

    names = _tool_names(value)
    try:
        check_local_tools(names)
    except ValueError as exc:
        raise ValueError(f"must be tools without side effects: {str(exc).removeprefix('local_tools: ')}") from None
    return names


_DEFAULT = AgentConfig()


class AgentConfigFile(StrictModel):
    """An agent config file as written: each key's type, default and (``description``) what it allows."""

    model: NonEmpty = Field(_DEFAULT.model,
                            description="a non-empty string (scripted, scripted:<scenario> or a LiteLLM model)")
    tools: Annotated[Any, AfterValidator(_tool_names)] = Field(
        _DEFAULT.tools, description="a tool set name or a list of tool names")
    system_prompt: str | None = Field(None, description="a string or null")
    max_steps_per_turn: int = Field(_DEFAULT.max_steps_per_turn, ge=1, description="a positive integer")
    max_history_events: int = Field(_DEFAULT.max_history_events, ge=0, description="an integer >= 0")
    env: Any = Field(None, description="a mapping with at least name")  # checked by agent.envs.registry.parse_env_config
    local_tools: Annotated[Any, AfterValidator(_local_tool_names)] = Field(
        _DEFAULT.local_tools, description="a list of tool names without side effects, run as local activities")
    local_model: bool = Field(_DEFAULT.local_model, description="true or false (model calls as local activities)")


#: the keys an agent config file may have
KEYS = tuple(AgentConfigFile.model_fields)


def _load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigFileError(f"{path}: not a text file (UTF-8)") from None
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
    """``_tool_names`` for a command-line option: the error names ``where``."""
    try:
        return _tool_names(value)
    except ValueError as exc:
        raise ConfigFileError(f"{where}: {exc}, got {value!r}") from None


def load_agent_config(path: str | Path) -> AgentConfig:
    path = Path(path)
    data = _load(path)
    try:
        checked = AgentConfigFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigFileError(one_line(exc, str(path), AgentConfigFile, noun="key")) from None
    cfg = AgentConfig()
    for key in checked.model_fields_set - {"env"}:  # only what the file gives: AgentConfig's defaults stand
        setattr(cfg, key, getattr(checked, key))
    try:
        cfg.env = parse_env_config(data.get("env"))
    except EnvConfigError as exc:
        raise ConfigFileError(f"{path}: {exc}") from None
    return cfg
