"""The environments by name: ``parse_env_config`` checks a config file's ``env:`` section, ``get_env`` builds one."""

from __future__ import annotations

from typing import Any

from agent.contracts import EnvConfig
from agent.envs.base import BaseEnv, Env, EnvConfigError, EnvContext, parse_settings

ENV_NAMES = ("base", "shell_local", "browser_local", "browser_docker")


def _registry() -> dict[str, type[Env]]:
    # Imported on first use: the browser environments pull in Playwright's client.
    from agent.envs.browser import BrowserDockerEnv, BrowserLocalEnv
    from agent.envs.shell import ShellLocalEnv

    return {c.name: c for c in (BaseEnv, ShellLocalEnv, BrowserLocalEnv, BrowserDockerEnv)}


def parse_env_config(raw: Any) -> EnvConfig:
    """The ``env:`` section of an agent config file -> a checked ``EnvConfig``.

    Accepts a mapping ``{name: ..., <options>}`` or a bare name. The error
    names the bad field and the allowed values.
    """
    if raw is None:
        return EnvConfig()
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise EnvConfigError(f"env: must be a mapping such as {{name: shell_local}}, got {raw!r}")
    if "name" not in raw:
        raise EnvConfigError(f"env.name: missing; allowed values: {', '.join(ENV_NAMES)}")
    name = raw["name"]
    if name not in ENV_NAMES:
        raise EnvConfigError(f"env.name: unknown environment {name!r}; allowed values: {', '.join(ENV_NAMES)}")
    options = {k: v for k, v in raw.items() if k != "name"}
    parse_settings(name, _registry()[name].settings_class, options)  # refuse now, not in a worker later
    return EnvConfig(name=name, options=options)


def get_env(config: EnvConfig, ctx: EnvContext, env_id: str) -> Env:
    """The environment a configuration names, not yet built or attached."""
    registry = _registry()
    cls = registry.get(config.name)
    if cls is None:
        raise EnvConfigError(f"env.name: unknown environment {config.name!r}; allowed values: {', '.join(ENV_NAMES)}")
    return cls(parse_settings(config.name, cls.settings_class, dict(config.options)), ctx, env_id)
