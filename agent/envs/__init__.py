"""Agent environments: the world an agent works in (``base``, ``shell_local``, ``browser_local``, ``browser_docker``).

Chosen by the ``env:`` section of the agent's config file and built by
``get_env`` (``agent.envs.registry``); see ``agent.envs.base`` for the interface. This package's
``__init__`` imports nothing heavy: the browser service (``python -m
agent.envs.browser_service``) runs in containers that have only Playwright.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENV_NAMES", "BaseEnv", "Env", "EnvConfigError", "EnvContext", "EnvUnavailableError", "get_env",
           "parse_env_config"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from agent.envs import base, registry

        return getattr(registry if name in ("ENV_NAMES", "get_env", "parse_env_config") else base, name)
    raise AttributeError(name)
