"""Bring your own agent: an agent on Temporal that this project did not write, described by a target file
(``chaos/target.py``). The cluster is the reference's (server, model, proxies, supervised workers); the
workers are the target's command, the driver is the target's, and both run with the target's interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.backends.temporal import ReferenceOnTemporal
from chaos.scenarios import ChaosScenario
from chaos.target import load_callable
from harness.operations import History
from testbed.stack import Stack


@dataclass
class OwnAgentOnTemporal(ReferenceOnTemporal):
    name: str = "target"
    target_file: Path | None = None

    def record(self) -> dict[str, Any]:
        return {**super().record(), "target_file": str(self.target_file or self.target.source)}

    def reproduce(self) -> dict[str, Any]:
        return {**super().reproduce(), "--target": self.target_file or self.target.source}

    def make_driver(self, stack: Stack, history: History, scenario: ChaosScenario, seed: int) -> Any:
        make = load_callable(self.target.driver)
        return make(client=stack.client, history=history, task_queue=self.task_queue(scenario),
                    workload=scenario.workload, seed=seed)
