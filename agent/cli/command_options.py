"""The own flags of `serve`, `eval`, `collect` and `resume`, as option tables (`option_tables.with_options`,
`option_tables.with_run_options`), in the order their help lists them. The run flags that `eval` and `collect` share
with `ask` are `options.RUN_OPTIONS`; a row here of the same name (eval's --temperature, collect's --top-p)
takes that flag's place, with the command's own default said."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nanbeige.agent.cli import options as o
from nanbeige.agent.cli.judge_options import JudgeApiKey, JudgeBaseUrl, JudgeModel, JudgeTemplate
from nanbeige.agent.cli.options import option
from nanbeige.agent.cli.ranges import bounds
from nanbeige.agent.cli.serve_config import ServeConfig

SERVE: dict[str, tuple[Any, Any]] = {
    "model": option(str, ServeConfig.model, help="Model id or folder."),
    "host": option(
        str, ServeConfig.host, help="Address to listen on; off loopback it needs --api-key or --no-api-key."
    ),
    "port": option(int, ServeConfig.port, min=1, max=65535),
    "api_key": option(
        str | None, None, envvar="NANBEIGE_API_KEY", show_default=False, help="The key clients must send."
    ),
    "no_api_key": option(bool, False, "--no-api-key", help="Serve off loopback without a key."),
    "dialect": option(str, ServeConfig.dialect, help="mcp-xml (no tool parser) or tool-call (vLLM parses tool calls)."),
    "served_model_name": option(
        str | None, None, help="Name clients send as --model (default: --model).", show_default=False
    ),
    "max_model_len": option(
        int,
        ServeConfig.max_model_len,
        min=1024,
        help=("Context length in tokens (KV cache: 64 KiB a token, 16 GiB for one full 262144-token sequence)."),
    ),
    "gpu_memory_utilization": option(
        float | None,
        None,
        min=0.05,
        max=1.0,
        show_default=False,
        help=(
            "Share of GPU memory for weights and KV cache (default 0.92); with the CPU build, a share of the "
            "machine's memory (default 0.4)."
        ),
    ),
    "data_parallel_size": option(int, ServeConfig.data_parallel_size, "--data-parallel-size", "-dp", min=1),
    "chat_template": option(
        Path | None,
        None,
        help="Chat template: a .jinja file, or a tokenizer config JSON whose chat_template is used.",
        show_default=False,
    ),
    "tool_call_parser": option(str, ServeConfig.tool_call_parser, help="vLLM's tool parser, for --dialect tool-call."),
    "reasoning_parser": option(
        str,
        ServeConfig.reasoning_parser or "none",
        help=("vLLM's reasoning parser for --dialect tool-call, or none (a model without <think> tokens needs none)."),
    ),
    "rl_logprobs": option(bool, False, help="Report processed logprobs, for RL rollouts."),
    "no_prefix_caching": option(bool, False, help="Turn prefix caching off."),
    "weight_sync": option(
        bool,
        False,
        help="Accept full-weight updates from `nanbeige loop --sync weights` (vLLM's "
        "dev endpoints, which take no API key).",
    ),
}

EVAL: dict[str, tuple[Any, Any]] = {
    "data": option(Path | None, None, help="The benchmark's official file (or folder).", show_default=False),
    "k": option(int, 3, "-k", min=1, help="Runs per task (avg@k, pass@k)."),
    "concurrency": option(int, 4, min=1, help="Runs at once."),
    "limit": option(int | None, None, min=1, help="Only the first N tasks.", show_default=False),
    "out_dir": option(
        Path | None,
        None,
        "--out",
        help="Out folder; an existing one of the same eval is resumed. Default: runs/eval-BENCH-<time>.",
        show_default=False,
    ),
    "grader": option(
        str | None,
        None,
        show_default=False,
        help=(
            "reference (the reference harness's evaluator, which produced the paper's numbers), official (the "
            "benchmark authors' grader), official-fixed (the same with a known bug fixed), or a grader's full name "
            "\\[default: reference]."
        ),
    ),
    "judge_base_url": (JudgeBaseUrl, None),
    "judge_model": (JudgeModel, None),
    "judge_api_key": (JudgeApiKey, None),
    "judge_template": (JudgeTemplate, None),
    # a run flag that eval reads too: its deadline holds for the judge as for the agent's model
    "request_timeout": o.RUN_OPTIONS["request_timeout"],
    "ray": (o.RayAddress, None),
    # eval's own default temperature: BFCL runs at its official generator's unless one is given
    # (`settings_for_bfcl`)
    "temperature": option(
        float | None,
        None,
        **bounds("temperature"),
        show_default=False,
        help=(
            "Sampling temperature \\[default: 1.0 for mcp-xml, 0.6 for tool-call; 0.001 for bfcl and its parts, "
            "as BFCL's own generator]."
        ),
    ),
}

COLLECT: dict[str, tuple[Any, Any]] = {
    "questions": option(
        Path | None,
        None,
        show_default=False,
        help="Questions: JSONL or CSV with `question`, optional `answer` and `id`.",
    ),
    "bench": option(str | None, None, help="Or a benchmark of `nanbeige eval` (with --data).", show_default=False),
    "data": option(Path | None, None, help="The benchmark's file, with --bench.", show_default=False),
    "group_size": option(int, 8, "--group-size", "-G", min=1, help="Rollouts per question."),
    "out": option(
        Path, Path("rollouts.jsonl"), help="Trajectory JSONL the rollouts are appended to; an existing one is resumed."
    ),
    "concurrency": option(int, 8, min=1, help="Rollouts at once."),
    "limit": option(int | None, None, min=1, help="Only the first N questions.", show_default=False),
    "policy_version": option(
        str | None,
        None,
        show_default=False,
        help=("Recorded on every rollout \\[default: the weights the server reports, or the model's name in process]."),
    ),
    "allow_inexact": option(bool, False, help="Collect through a chat endpoint, whose token ids are not exact."),
    "ray": (o.RayAddress, None),
    # collect's own defaults of two run flags: rollouts for training sample without a top-p cut or a penalty
    # (`trainer.collect.on_policy`), since the trainer computes the policy's probabilities without them.
    "top_p": option(
        float | None,
        None,
        **bounds("top_p"),
        show_default=False,
        help=(
            "Nucleus sampling threshold \\[default: 1.0 (off): the rollouts stay on-policy; another value makes them "
            "off-policy]."
        ),
    ),
    "repetition_penalty": option(
        float | None,
        None,
        min=0.0,
        show_default=False,
        help=(
            "Penalty on repeated tokens, vLLM servers only \\[default: 1.0 (off): the rollouts stay on-policy; another "
            "value makes them off-policy]."
        ),
    ),
}

COLLECT_RUN = ("concurrency", "top_p", "repetition_penalty")
"""collect's own flags that say how its runs run, which the loop's collect takes too (the rest of its table
says what it samples and where it writes, which the loop decides each iteration)."""
COLLECT_LEAVES_OUT = ("verbose",)
"""The run flags collect does not take: its runs' turns go to a file, not the terminal."""

# resume takes only the run flags that do not change what the model sees (resume.py says why)
RESUME: dict[str, tuple[Any, Any]] = {
    "trajectory_id": option(
        str | None,
        None,
        "--id",
        show_default=False,
        help="Which trajectory of the file (needed when several can be resumed).",
    ),
    "base_url": o.RUN_OPTIONS["base_url"],
    "backend": o.RUN_OPTIONS["backend"],
    "api_key": o.RUN_OPTIONS["api_key"],
    "mcp": o.RUN_OPTIONS["mcp"],
    "no_default_servers": o.RUN_OPTIONS["no_default_servers"],
    "json_output": option(bool, False, "--json", help="Print the end record as JSON on stdout."),
    "gguf_file": o.RUN_OPTIONS["gguf_file"],
    "token_mode": o.RUN_OPTIONS["token_mode"],
    "chat_template": o.RUN_OPTIONS["chat_template"],
    "cache": o.RUN_OPTIONS["cache"],
    "replay": o.RUN_OPTIONS["replay"],
    "reference": o.RUN_OPTIONS["reference"],
    "request_timeout": o.RUN_OPTIONS["request_timeout"],
}
"""`nanbeige resume`'s flags, after its trajectory file."""
