"""The in-process backend's cache of de-quantized GGUF weights (`agent/backends/dequantized.py`), held against
transformers' own reading of the GGUF file: a cached load is the same tokenizer and the same weights, and
writes the same reply token for token. The cache is the user's folder, read as untrusted: links, folders
others can write, unfinished or damaged entries and pickles are never used, and a cache that cannot be written
costs only time. Runs that start together make an entry once."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_smollm2 import GGUF, smollm2_folder
from tiny_model import make_tiny_gguf

from nanbeige.agent.backends.dequantized import MARKER, entry_for, load_entry, load_gguf, making, remove, usable
from nanbeige.agent.backends.in_process import TransformersLLM
from nanbeige.agent.backends.llm import LLMConfig

pytestmark = pytest.mark.anyio

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def weights(model: object) -> dict:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


@pytest.mark.slow
async def test_a_cached_load_is_the_gguf_files_tokenizer_and_weights_and_writes_the_same_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import transformers

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = LLMConfig(model=str(smollm2_folder()), temperature=0.0, repetition_penalty=1.0, max_tokens=12)
    first = TransformersLLM(config, gguf_file=GGUF)  # transformers reads the GGUF file; the entry is written
    [entry] = [path for path in (tmp_path / "cache" / "nanbeige" / "dequantized").iterdir() if path.is_dir()]
    assert entry == entry_for(smollm2_folder() / GGUF, transformers.__version__)[0]
    assert oct(entry.stat().st_mode & 0o777) == "0o700" and (entry / "model.safetensors").is_file()
    second = TransformersLLM(config, gguf_file=GGUF)  # from the entry

    assert second.tokenizer_identity == first.tokenizer_identity  # its name too: the package's folder
    assert second.template_identity == first.template_identity and second.stop_ids == first.stop_ids
    before, after = weights(first.model), weights(second.model)
    assert before.keys() == after.keys() and all(torch.equal(before[name], after[name]) for name in before)
    replies = [await llm.complete(QUESTION) for llm in (first, second)]
    assert replies[0].prompt_ids == replies[1].prompt_ids
    assert replies[0].completion_ids == replies[1].completion_ids
    # The entry's weights are read in place from the safetensors file, at addresses that are not 64-byte
    # aligned, and some CPUs' matrix kernels then sum in another order: the same weights give logprobs that
    # differ in the last bits (seen: 1e-7). Copied to fresh memory, they give the GGUF load's bits exactly.
    assert replies[1].logprobs == pytest.approx(replies[0].logprobs, abs=1e-5)
    assert "Paris" in replies[1].message["content"]


@pytest.fixture
def entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    """Where this GGUF file's entry goes in an empty cache of this test's own, and the marker it must hold."""
    import transformers

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return entry_for(smollm2_folder() / GGUF, transformers.__version__)


def finished(entry: Path, marker: dict[str, str]) -> Path:
    entry.mkdir(parents=True, mode=0o700)
    (entry / MARKER).write_text(json.dumps(marker))
    return entry


def test_only_a_finished_private_folder_of_this_users_is_an_entry(
    entry: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, marker = entry
    assert not usable(path, marker)  # none yet
    finished(path, marker)
    assert usable(path, marker)
    assert not usable(path, marker | {"transformers": "0.0.1"})  # made by another transformers
    path.chmod(0o720)
    assert not usable(path, marker)  # others could have written it
    path.chmod(0o700)
    (path / MARKER).write_text("{not json")
    assert not usable(path, marker)  # not finished, or damaged
    (path / MARKER).unlink()
    assert not usable(path, marker)


def test_a_link_in_the_cache_is_never_followed_and_what_it_points_to_is_left_alone(
    entry: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, marker = entry
    elsewhere = finished(tmp_path / "elsewhere" / "weights", marker)
    path.parent.mkdir(parents=True)
    path.symlink_to(elsewhere, target_is_directory=True)
    assert not usable(path, marker)
    remove(path)
    assert not path.exists() and not path.is_symlink() and (elsewhere / MARKER).is_file()


class Planted:
    """Unpickled, it leaves a file: proof that a pickle in the cache was loaded."""

    def __reduce__(self) -> tuple:
        return (Path.write_text, (Path(os.environ["PLANTED"]), "the pickle ran"))


def test_a_pickle_or_remote_code_in_an_entry_never_runs_and_the_entry_is_not_loaded(
    entry: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import transformers

    path, marker = finished(*entry), entry[1]
    planted = tmp_path / "planted"
    monkeypatch.setenv("PLANTED", str(planted))
    (path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "auto_map": {"AutoModelForCausalLM": "evil.Model", "AutoTokenizer": ["evil.Tokenizer", None]},
            }
        )
    )
    (path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["evil.T", None]}}))
    (path / "evil.py").write_text(f"open({str(planted)!r}, 'w').write('remote code ran')\n")
    (path / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": Planted()}))
    assert usable(path, marker)  # finished and private: what is inside is still not trusted
    assert load_entry(transformers, path, torch.float32) is None
    assert not planted.exists()


def test_a_damaged_entry_does_not_load(entry: tuple[Path, dict[str, str]]) -> None:
    import torch
    import transformers

    path = finished(*entry)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (path / "model.safetensors").write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a": 1')  # cut short
    assert load_entry(transformers, path, torch.float32) is None


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF file of a few kilobytes, for what happens around reading one: SmolLM2's takes seconds to read."""
    return make_tiny_gguf(tmp_path_factory.mktemp("gguf"))


def test_a_cache_that_cannot_be_written_costs_only_time(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache folder's place is taken by a file: the model loads from the GGUF file all the same."""
    import torch
    import transformers

    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tokenizer, model = load_gguf(transformers, str(tiny_gguf.parent), tiny_gguf.name, torch.float32)
    assert tokenizer.name_or_path == str(tiny_gguf.parent) and model.config.vocab_size == len(tokenizer) == 300
    assert (tmp_path / "cache").read_text() == "not a folder"


def test_runs_making_the_same_entry_take_turns(entry: tuple[Path, dict[str, str]]) -> None:
    path, _ = entry
    events: list[str] = []

    def first() -> None:
        with making(path):
            events.append("first in")
            time.sleep(0.5)
            events.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    while not events:
        time.sleep(0.01)
    with making(path):  # waits for the first to finish
        events.append("second in")
    thread.join()
    assert events == ["first in", "first out", "second in"]


def test_a_link_or_a_fifo_in_place_of_the_lock_is_not_followed_and_does_not_hang(
    entry: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, _ = entry
    path.parent.mkdir(parents=True)
    lock = path.parent / f".{path.name}.lock"
    target = tmp_path / "somebody's file"
    target.write_text("theirs")
    lock.symlink_to(target)
    with making(path):
        pass
    assert target.read_text() == "theirs" and lock.is_symlink()
    lock.unlink()
    os.mkfifo(lock)
    with making(path):  # opened without blocking and not locked: the run reads the GGUF file itself
        pass


# Both runs start loading at the same moment (each waits until the other is ready), and reading the small file
# takes as long as a large one's would: without the lock, both would read it.
LOADS_AND_SAYS_IF_IT_READ_THE_FILE = """
import os, sys, time, torch, transformers
from pathlib import Path
from nanbeige.agent.backends import dequantized
read = dequantized.read_gguf
def reading(*args):
    print("read the GGUF file", flush=True)
    time.sleep(1)
    return read(*args)
dequantized.read_gguf = reading
ready = Path(sys.argv[3])
(ready / str(os.getpid())).touch()
while len(list(ready.iterdir())) < 2:
    time.sleep(0.01)
tokenizer, model = dequantized.load_gguf(transformers, sys.argv[1], sys.argv[2], torch.float32)
print(model.config.vocab_size)
"""


def test_two_runs_started_together_read_the_gguf_file_once(tiny_gguf: Path, tmp_path: Path) -> None:
    env = os.environ | {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    (tmp_path / "ready").mkdir()
    arguments = [str(tiny_gguf.parent), tiny_gguf.name, str(tmp_path / "ready")]
    command = [sys.executable, "-c", LOADS_AND_SAYS_IF_IT_READ_THE_FILE, *arguments]
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=240)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert all(output.splitlines()[-1] == "300" for output in outputs)
    assert sum(output.count("read the GGUF file") for output in outputs) == 1  # the other read the entry
