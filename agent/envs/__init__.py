"""Agent environments: the world an agent works in (``base``, ``shell_local``, ``browser_local``, ``browser_docker``).

Chosen by the ``env:`` section of the agent's config file and built by
``get_env`` (``agent.envs.registry``); see ``agent.envs.base`` for the interface. This package's
``__init__`` imports nothing heavy: the browser service (``python -m
agent.envs.browser_service``) runs in containers that have only Playwright.
"""
