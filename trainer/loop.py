"""`nanbeige train --loop N`: collect -> judge -> train -> sync, N iterations, resumable at any stage.

    out/iter-<i>/rollouts.jsonl   G rollouts per question, sampled by the current policy (`collect`)
    out/iter-<i>/judged.jsonl     the same, with rewards (`judge`)
    out/iter-<i>/train/           the checkpoints trained on them (`train`)
    out/loop.json                 the state: the stages done per iteration, and the current policy

Iteration i trains from iteration i-1's checkpoint (the first from `TrainConfig.model`), then makes
the new checkpoint the policy the next iteration samples from:
- `sync="lora"`: the new adapter is hot-loaded into the serving vLLM (`POST /v1/load_lora_adapter`)
  under the checkpoint's absolute path as its name, and the next collect asks for that model. The
  name is a path because token mode loads the tokenizer from the model name, and the checkpoint
  holds one. With LoRA every iteration goes on training one adapter on the base model (seeded from
  the last checkpoint's adapter and optimizer state), since vLLM applies an adapter to the base model.
- `sync="none"`: nothing is sent anywhere. In process (`--backend transformers`) the next collect
  loads the new checkpoint folder itself; against a server it samples from whatever the server
  serves, so restart the server on the new checkpoint between iterations (run one iteration at a
  time, `iterations` 1, 2, ...: each call resumes the last) to stay on-policy.

The state file is rewritten (atomically) after each stage, so a run stopped anywhere goes on where
it stopped when called again with the same out folder: done stages are skipped; an interrupted
collect or judge resumes its own out file, and an interrupted training resumes from its newest
checkpoint. A vLLM server restarted in between has lost its adapters: reload the last one by hand
(or restart it with `--lora-modules NAME=PATH`, the names being in the state file).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from nanbeige.agent.config import RunSettings
from nanbeige.trainer.judge import JudgeRunConfig
from nanbeige.trainer.train import TrainConfig

STATE = "loop.json"
SYNCS = ("lora", "none")
STAGES = {"collected": "collect", "judged": "judge", "trained": "train", "synced": "sync"}  # done -> the stage
LORA_FIX = ("vLLM hot-loads adapters only when started with --enable-lora (and --max-lora-rank at least the "
            "adapter's rank) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment")


class LoopError(Exception):
    """A stage of the loop failed, or the loop is misconfigured; one line naming the fix."""


@dataclass
class LoopConfig:
    """What the loop runs each iteration; the stages' own configs say how."""

    iterations: int
    """Iterations to have done in `out` (calling again with a larger number goes on)."""
    out: Path
    """Folder for every iteration's files and the state file `loop.json`."""
    questions: Path
    """The questions file collect samples rollouts for (JSONL or CSV: `question`, `answer`, `id`)."""
    settings: RunSettings
    """How collect runs the agent: the model server or the in-process model, the tools, the limits.
    Its `llm.model` is the first iteration's policy."""
    judge: JudgeRunConfig
    """How the rollouts are judged (grader, critic)."""
    train: TrainConfig
    """The training template: its `data`, `model` and `out` are set per iteration (`model` is the
    starting point of the first iteration, and with LoRA the base model of every one)."""
    group_size: int = 8
    """Rollouts per question (G)."""
    collect_concurrency: int = 8
    """Rollouts at once."""
    sync: str = "lora"
    """`lora`: hot-load each new adapter into the serving vLLM; `none`: send nothing (in process the
    next collect loads the new checkpoint; against a server, restart it on the checkpoint)."""


# ---------------------------------------------------------------- the state file


def new_state(config: LoopConfig) -> dict[str, Any]:
    """The state before the first iteration: the policy is the model of the settings."""
    policy = {"model": config.settings.llm.model, "checkpoint": None, "version": "iter-0"}
    return {"questions": str(config.questions), "sync": config.sync, "policy": policy, "iterations": []}


def read_state(out: Path) -> dict[str, Any] | None:
    path = out / STATE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LoopError(f"cannot read the loop state {path} ({exc}); fix it or pass another out folder") from None


def write_state(out: Path, state: dict[str, Any]) -> None:
    """Write the state whole or not at all: a kill mid-write leaves the previous state."""
    path, temporary = out / STATE, out / (STATE + ".tmp")
    temporary.write_text(json.dumps(state, indent=1) + "\n")
    os.replace(temporary, path)


def iteration_entry(state: dict[str, Any], iteration: int) -> dict[str, Any]:
    """The state's record of the iteration (created empty when it starts)."""
    entries = state["iterations"]
    if len(entries) < iteration:
        entries.append({"iteration": iteration, "policy": dict(state["policy"])})
    return entries[iteration - 1]


# ---------------------------------------------------------------- the stages


async def collect_stage(config: LoopConfig, entry: dict[str, Any], folder: Path, notice: Callable[[str], None]
                        ) -> dict[str, Any]:
    """G rollouts per question with the iteration's policy (collect resumes its own file)."""
    from nanbeige.trainer.collect import CollectConfig, collect

    from nanbeige.agent.prompts import search_template

    settings, backend = config.settings, config.settings.backend
    if backend.token_mode and backend.chat_template is None and settings.agent.dialect == "mcp-xml":
        # the first model's deep-search template for every iteration: a checkpoint folder does not hold it
        backend = dataclasses.replace(backend, chat_template=search_template(settings.llm.model))
    settings = dataclasses.replace(settings, backend=backend,
                                   llm=dataclasses.replace(settings.llm, model=entry["policy"]["model"]))
    collect_config = CollectConfig(out=folder / "rollouts.jsonl", questions=config.questions,
                                   group_size=config.group_size, concurrency=config.collect_concurrency)
    summary = await collect(collect_config, settings, notice)
    if summary["failed"]:  # not written: the next call retries them, so the stage is not done
        raise LoopError(f"{summary['failed']} rollouts failed on the model server (last: {summary['last_error']})")
    return {"rollouts": summary["rollouts"], "pass_rate": summary["pass_rate"], "model": settings.llm.model}


async def judge_stage(config: LoopConfig, folder: Path, notice: Callable[[str], None]) -> dict[str, Any]:
    from nanbeige.trainer.judge import judge_file

    summary = await judge_file(folder / "rollouts.jsonl", folder / "judged.jsonl", config.judge, notice)
    return {"judged": summary["judged"] + summary["already_judged"], "mean_reward": summary["mean_reward"],
            "outcome_errors": summary["outcome_errors"], "masked_turns": summary["masked_turns"]}


def train_config_for(config: LoopConfig, policy: dict[str, Any], folder: Path) -> TrainConfig:
    """The iteration's training: on its judged rollouts, from the previous checkpoint. With LoRA the
    model stays the base one and training goes on from the previous adapter and its optimizer state:
    a fresh adapter on a merged checkpoint would be wrong on a server that applies it to the base model."""
    previous = Path(policy["checkpoint"]) if policy["checkpoint"] else None
    model = str(previous) if previous and not config.train.lora_rank else config.train.model
    init_from = previous if previous and config.train.lora_rank else None
    return dataclasses.replace(config.train, data=[folder / "judged.jsonl"], model=model, out=folder / "train",
                               init_from=init_from)


async def train_stage(config: LoopConfig, policy: dict[str, Any], folder: Path, notice: Callable[[str], None]
                      ) -> dict[str, Any]:
    """Train in a thread (the event loop stays free), resuming from the newest checkpoint in the folder."""
    from nanbeige.trainer.train import train

    train_config = train_config_for(config, policy, folder)
    summary = await asyncio.to_thread(train, train_config, True, notice)
    checkpoint = str(Path(summary["checkpoint"]).resolve())
    return {"checkpoint": checkpoint, "steps": summary["steps"], "rows": summary["rows"]}


async def load_adapter(base_url: str, name: str, adapter: Path, api_key: str | None = None) -> None:
    """Hot-load a LoRA adapter into the vLLM server at `base_url` (ending in /v1) as model `name`.
    Nothing is sent when the server already lists `name` with this adapter (a resumed sync)."""
    path = str(adapter.resolve())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        async with httpx.AsyncClient(headers=headers, timeout=120.0) as http:
            listed = await http.get(f"{root}/v1/models")
            if listed.status_code == 200 and any(entry.get("id") == name and entry.get("root") == path
                                                 for entry in listed.json().get("data", [])):
                return
            response = await http.post(f"{root}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    except httpx.HTTPError as exc:
        raise LoopError(f"cannot reach the model server at {root} to load the LoRA adapter {path} "
                        f"({type(exc).__name__}); start it, or use sync none") from None
    if response.status_code != 200:
        raise LoopError(f"the model server at {root} refused the LoRA adapter {path}: HTTP {response.status_code} "
                        f"{server_words(response)}; {LORA_FIX}")


def server_words(response: httpx.Response) -> str:
    """The error message in vLLM's answer (`error.message`, or `message` in older versions), else its text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]


async def sync_stage(config: LoopConfig, checkpoint: str, iteration: int, notice: Callable[[str], None]
                     ) -> dict[str, Any]:
    """Make the new checkpoint the policy the next iteration samples from; returns that policy."""
    if config.sync == "lora":
        await load_adapter(config.settings.llm.base_url, checkpoint, Path(checkpoint) / "adapter",
                           config.settings.llm.api_key)
        model = checkpoint
    elif config.settings.backend.backend == "transformers":
        model = checkpoint  # the in-process backend loads the checkpoint folder itself
    else:
        model = config.settings.llm.model  # the user restarts the server on the checkpoint
        notice(f"loop: serve {checkpoint} (restart the model server on it) for the next iteration to sample "
               "from the new policy")
    return {"model": model, "checkpoint": checkpoint, "version": f"iter-{iteration}"}


# ---------------------------------------------------------------- the loop


def check(config: LoopConfig) -> None:
    """Refuse a configuration that cannot work, before anything runs."""
    if config.sync not in SYNCS:
        raise LoopError(f"sync must be one of {', '.join(SYNCS)}, not {config.sync!r}")
    if config.iterations < 1:
        raise LoopError("iterations must be at least 1")
    if config.sync == "lora" and not config.train.lora_rank:
        raise LoopError("sync lora hot-loads a LoRA adapter into vLLM: train with a LoRA rank, or use sync none "
                        "(and serve each new checkpoint)")
    if config.sync == "lora" and config.settings.backend.backend == "transformers":
        raise LoopError("sync lora updates a vLLM server, and the in-process backend has none: use sync none, "
                        "where each iteration's collect loads the new checkpoint")
    if not config.questions.is_file():
        raise LoopError(f"{config.questions}: no such questions file")


async def run_iteration(config: LoopConfig, state: dict[str, Any], iteration: int,
                        notice: Callable[[str], None]) -> None:
    """The iteration's stages not yet done, the state written after each."""
    from nanbeige.agent.setup import SetupError
    from nanbeige.trainer.collect import CollectError
    from nanbeige.trainer.judge import JudgeError
    from nanbeige.trainer.train import TrainError

    entry = iteration_entry(state, iteration)
    folder = config.out / f"iter-{iteration}"
    folder.mkdir(parents=True, exist_ok=True)
    stages: list[tuple[str, Callable[[], Any]]] = [
        ("collected", lambda: collect_stage(config, entry, folder, notice)),
        ("judged", lambda: judge_stage(config, folder, notice)),
        ("trained", lambda: train_stage(config, entry["policy"], folder, notice)),
        ("synced", lambda: sync_stage(config, entry["trained"]["checkpoint"], iteration, notice)),
    ]
    for stage, run in stages:
        if stage in entry:
            continue
        try:
            entry[stage] = await run()
        except (CollectError, JudgeError, TrainError, SetupError, LoopError) as exc:
            raise LoopError(f"iteration {iteration}, {STAGES[stage]}: {exc} "
                            f"(the state is in {config.out / STATE}: run the same loop again to resume)") from None
        if stage == "synced":
            state["policy"] = entry["synced"]
        write_state(config.out, state)
        notice(f"loop: iteration {iteration} {stage}: {json.dumps(entry[stage])}")


async def run_loop(config: LoopConfig, notice: Callable[[str], None], resume: bool = True) -> dict[str, Any]:
    """Run (or, with `resume`, go on with) the loop in `config.out`; returns a summary per iteration.
    Without `resume` an out folder that already holds a loop is refused rather than overwritten."""
    check(config)
    state = read_state(config.out)
    if state is not None and not resume:
        raise LoopError(f"{config.out} already holds a loop ({STATE}): resume it, or pass another out folder")
    if state is None:
        config.out.mkdir(parents=True, exist_ok=True)
        state = new_state(config)
        write_state(config.out, state)
    for iteration in range(1, config.iterations + 1):
        await run_iteration(config, state, iteration, notice)
    return {"out": str(config.out), "policy": state["policy"],
            "iterations": [summary_of(entry) for entry in state["iterations"]]}


def summary_of(entry: dict[str, Any]) -> dict[str, Any]:
    """One iteration as the loop reports it."""
    collected, judged = entry.get("collected", {}), entry.get("judged", {})
    trained, synced = entry.get("trained", {}), entry.get("synced", {})
    return {"iteration": entry["iteration"], "model": entry["policy"]["model"], "rollouts": collected.get("rollouts"),
            "mean_reward": judged.get("mean_reward"), "train_steps": trained.get("steps"),
            "checkpoint": trained.get("checkpoint"), "synced_model": synced.get("model")}
