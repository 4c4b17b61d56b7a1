"""`nanbeige doctor`: what this machine and these settings give a run, each part with its fix when it
is missing: the settings files in effect, the model (a server, or in this process), search, scrape +
extract, the Python sandbox, and which keys are set (by name; a key's value is never shown)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanbeige.agent.backends.model_server import ServerInfo

KEYS = (
    "NANBEIGE_API_KEY",
    "SERPER_API_KEY",
    "JINA_API_KEY",
    "E2B_API_KEY",
    "NANBEIGE_SUMMARY_API_KEY",
    "NANBEIGE_JUDGE_API_KEY",
)


@dataclass
class Finding:
    """One part of a run's set-up as found here."""

    part: str
    """What was checked: model, search, scrape, sandbox, keys."""
    ok: bool
    """Whether a run can use it as it is."""
    found: str
    """What is there, in a few words."""
    fix: str | None = None
    """How to get it where it is missing or weak."""


def check_settings_files(found: Any) -> Finding:
    """Every settings file in effect, and those found but left out (a folder's file not trusted)."""
    used = "; ".join(f"{path} ({where})" for path, where in found.used) or "none"
    ignored = [str(path) for path, _ in found.ignored]
    how = found.how.get(found.ignored[0][0]) if ignored else None  # none for a file no trust can make usable
    return Finding(
        "settings",
        True,
        f"{used}" + (f"; ignored: {', '.join(ignored)}" if ignored else ""),
        f"{how}, once you have read it" if how else None,
    )


def check_pool_member(base_url: str, model: str, api_key: str | None, probe: Callable[..., ServerInfo]) -> Finding:
    """One endpoint of a pool (several --base-url): a server must answer there, as the pool's start asks."""
    from nanbeige.agent.backends.llm import ModelUnavailable

    try:
        server = probe(base_url, api_key)
    except ModelUnavailable as exc:
        return Finding(
            "model",
            False,
            f"no server at {base_url} ({exc}): every endpoint of a pool must answer",
            "start it, or leave its --base-url out",
        )
    return served_model(base_url, model, server)


def served_model(base_url: str, model: str, server: ServerInfo) -> Finding:
    kind = "vLLM" if server.vllm else "an OpenAI-compatible server"
    context = f", context {server.max_model_len} tokens" if server.max_model_len else ""
    listed = (
        "" if not server.models or model in server.models else f"; it lists {', '.join(server.models[:3])}, not {model}"
    )
    return Finding(
        "model",
        not listed,
        f"{model} at {base_url}: {kind}{context}{listed}",
        "pass --model with a name the server lists" if listed else None,
    )


def check_model(base_url: str, model: str, api_key: str | None, probe: Callable[..., ServerInfo]) -> Finding:
    """A server that answers at `base_url`, else the model in this process: installed, and at hand."""
    from nanbeige.agent.backends.llm import ModelUnavailable
    from nanbeige.agent.backends.local_model import (
        SMALL_MODEL,
        LocalModelError,
        at_hand,
        resolve_small_model,
        small_model_folder,
    )

    try:
        server = probe(base_url, api_key)
    except ModelUnavailable as exc:
        unreachable = str(exc)
    else:
        return served_model(base_url, model, server)
    # a whole command: doctor itself takes --model but not --dialect, so a bare flag reads as doctor's
    small = (
        (f'; or try the small model this install has: `nanbeige ask "..." --model {SMALL_MODEL} --dialect tool-call`')
        if small_model_folder()
        else ""
    )
    serve = "start a server with `nanbeige serve` (GPU) or pass --base-url"
    if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
        return Finding(
            "model",
            False,
            f"no server at {base_url} ({unreachable}); the in-process backend is not installed",
            f"{serve}, or pip install 'nanbeige[local]'{small}",
        )
    try:
        folder, gguf_file = resolve_small_model(model, None)
        where = at_hand(folder, gguf_file)
    except LocalModelError as exc:  # the alias without its package
        return Finding("model", False, f"no server at {base_url}; {exc}", serve)
    except ValueError:  # no model id: nothing of it can be here
        where = None
    if where is None:
        return Finding(
            "model",
            False,
            f"no server at {base_url}; {model} is not downloaded here",
            f"{serve}, or let `nanbeige ask` download it (about 8 GB){small}",
        )
    return Finding(
        "model",
        True,
        f"no server at {base_url}: {model} runs in this process ({where}); slow on a CPU",
        f"for speed, {serve}",
    )


def check_search(env: Mapping[str, str]) -> Finding:
    from nanbeige.tools.search_config import choose_backend, config_from_env, search_setup_problem

    config = config_from_env(env)
    problem = search_setup_problem(config)
    if problem:
        return Finding("search", False, "off: no backend", problem)
    backend = choose_backend(config)
    found = {
        "serper": "Serper (SERPER_API_KEY set)",
        "searxng": f"SearXNG at {config.searxng_url}",
        "local": f"the local index in {config.index_dir}",
    }[backend]
    return Finding("search", True, found)


def check_scrape(env: Mapping[str, str], answers: Callable[[str, str | None], str | None] | None = None) -> Finding:
    """Fetching, and the extraction model a run's scrape server would use: the run's own server unless
    NANBEIGE_SUMMARY_* say otherwise. A model run in this process serves no other process, so without a
    server there, every extraction fails; `answers(url, key)` is None when a server answers at url, else why not."""
    from nanbeige.tools.scrape import ScrapeError, scrape_config_from_env

    try:
        config = scrape_config_from_env(env)
    except ScrapeError as exc:
        return Finding("scrape", False, "cannot start", str(exc))
    fetch = "Jina Reader (JINA_API_KEY set)" if config.backend == "jina" else "direct fetch here"
    summary = config.summary
    down = answers(summary.base_url, summary.api_key) if answers is not None else None
    if down is not None:
        in_process = (
            "" if env.get("NANBEIGE_SUMMARY_BASE_URL") else " (a model run in this process serves only its run)"
        )
        return Finding(
            "scrape",
            False,
            f"{fetch}, but no extraction model answers at {summary.base_url} ({down}): "
            "every scrape answers an error" + in_process,
            "run the model on a server (`nanbeige serve`, or pass --base-url), or set "
            "NANBEIGE_SUMMARY_BASE_URL and NANBEIGE_SUMMARY_MODEL to one that runs",
        )
    return Finding(
        "scrape",
        True,
        f"{fetch}; extraction by {summary.model} at {summary.base_url}",
        None if config.backend == "jina" else "JINA_API_KEY reads pages that need a browser",
    )


def check_sandbox(env: Mapping[str, str]) -> Finding:
    from nanbeige.tools.sandbox import config_from_env

    try:
        config = config_from_env(env)
    except ValueError as exc:
        return Finding("sandbox", False, "cannot start", str(exc))
    if config.backend == "e2b":
        return Finding("sandbox", True, "E2B (E2B_API_KEY set)")
    missing = [
        tool for tool, package in (("bwrap", "bubblewrap"), ("mkfs.ext4", "e2fsprogs")) if shutil.which(tool) is None
    ]
    if not config.jail:
        return Finding(
            "sandbox",
            True,
            "local, without a jail (NANBEIGE_SANDBOX_JAIL=0): code can read what this user can",
            "apt-get install bubblewrap, and unset NANBEIGE_SANDBOX_JAIL",
        )
    if "bwrap" in missing:  # the sandbox runs no code without its jail unless told to
        return Finding(
            "sandbox",
            False,
            "local, but runs no code: bubblewrap, its jail, is not installed",
            "apt-get install bubblewrap e2fsprogs (or dnf), set E2B_API_KEY, or NANBEIGE_SANDBOX_JAIL=0 "
            "to run code without the jail",
        )
    if missing:
        return Finding(
            "sandbox",
            True,
            "local, in a jail (bubblewrap), without a disk budget",
            "apt-get install e2fsprogs gives each sandbox a file system of its own",
        )
    return Finding("sandbox", True, "local, in a jail (bubblewrap), with a disk budget")


def check_keys(env: Mapping[str, str]) -> Finding:
    present = [name for name in KEYS if env.get(name)]
    return Finding("keys", True, "set: " + (", ".join(present) if present else "none"))


def findings(
    base_urls: list[str], model: str, api_key: str | None, env: Mapping[str, str] = os.environ
) -> list[Finding]:
    """The model at each endpoint (first, one a line), then search, scrape, sandbox and keys. Of a pool, every
    endpoint must answer: no model in this process stands in for one that does not. Each URL is asked once."""
    from nanbeige.agent.backends.llm import ModelUnavailable, probe_server

    asked: dict[tuple[str, str | None], Any] = {}

    def probe(url: str, key: str | None) -> Any:
        if (url, key) not in asked:
            try:
                asked[url, key] = probe_server(url, key, timeout=2.0, model=model)
            except ModelUnavailable as exc:
                asked[url, key] = exc
        if isinstance(asked[url, key], ModelUnavailable):
            raise asked[url, key]
        return asked[url, key]

    def answers(url: str, key: str | None) -> str | None:
        try:
            probe(url, key)
        except ModelUnavailable as exc:
            return str(exc)
        return None

    models = (
        [check_model(base_urls[0], model, api_key, probe)]
        if len(base_urls) == 1
        else [check_pool_member(url, model, api_key, probe) for url in base_urls]
    )
    # the scrape server's environment as a run would give it: the run's own model where nothing says otherwise
    run_env = {
        **env,
        "NANBEIGE_BASE_URL": base_urls[0],
        "NANBEIGE_MODEL": model,
        **({"NANBEIGE_API_KEY": api_key} if api_key else {}),
    }
    return [*models, check_search(env), check_scrape(run_env, answers), check_sandbox(env), check_keys(env)]
