"""The scenario matrix: scripted walkthroughs with their expected outcomes.

Each scenario names a scripted model route (``agent.scripted_routes``), the
prompts to send, and what must come out: the reply, the files left in the
run's workspace, and the shape of the Temporal history (which activities ran,
with how many attempts and what outcome). The tests run every scenario on the
real dev server and assert all of it; ``demo`` runs them with ``/scenario``
and prints the same checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.contracts import DEFAULT_TOOLS, AgentConfig

FAULT_TOOLS = [*DEFAULT_TOOLS, "flaky_service", "broken_service"]
PLAN = "plan_next_action"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    prompts: tuple[str, ...]
    expect_reply: str  # a substring of the last reply
    # (activity type, attempts, outcome) in scheduling order; None: not checked
    expect_activities: tuple[tuple[str, int, str], ...] | None
    expect_files: dict[str, str] = field(default_factory=dict)  # exactly the workspace's files
    tools: tuple[str, ...] = tuple(DEFAULT_TOOLS)
    conversation: bool = False  # send the prompts as Updates to one conversation workflow
    max_history_events: int = 0
    expect_min_runs: int = 1  # continue-as-new: at least this many runs in the chain

    @property
    def model(self) -> str:
        return f"scripted:{self.name}"

    def config(self) -> AgentConfig:
        cfg = AgentConfig(model=self.model, tools=list(self.tools), max_history_events=self.max_history_events)
        # Short backoff so walkthroughs take seconds; the defaults stay close to the reference.
        cfg.tool.initial_interval_s = 0.5
        cfg.planning.initial_interval_s = 0.5
        return cfg


def _ok(activity: str, attempts: int = 1, outcome: str = "completed") -> tuple[str, int, str]:
    return (activity, attempts, outcome)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "direct", "Direct tool use: one calculator call between two model calls.",
            ("What is 25 * 4?",), "= 100",
            (_ok(PLAN), _ok("calculator"), _ok(PLAN)),
        ),
        Scenario(
            "multi_step", "Multi-step tool use: write, read back, then write and list in parallel.",
            ("Draft a plan in notes/plan.txt and mark it done.",), "notes/done.txt",
            (_ok(PLAN), _ok("write_file"), _ok(PLAN), _ok("read_file"), _ok(PLAN), _ok("write_file"),
             _ok("list_files"), _ok(PLAN)),
            expect_files={"notes/plan.txt": "step one: gather data", "notes/done.txt": "done"},
        ),
        Scenario(
            "validation_repair", "A validation error ('25 x 4') goes back to the model, which repairs the call.",
            ("What is 25 times 4?",), "25 * 4 = 100",
            (_ok(PLAN), _ok("calculator"), _ok(PLAN), _ok("calculator"), _ok(PLAN)),
        ),
        Scenario(
            "malformed", "The model emits unparseable tool arguments; the loop asks it to repair them.",
            ("What is 25 * 4?",), "25 * 4 = 100",
            (_ok(PLAN), _ok(PLAN), _ok("calculator"), _ok(PLAN)),
        ),
        Scenario(
            "retry", "A retryable tool failure: Temporal retries the activity (3 attempts) and the turn completes.",
            ("Check the flaky service.",), "attempt 3",
            (_ok(PLAN), _ok("flaky_service", attempts=3), _ok(PLAN)),
            tools=tuple(FAULT_TOOLS),
        ),
        Scenario(
            "terminal", "A known terminal failure: not retried, reported to the model, which explains it.",
            ("Refund order 42.",), "account is closed",
            (_ok(PLAN), _ok("broken_service", outcome="failed"), _ok(PLAN)),
            tools=tuple(FAULT_TOOLS),
        ),
        Scenario(
            "path_escape", "Paths outside the workspace ('../../etc/passwd', '/etc/passwd') are refused.",
            ("Overwrite the password file.",), "refused",
            (_ok(PLAN), _ok("write_file"), _ok(PLAN), _ok("read_file"), _ok(PLAN), _ok("write_file"), _ok(PLAN)),
            expect_files={"safe.txt": "stayed inside"},
        ),
        Scenario(
            "parallel", "Three tool calls in one model step run as concurrent activities.",
            ("Compute 6*7, 100/8 and the weather in Lisbon.",), "6 * 7 = 42",
            (_ok(PLAN), _ok("calculator"), _ok("weather"), _ok("calculator"), _ok(PLAN)),
        ),
        Scenario(
            "conversation", "A long conversation continues-as-new and still remembers its first message.",
            ("What is 2 + 3?", "write hello to greeting.txt", "weather in Oslo", "What is 7 * 6?",
             "list files", "What did I say first? recall"),
            "Your first message was: 'What is 2 + 3?'",
            None,
            expect_files={"greeting.txt": "hello"},
            conversation=True,
            max_history_events=40,
            expect_min_runs=2,
        ),
    ]
}
