"""The settings of a command's runs: one dataclass per component, a docstring per field. The CLI's
flags map onto these, and their defaults are the CLI's defaults; `setup.py` builds the runs from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nanbeige.agent.llm import LLMConfig
from nanbeige.agent.loop import AgentConfig

BACKENDS = ("auto", "openai", "transformers")


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
    (`agent/reference.py`); None: our own texts, laid out as the reference's."""
    whole_trajectories: bool = False
    """Write each trajectory in one piece when it ends, and only one that ended on its own (`collect`:
    the file then holds finished rollouts only), instead of turn by turn."""
