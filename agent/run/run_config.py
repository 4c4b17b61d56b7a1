"""The settings of a command's runs: one dataclass per component, a docstring per field. The CLI's
flags map onto these, and their defaults are the CLI's defaults; `setup.py` builds the runs from them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.run import dialects

if TYPE_CHECKING:
    from nanbeige.agent.reference.checkout import Reference

BACKENDS = ("auto", "openai", "transformers")


@dataclass
class AgentConfig:
    """Limits and context settings for one run."""

    dialect: str = "mcp-xml"
    """`mcp-xml` (deep-search format, default) or `tool-call` (OpenAI function calling)."""
    max_turns: int | None = None
    """Most model calls with tools; then one last call asks for the answer. None: the dialect's (600
    for mcp-xml, as the reference harness's keep-5 configuration; 200 for tool-call)."""
    keep_tool_results: int = 5
    """Show the model only the last K tool results (-1 = all). The trajectory keeps all."""
    release_results: bool = True
    """Once a turn is written to the trajectory file and its tool results have left the model's view
    (keep-K), drop their text from memory (`RELEASED` takes its place), so that a run of hundreds of
    turns with large results stays flat in memory; the file keeps every result (read it back with
    `load_trajectories`). Off: every result's text stays in `trajectory.turns` too."""
    max_context: int | None = None
    """The model's context length in tokens; the answer is requested before a call could overflow.
    None: what the model server reports (vLLM's `max_model_len`), else 262144."""
    context_reserve: int = 2048
    """Tokens kept free for the final answer request."""
    max_format_errors: int = 5
    """Without rollback: stop after this many unusable replies in a row. With rollback there is no such
    cap, as in the reference (a reply cut off or looping is sampled up to `RESAMPLES` times, then the
    turn is used up; other unusable replies are sampled again until max_turns + `EXTRA_ATTEMPTS`
    replies were made)."""
    repeat_limit: int = 3
    """Refuse a tool call made this many turns in a row with the same arguments (tool-call dialect; in
    mcp-xml, as in the reference harness, a `google_search` query already searched is refused instead)."""
    final_answer_turn: bool = True
    """At max_turns or the context limit, make one last call without tools for the answer."""
    summary_turn: bool | None = None
    """End every run with a call without tools that asks for the final answer, also after the model
    answered, as the reference harness does (a trailing tool result is dropped first); the answer is
    the last `\\boxed{}` of that reply, else the latest one seen in the run. None: on for mcp-xml,
    off for tool-call (which asks only at limits)."""
    rollback: bool | None = None
    """Drop an unusable reply (a malformed call, a refusal, a reply cut off, looping or empty) and
    sample again, as the reference harness does, instead of keeping it with a message asking for a
    fix. Dropped replies stay in the trajectory, marked `rolled_back`; `max_format_errors` in a row
    end the run. None: on for mcp-xml, off for tool-call."""
    timeout_s: float | None = None
    """Wall-clock limit for the run (None = none)."""
    stream: bool = False
    """Have the model's reply streamed while it is generated, each piece of text handed to `on_event`
    as a `text` event (the live view shows it); the turn recorded is the same either way."""
    budgets: dict[str, float] = dataclasses.field(default_factory=dict)
    """Most of each unit a run may use (`tokens`, `tool_calls`, `serper_queries`, `jina_tokens`,
    `summary_tokens`, `e2b_seconds`; see `agent/run/usage.py`); reaching one stops the run (`budget`)."""
    date: str | None = None
    """Date shown to the model (YYYY-MM-DD); today when None."""
    system_prompt_template: str | None = None
    """The mcp-xml system prompt as a template of your own: `{tools}` stands for the tool catalogue
    and `{date}` for the date. None: the built-in prompt, laid out as the reference harness's."""
    reference: Reference | None = None
    """The reference harness checkout (`--reference`) whose own texts the model reads in mcp-xml: the
    system prompt, user message, summary prompt, duplicate-query rule, malformed-call tags and
    refusals (see `agent/reference/checkout.py`). None: our own texts, laid out as the reference's."""

    def for_dialect(self) -> AgentConfig:
        """This config with what was left unset (max turns, summary turn, rollback) taken from the
        dialect's defaults."""
        deep_search = self.dialect == "mcp-xml"
        return dataclasses.replace(
            self,
            max_turns=self.max_turns or dialects.MAX_TURNS[self.dialect],
            summary_turn=deep_search if self.summary_turn is None else self.summary_turn,
            rollback=deep_search if self.rollback is None else self.rollback,
        )


@dataclass
class BackendConfig:
    """Which model backend serves the runs."""

    backend: str = "auto"
    """`openai` (a server), `transformers` (in this process), or `auto`: the server at the default
    address when one answers there, else in this process."""
    base_url_given: bool = False
    """True when the user named the server: then one that does not answer is an error, not a fallback."""
    gguf_file: str | None = None
    """A GGUF file inside the model folder, for the in-process backend."""
    token_mode: bool = False
    """Render prompts here and send token ids to vLLM's `/v1/completions` (token-exact trajectories)."""
    chat_template: Path | None = None
    """Chat template file for token mode (default: the tokenizer's)."""
    tokenizer: str | None = None
    """The tokenizer for token mode, a folder or Hugging Face id; None: the folder the server lists as the
    model's `root` when it is one here, else the model name."""
    route: str = "run"
    """With a pool of endpoints (several base URLs): `run` keeps every turn of a run on the endpoint of its
    first turn, `group` keeps the runs of one group (a question's rollouts) on one endpoint too."""
    verbose: bool = False
    """Let third-party libraries draw their own progress bars and logs on stderr (loading a model in
    this process); off, they are kept out, and our own progress lines say what happens."""


@dataclass
class ToolsConfig:
    """Which MCP servers the runs use and how tool calls are bounded."""

    mcp: list[str] = field(default_factory=list)
    """Extra MCP servers, `NAME=COMMAND` or `NAME=URL`."""
    default_servers: bool = True
    """Start the built-in servers (Python sandbox, search when configured, scrape + extract)."""
    tool_timeout_s: float = 300.0
    """Seconds one tool call may take."""
    max_result_chars: int = 100_000
    """Longer tool results are cut, with a marker saying so."""
    start_timeout_s: float = 60.0
    """Seconds a tool server may take to start and list its tools."""
    max_restarts: int = 1
    """Times in a row one run may restart a stdio server that died or hangs; a row ends once the
    restarted server has answered 10 of the run's calls (`restarts.RESTART_CREDIT_CALLS`), so a server
    that crashes now and then is restarted as long as it works in between. Once spent, the run's calls
    to the server come back at once as errors, and the run goes on."""
    upload_dirs: list[Path] = field(default_factory=list)
    """Local folders, besides those in NANBEIGE_SANDBOX_UPLOAD_DIRS (default the working directory),
    that the Python sandbox may upload files from (an eval's attachments)."""
    cache: Path | None = None
    """SQLite file of tool results, shared by runs and processes: a call recorded there is answered from
    it, and a new answer is recorded (the Python sandbox is never cached). None: no cache."""
    replay: bool = False
    """Answer tool calls only from `cache`; a call it holds no result for stops the run (`replay_miss`).
    No search or scrape backend is needed."""


@dataclass
class RunSettings:
    """Everything a command needs to run the loop."""

    llm: LLMConfig = field(default_factory=LLMConfig)
    """How to reach and sample from the model."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The loop's limits and context settings."""
    backend: BackendConfig = field(default_factory=BackendConfig)
    """Which backend serves the model."""
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    """The tool servers."""
    trajectory: Path | None = None
    """Trajectory file (JSONL, appended); None: a new file under NANBEIGE_RUNS_DIR (default `runs/`)."""
    system_prompt_file: Path | None = None
    """A file holding the mcp-xml system prompt as a template (`{tools}`, `{date}`); None: the built-in one."""
    reference: Path | None = None
    """A checkout of the reference harness (MiroThinker) whose own texts the model reads in mcp-xml
    (`agent/reference/checkout.py`); None: our own texts, laid out as the reference's."""
    whole_trajectories: bool = False
    """Write each trajectory in one piece when it ends, and only one that ended on its own (`collect`:
    the file then holds finished rollouts only), instead of turn by turn."""
