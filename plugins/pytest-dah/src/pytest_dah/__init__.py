"""pytest-dah: chaos runs of the durable-agent-harness as pytest tests, from your own test environment.

Standard library and pytest only; the harness runs in its own interpreter (``runs.py``). The plugin itself is
``plugin.py`` (the ``pytest11`` entry point ``dah``).
"""

from pytest_dah.runs import Check, ChaosResult, ChaosRun, Harness, HarnessNotFound

__all__ = ["Check", "ChaosResult", "ChaosRun", "Harness", "HarnessNotFound"]
