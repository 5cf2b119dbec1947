"""Dataclasses that cross the workflow/activity boundary and the client API.

One dataclass per input and output, so fields can be added later without
breaking histories that are already recorded. Nothing here does I/O; the
workflow imports this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent.ptc import PtcLimits

DEFAULT_TASK_QUEUE = "durable-agent"
DEFAULT_TOOLS = ["calculator", "weather", "write_file", "append_file", "read_file", "list_files"]
#: Tools the workflow runs itself (no activity of their own): subagents and programmatic tool calling.
WORKFLOW_NATIVE_TOOLS = ("spawn", "wait", "run_ptc")
SUBAGENT_PROMPT_PREFIX = "You are a subagent"


@dataclass
class SubagentProfile:
    """A named kind of subagent the model may ``spawn``: its instructions and the tools it gets."""

    instructions: str
    tools: list[str] = field(default_factory=lambda: list(DEFAULT_TOOLS))
    model: str | None = None  # None: the parent's model
    max_steps_per_turn: int = 10


def default_subagents() -> dict[str, SubagentProfile]:
    return {
        "generic": SubagentProfile(
            f"{SUBAGENT_PROMPT_PREFIX} started by another agent. Do exactly the task you are given with your "
            "tools, in the shared workspace, and answer with the result only."
        ),
        "researcher": SubagentProfile(
            f"{SUBAGENT_PROMPT_PREFIX} that looks things up. Use the tools; answer in one sentence.",
            tools=["calculator", "weather", "read_file", "list_files"],
        ),
        "planner": SubagentProfile(
            f"{SUBAGENT_PROMPT_PREFIX} that may delegate: split the task, spawn helpers, combine their answers.",
            tools=[*DEFAULT_TOOLS, "spawn", "wait"],
        ),
    }


@dataclass
class ActivityPolicy:
    """Timeouts and retry policy of one kind of activity.

    ``maximum_attempts`` 0 means retry until it succeeds: what keeps a run
    alive through an outage or until a bug fix is deployed.
    """

    start_to_close_s: float
    heartbeat_s: float | None
    initial_interval_s: float
    backoff_coefficient: float = 2.0
    maximum_interval_s: float = 60.0
    maximum_attempts: int = 0


def default_planning_policy() -> ActivityPolicy:
    # Close to the reference: 1 min per model call, backoff 5 s doubling to 60 s.
    return ActivityPolicy(start_to_close_s=60.0, heartbeat_s=20.0, initial_interval_s=5.0, maximum_interval_s=60.0)


def default_tool_policy() -> ActivityPolicy:
    # Close to the reference: 30 s per tool call, backoff 2 s doubling to 60 s.
    return ActivityPolicy(start_to_close_s=30.0, heartbeat_s=10.0, initial_interval_s=2.0, maximum_interval_s=60.0)


@dataclass
class EnvConfig:
    """Which environment the agent works in (``agent.envs``) and its options.

    ``name`` is one of ``agent.envs.registry.ENV_NAMES``; ``options`` are that
    environment's settings, checked by ``agent.envs.registry.parse_env_config``.
    """

    name: str = "base"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnvRecord:
    """What a built environment left behind, so any worker can re-attach to it (or rebuild it).

    Recorded in the workflow (an activity result), carried across
    continue-as-new and shared with subagents. Holds no secrets: a browser
    service's access token stays in a file under the environment's directory.
    """

    name: str
    env_id: str
    data: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI specs of the tools it discovered
    note: str = ""  # how it was built or re-attached, for the operator

    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


@dataclass
class AgentConfig:
    """How one agent run behaves; carried across continue-as-new."""

    model: str = "scripted"  # "scripted", "scripted:<scenario>", or a LiteLLM model such as "openai/gpt-4o-mini"
    tools: list[str] = field(default_factory=lambda: list(DEFAULT_TOOLS))
    system_prompt: str | None = None
    max_steps_per_turn: int = 10
    planning: ActivityPolicy = field(default_factory=default_planning_policy)
    tool: ActivityPolicy = field(default_factory=default_tool_policy)
    # Continue-as-new past these (0 = only when the server suggests it).
    max_history_events: int = 0
    max_history_bytes: int = 0
    # Subagents: the profiles ``spawn`` accepts, how deep spawns may nest (the root is depth 0; an agent
    # at depth max_depth may not spawn), and how many children one run (its whole continue-as-new
    # chain) may start in total. Both limits are enforced with model-visible errors.
    subagents: dict[str, SubagentProfile] = field(default_factory=default_subagents)
    max_depth: int = 2
    max_children: int = 8
    ptc: PtcLimits = field(default_factory=PtcLimits)  # limits of one run_ptc program
    env: EnvConfig = field(default_factory=EnvConfig)  # the world the agent works in (default: none)
    # Tools run as local activities (agent.tools.local_tool_problem says which may): in the worker that runs the
    # workflow task, no dispatch through the server, recorded as a marker. Only short tools without side effects.
    local_tools: list[str] = field(default_factory=list)
    # Model calls as local activities: with local tools, a whole turn in one workflow task (durable overhead per
    # turn measured 29% less for a reply, 50% less for a tool turn: the benchmarks' overhead section). The price:
    # a call that finished but is not yet recorded (the task completes when the turn does, or every ~80% of the
    # workflow task timeout for a long call) runs again after a crash, and a paused worker cannot ask the server
    # whether its call is still wanted. docs/benchmarks.md: "Local activities".
    local_model: bool = False


@dataclass
class AgentInput:
    config: AgentConfig = field(default_factory=AgentConfig)
    # One-shot mode: answer this prompt and complete.
    prompt: str | None = None
    # Carried forward by continue-as-new.
    messages: list[dict[str, Any]] | None = None
    turns: int = 0
    run_index: int = 0
    # Subagents: how deep this agent is, whose workspace it shares (None: its own workflow id's),
    # and how many children the chain has started so far (carried by continue-as-new).
    depth: int = 0
    workspace: str | None = None
    children_started: int = 0
    # Answers of detached subagents (spawn wait=false) that finished before continue-as-new:
    # handle -> [status, content], so wait(handle) still works in the next run.
    detached_results: dict[str, list[str]] = field(default_factory=dict)
    # The environment this run works in: built by the root run, carried by continue-as-new, shared with
    # subagents (which neither build nor clean it up: owns_env False).
    env_record: EnvRecord | None = None
    owns_env: bool = True
    # Replies to the last updates this conversation answered, by update id, so that a client re-sending an
    # update after continue-as-new (Temporal deduplicates update ids only within a run) gets the earlier reply.
    answered_updates: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class AgentResult:
    reply: str | None
    turns: int
    messages: int
    run_index: int
    ended_by: str  # "one_shot" | "end_chat"


@dataclass
class ChatMessage:
    text: str


@dataclass
class ToolCallRecord:
    name: str
    status: str
    content: str


@dataclass
class AgentReply:
    text: str
    turn: int
    steps: int
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    stopped_early: bool = False


@dataclass
class AgentStatus:
    state: str  # "building_env" | "idle" | "planning" | "running_tools" | "ended" | "cancelled"
    turns: int
    messages: int
    run_index: int
    history_events: int
    last_error: str | None = None
    depth: int = 0
    children_started: int = 0
    children_running: int = 0  # detached (spawn wait=false) children not finished yet
    env: str | None = None  # the environment and its latest note (built, re-attached, rebuilt)


@dataclass
class EnvRef:
    """An environment to act on: its configuration and what was recorded when it was built."""

    config: EnvConfig
    record: EnvRecord


@dataclass
class PlanInput:
    """What one model call gets. The conversation crosses as one JSON string (``messages_json``): the payload
    converter then copies and escapes a string instead of walking every message as a dataclass field, which at
    200 turns is ~1 ms instead of ~8.6 ms per call (``python -m benchmarks --only micro``, group ``payload``).
    Build it with ``PlanInput.of``; read the messages with ``message_list()``."""

    model: str
    tools: list[str]
    messages_json: str = ""
    # The environment: its state is read (in the activity) and shown to the model on every call,
    # and its discovered tools are offered next to ``tools``.
    env: EnvRef | None = None
    # The conversation as a list: what workers before messages_json sent (still read, for calls in flight
    # across an upgrade).
    messages: list[dict[str, Any]] | None = None

    @classmethod
    def of(cls, model: str, messages: list[dict[str, Any]], tools: list[str], env: EnvRef | None = None
           ) -> PlanInput:
        return cls(model=model, tools=tools, env=env,
                   messages_json=json.dumps(messages, separators=(",", ":"), ensure_ascii=False))

    def message_list(self) -> list[dict[str, Any]]:
        return json.loads(self.messages_json) if self.messages_json else list(self.messages or [])


@dataclass
class PlanOutput:
    message: dict[str, Any]
    model: str
    latency_ms: float
    usage: dict[str, int] = field(default_factory=dict)
    env_state: str | None = None  # the environment state the model was shown (recorded in the history)
    env_record: EnvRecord | None = None  # set when the environment's record changed (rebuilt, a new page)
    env_note: str | None = None  # whether this worker re-attached to the environment or rebuilt it


@dataclass
class EnvBuildInput:
    config: EnvConfig
    env_id: str


@dataclass
class EnvToolInput:
    env: EnvRef
    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class EnvToolOutput:
    status: str  # "ok" | "validation_error"
    content: str
    env_record: EnvRecord | None = None  # updated record (a rebuilt environment, a browser's new page)
    env_note: str = ""  # whether this worker re-attached to the environment or rebuilt it


@dataclass
class ToolInput:
    call_id: str
    arguments: dict[str, Any]
    workspace: str | None = None  # the workspace key (a subagent shares its root agent's); None: own workflow id


@dataclass
class ToolOutput:
    status: str  # "ok" | "validation_error"
    content: str
