"""Agent runner over the OpenAI client, imported as `sglang_ds41.agents` (not `agents`).

(This folder sits at the repository root, not under `sglang_ds41/`: pyproject.toml's
`package-dir` installs it as `sglang_ds41.agents`, so that `import agents` stays the
openai-agents package's; README, Layout, says more.)

The public API fits on one screen:

* `Agent(name, instructions, tools, output_type, thinking, reasoning_effort, reminder, policies)`
* `function_tool` turns a typed, documented function into a `Tool`;
  `workspace_tools(root)` gives file tools confined to a directory.
* `Runner.run / run_sync / run_streamed / resume / resume_sync` -> `RunResult`.
* Policies: `Policies(limits=Limits(...), approval=..., retry=RetryPolicy(...), executor=...,
  untrusted=UntrustedContent())`; tools declare `effect=`, `trusted_output=`, `destinations=`,
  `content=`, `private_output=` for it (trust.py). An approver (`ApproveWith(decide)`) is told
  why a call is held back (`Hold`), and its answers are logged (`RunResult.approvals`).

Example::

    @function_tool
    def add(a: float, b: float) -> float:
        \"\"\"Add two numbers.\"\"\"
        return a + b

    agent = Agent(name="calc", instructions="Use the tools.", tools=[add])
    result = Runner.run_sync(agent, "What is 2+3?", base_url="http://127.0.0.1:30000/v1")
    print(result.final_output)
"""

from .agent import Agent, ReminderContext
from .errors import (
    AgentConfigError,
    AgentError,
    LimitExceeded,
    ModelRequestError,
    OutputValidationError,
    RunLogError,
)
from .events import Event
from .output import OutputSpec
from .policies import (
    ApproveCalls,
    ApproveWith,
    DenyAll,
    Limits,
    Policies,
    ProcessExecutor,
    RetryPolicy,
    ThreadExecutor,
)
from .result import RunResult, Usage
from .runner import Runner, RunStream
from .tools import Tool, ToolContext, function_tool
from .trust import Effect, Hold, UntrustedContent
from .workspace_tools import workspace_tools

__all__ = [
    "Agent",
    "AgentConfigError",
    "AgentError",
    "ApproveCalls",
    "ApproveWith",
    "DenyAll",
    "Effect",
    "Event",
    "Hold",
    "LimitExceeded",
    "Limits",
    "ModelRequestError",
    "OutputSpec",
    "OutputValidationError",
    "Policies",
    "ProcessExecutor",
    "ReminderContext",
    "RetryPolicy",
    "RunLogError",
    "RunResult",
    "RunStream",
    "Runner",
    "ThreadExecutor",
    "Tool",
    "ToolContext",
    "UntrustedContent",
    "Usage",
    "function_tool",
    "workspace_tools",
]
