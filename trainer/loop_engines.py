"""The loop's vLLM engines: which it syncs, syncing each iteration's policy to them, and which may sample an
iteration's policy. With a max staleness above 0 and the engines a pool the loop samples directly (no
`admin_urls` router in front), an engine that fails a sync is left out of sampling until it serves the policy
an iteration samples, and the loop goes on with the others; otherwise a failed sync stops the loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from nanbeige.agent.run.run_config import RunSettings
from nanbeige.trainer.loop_config import LoopConfig, LoopError
from nanbeige.trainer.loop_state import LoopState, Policy, write_state
from nanbeige.trainer.sync import SyncError, disagreeing, engine_root, on_every_engine, sync_engine


def engines(config: LoopConfig) -> list[str]:
    """The vLLM engines the loop syncs, each once, by its address without `/v1`."""
    return list(dict.fromkeys(engine_root(url) for url in config.admin_urls or config.settings.llm.urls()))


def leaves_out(config: LoopConfig) -> bool:
    """Whether an engine that lacks a policy is left out of sampling rather than stopping the loop: with a max
    staleness above 0, LoRA (an engine keeps every adapter it took, so which engines serve a policy stays
    true while later ones load) and more than one engine sampled directly (behind a router the loop cannot
    choose)."""
    return bool(config.max_staleness) and config.sync == "lora" and not config.admin_urls and len(engines(config)) > 1


async def sync_stage(
    config: LoopConfig, state: LoopState, checkpoint: str, iteration: int, notice: Callable[[str], None]
) -> Policy:
    """Make the new checkpoint the policy the next iteration samples from, on every engine; returns that policy.
    The engines that took it are recorded even when another did not, and are not synced again."""
    if config.sync in ("lora", "weights"):
        urls, key = engines(config), config.settings.llm.api_key
        failed = await on_every_engine(urls, lambda url: sync_engine(url, config.sync, Path(checkpoint), key))
        state.engines.update({url: f"iter-{iteration}" for url in urls if url not in failed})
        lacking = f"{len(failed)} of {len(urls)} engines did not take the new policy: " + "; ".join(failed.values())
        if failed and (len(failed) == len(urls) or not leaves_out(config)):
            raise SyncError(lacking)
        if failed:
            state.engines.update(dict.fromkeys(failed))  # found serving another policy
            notice(f"loop: {lacking}; they are left out of sampling until they serve the policy sampled")
        else:
            notice(f"loop: every engine serves iteration {iteration}'s policy: {', '.join(urls)}")
        # with LoRA the adapter's name; with weights the same served model, now with the new weights
        model = checkpoint if config.sync == "lora" else config.settings.llm.model
    elif config.settings.backend.backend == "transformers":
        model = checkpoint  # the in-process backend loads the checkpoint folder itself
    else:
        model = config.settings.llm.model  # the user restarts the server on the checkpoint
        notice(
            f"loop: serve {checkpoint} (restart the model server on it) for the next iteration to sample "
            "from the new policy"
        )
    return Policy(model, checkpoint, f"iter-{iteration}")


async def engines_agree(
    config: LoopConfig, state: LoopState, iteration: int, notice: Callable[[str], None] = print
) -> None:
    """Refuse to collect while the engines do not all say they serve the iteration's policy (with weights
    before any sync: the same weight version); where engines are left out (`leaves_out`), only while none
    does. The iteration that synced the policy is then no longer synced, so that the next call syncs the
    engines that lack it. An iteration admitted with a policy older than the newest (a max staleness above 0,
    resumed after the engines moved on) is admitted again with the newest instead: never rolled back."""
    entry = state.iterations[iteration - 1]
    policy = entry.policy
    if config.sync == "none" or config.sync == "lora" and policy.checkpoint is None:
        return  # nothing synced (a LoRA engine serves its base model whatever adapters it holds)
    urls = engines(config)
    lacking = await disagreeing(urls, config.sync, policy.checkpoint, config.settings.llm.api_key)
    state.engines.update({url: None if url in lacking else policy.version for url in urls})
    if not lacking or len(lacking) < len(urls) and leaves_out(config):
        return
    if policy.number() < state.policy.number():
        notice(f"loop: iteration {iteration} samples {state.policy.version}: {policy.version} is served no more")
        entry.policy = dataclasses.replace(state.policy)
        write_state(config.out, state)
        return await engines_agree(config, state, iteration, notice)
    fix = "start every engine on the same model"
    source = next((entry for entry in state.iterations if entry.synced is not None and entry.synced == policy), None)
    if source is not None:  # with a max staleness of 0 the previous iteration; above 0 perhaps an earlier one
        source.synced = None
        fix = f"iteration {source.iteration} is no longer synced: run the same loop again to sync them"
    write_state(config.out, state)
    raise LoopError(
        f"iteration {iteration}, collect: the engines do not all serve the policy "
        f"{policy.checkpoint or policy.model}, so collection does not start "
        f"({'; '.join(lacking.values())}); {fix}"
    )


async def sampling_settings(config: LoopConfig, settings: RunSettings, policy: Policy) -> RunSettings:
    """`settings` with the engines that serve `policy` alone, where engines are left out (`leaves_out`): asked
    at the start of each collect, so an engine that failed a sync samples again once it serves the policy."""
    if not leaves_out(config) or policy.checkpoint is None:  # left out only with LoRA, whose base all serve
        return settings
    lacking = await disagreeing(engines(config), config.sync, policy.checkpoint, settings.llm.api_key)
    urls = [url for url in settings.llm.urls() if engine_root(url) not in lacking]
    if not urls:
        raise LoopError(f"no engine serves the policy {policy.checkpoint}: {'; '.join(lacking.values())}")
    return dataclasses.replace(
        settings, llm=dataclasses.replace(settings.llm, base_url=urls[0], more_base_urls=tuple(urls[1:]))
    )
