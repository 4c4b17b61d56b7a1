"""`nanbeige resume`: which trajectory of a file to continue, with what settings, and the checks that
it will see what it saw.

A run's settings come from its start line: model, sampling, dialect, limits, tools, system prompt
and question. Only what does not change what the model sees may be given anew: where the model
is served (`--base-url`, `--api-key`, `--backend`, ...) and how the tool servers start (`--mcp`,
`--no-default-servers`). The tools they offer, and the tokenizer and chat template when prompts are
built here, must be the very ones the run had, or the resume is refused before anything is written.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.backends.local_model import as_typed
from nanbeige.agent.cli.command_options import RESUME
from nanbeige.agent.run.restore import complete_turns
from nanbeige.agent.run.run_config import AgentConfig, BackendConfig, RunSettings, ToolsConfig
from nanbeige.agent.run.tokens import last_prompt
from nanbeige.agent.setup.setup import SetupError
from nanbeige.agent.trajectory.records import NotATrajectoryFile, check_trajectory_file, fields_problem, record_line
from nanbeige.agent.trajectory.trajectory import Trajectory
from nanbeige.agent.trajectory.trajectory_file import RESUMABLE, load_trajectories

SAMPLING = ("temperature", "top_p", "repetition_penalty", "max_tokens", "stop")


def pick(path: Path, trajectory_id: str | None) -> Trajectory:
    """The trajectory of the file to resume: the one named, else the only one that can be."""
    try:
        check_trajectory_file(path)  # before reading: a FIFO would block, another file is not ours
    except NotATrajectoryFile as exc:
        raise SetupError(str(exc)) from None
    try:
        trajectories = load_trajectories(path, say_torn=True)
    except OSError as exc:
        raise SetupError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise SetupError(f"{path}: {exc}: is this a trajectory file?") from None
    if trajectory_id is not None:
        named = [t for t in trajectories if t.id == trajectory_id]
        if not named:
            raise SetupError(f"{path} holds no trajectory {trajectory_id!r}", usage=True)
        if named[0].stop_reason not in RESUMABLE:
            raise SetupError(finished(named[0]))
        return checked(named[0], path)
    open_ones = [t for t in trajectories if t.stop_reason in RESUMABLE]
    if len(open_ones) == 1:
        return checked(open_ones[0], path)
    if open_ones:
        raise SetupError(
            f"{path} holds {len(open_ones)} trajectories that can be resumed "
            f"({', '.join(t.id for t in open_ones)}): pass --id",
            usage=True,
        )
    if len(trajectories) == 1:
        raise SetupError(finished(trajectories[0]))
    raise SetupError(
        f"{path} holds no trajectory that can be resumed: {len(trajectories)} finished on their own"
        if trajectories
        else f"{path} holds no trajectory"
    )


def checked(trajectory: Trajectory, path: Path) -> Trajectory:
    """The trajectory, once its settings are known to be of their types and its token records to rebuild
    (the resumed run starts from them)."""
    problem = settings_problem(trajectory)
    if problem is not None:
        raise SetupError(
            f"{path}:{record_line(path, trajectory.id, 'start')}: the start record of trajectory "
            f"{trajectory.id} does not fit the format ({problem}); it cannot be resumed"
        )
    try:
        last_prompt(trajectory.turns[: complete_turns(trajectory.turns)])
    except (ValueError, TypeError) as exc:
        raise SetupError(f"{path}: trajectory {trajectory.id} cannot be resumed: {exc}") from None
    return trajectory


def settings_problem(trajectory: Trajectory) -> str | None:
    """Why the recorded settings cannot make a run (a value of another type than the setting's), or None."""
    agent = {f.name for f in dataclasses.fields(AgentConfig)} - {"reference"}
    limits, sampling = trajectory.limits, trajectory.sampling
    for what, values, cls in (
        ("limits", {k: v for k, v in limits.items() if k in agent}, AgentConfig),
        ("limits", {k: limits[k] for k in ("tool_timeout_s", "max_result_chars") if k in limits}, ToolsConfig),
        ("sampling", {k: v for k, v in sampling.items() if k in SAMPLING}, LLMConfig),
    ):
        problem = fields_problem(values, cls)
        if problem is not None:
            return f"{what}: {problem}"
    if not isinstance(limits.get("server"), str | None) or not isinstance(limits.get("reference"), dict | None):
        return (
            "limits: 'server' is not text"
            if not isinstance(limits.get("server"), str | None)
            else "limits: 'reference' is not an object"
        )
    return None


def check_not_in_use(path: Path) -> None:
    """Refuse to resume into a file another process is still writing: every trajectory writer holds a
    shared lock on its file while open, and its run's later turns and end record would interleave with
    the resumed run's."""
    import fcntl

    with open(path, "rb") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SetupError(
                f"another process is still writing {path} (is its run still going?): resume it after that process ends"
            ) from None
        except OSError:
            return  # a file system without locks: nothing to check with
        fcntl.flock(file, fcntl.LOCK_UN)


def finished(trajectory: Trajectory) -> str:
    reasons = ", ".join(str(reason) for reason in RESUMABLE if reason)
    return (
        f"trajectory {trajectory.id} finished on its own (stop reason {trajectory.stop_reason}): only a run cut "
        f"short (no end record, or {reasons}) can be resumed"
    )


def settings_for(trajectory: Trajectory, path: Path, **given: Any) -> RunSettings:
    """The settings the run was made with, served and tooled as `resume`'s flags say (`command_options.RESUME`,
    by name; one not given is at its default): by default by the server the run used (recorded without
    credentials; a key comes from --api-key or NANBEIGE_API_KEY again).
    A run that read a reference checkout is resumed only with `--reference` given again: reading the
    checkout runs its prompt functions, and a path in a file someone handed us must not choose the code.
    The small model is found again through its installed package, also where an older run recorded its folder."""
    flags = {name: default for name, (_, default) in RESUME.items()} | given
    limits, sampling = trajectory.limits, trajectory.sampling
    base_url, backend, reference_checkout = flags["base_url"], flags["backend"], flags["reference"]
    checkout_record = limits.get("reference") if isinstance(limits.get("reference"), dict) else {}
    recorded_checkout = checkout_record.get("path") or (trajectory.reference and "(no path recorded)")
    if recorded_checkout and reference_checkout is None:
        raise SetupError(
            f"{path}: trajectory {trajectory.id} read its prompts from the reference checkout "
            f"{str(recorded_checkout)[:300]!r}: resume it with --reference PATH (a checkout's code runs "
            "when it is read, so the path is never taken from the file)",
            usage=True,
        )
    agent = AgentConfig(
        **{
            f.name: limits[f.name]
            for f in dataclasses.fields(AgentConfig)
            if f.name in limits and f.name != "reference"
        }
    )
    urls = list(base_url or []) or [server for server in [recorded_server(trajectory, path, backend)] if server]
    llm = LLMConfig(
        base_url=urls[0] if urls else LLMConfig.base_url,
        more_base_urls=tuple(urls[1:]),
        model=as_typed(trajectory.model),
        api_key=flags["api_key"],
        timeout_s=LLMConfig.timeout_s if flags["request_timeout"] is None else flags["request_timeout"],
        **{name: sampling[name] for name in SAMPLING if name in sampling},
    )
    tools = ToolsConfig(
        mcp=flags["mcp"] or [],
        default_servers=not flags["no_default_servers"],
        tool_timeout_s=limits.get("tool_timeout_s", ToolsConfig.tool_timeout_s),
        max_result_chars=limits.get("max_result_chars", ToolsConfig.max_result_chars),
    )
    backend_config = BackendConfig(
        backend=backend,
        base_url_given=bool(urls),
        gguf_file=flags["gguf_file"],
        token_mode=flags["token_mode"],
        chat_template=flags["chat_template"],
    )
    return RunSettings(
        llm=llm, agent=agent, tools=tools, trajectory=path, reference=reference_checkout, backend=backend_config
    )


def recorded_server(trajectory: Trajectory, path: Path, backend: str) -> str | None:
    """The server the run used, when no --base-url is given: only where it is the one the user's own settings
    name anyway (the default). A file someone handed over must not choose where the user's API key goes."""
    limits = trajectory.limits
    recorded = limits.get("server") if isinstance(limits.get("server"), str) else None
    if recorded is None or backend not in ("auto", "openai"):
        return None
    if recorded.rstrip("/") != LLMConfig.base_url.rstrip("/"):
        raise SetupError(
            f"{path}: trajectory {trajectory.id} was served by {recorded[:300]!r}: resume it with "
            "--base-url URL, naming that server if you trust it (the server your API key goes to is "
            "never taken from the file)",
            usage=True,
        )
    return recorded


def recorded_flags(trajectory: Trajectory) -> str:
    """The run's tool server flags as recorded, quoted for the user to copy (never run: the file is not the
    user's word; its control characters are escaped where errors are printed); empty when the file has none of
    the right types."""
    recorded = trajectory.limits.get("tool_servers")
    if not isinstance(recorded, dict):
        return ""
    specs, default = recorded.get("mcp"), recorded.get("default_servers")
    if not isinstance(specs, list) or not all(isinstance(spec, str) for spec in specs) or not isinstance(default, bool):
        return ""
    words = [f"--mcp {shlex.quote(spec)}" for spec in specs] + ["--no-default-servers"] * (not default)
    return " ".join(words) or "no tool server flags"


def check_unchanged(trajectory: Trajectory, llm: Any, tools: list[dict[str, Any]], reference: Any = None) -> None:
    """Refuse a resume whose tools, tokenizer, chat template or reference texts differ from the run's."""
    had = (trajectory.reference or {}).get("sha256")
    if had != (reference.sha256 if reference is not None else None):
        raise SetupError(
            "the run's prompts were read from a reference checkout whose files have changed since "
            f"(sha256 {had}): resume with the checkout as it was"
            if had
            else "the run used our own prompts, not a reference checkout's"
        )
    if tools != trajectory.tools:
        had = [f"{t['server']}/{t['name']}" for t in trajectory.tools]
        now = [f"{t['server']}/{t['name']}" for t in tools]
        gone, new = [n for n in had if n not in now], [n for n in now if n not in had]
        detail = (
            "; ".join(part for part in (gone and "missing " + ", ".join(gone), new and "new " + ", ".join(new)) if part)
            or "their descriptions or schemas changed"
        )
        flags = recorded_flags(trajectory)
        raise SetupError(
            f"the tools offered now are not the run's ({detail}): resume with the tool servers the run "
            "had (the same --mcp and --no-default-servers" + (f"; it recorded: {flags}" if flags else "") + ")"
        )
    for what, had, now in (
        ("tokenizer", trajectory.tokenizer, llm.tokenizer_identity),
        ("chat template", trajectory.chat_template, llm.template_identity),
    ):
        if (had or {}).get("sha256") != (now or {}).get("sha256"):
            said = f"{what} {had['name']}" if had else f"no {what} here (a chat server rendered them)"
            raise SetupError(
                f"the run's prompts were built with {said}, and this backend would build them otherwise: "
                "resume with the backend flags the run had (--token-mode, --chat-template, --backend)"
            )
