"""The checkpoint backend's old name: only the command ``python -m agent.journal`` is kept (see agent/checkpoint)."""
