"""The in-process model backend: a Hugging Face model run with transformers, on CPU or GPU.

It renders the chat template itself (`prompts.py`: within a segment each prompt extends the
previous prompt and completion verbatim, as in token mode), samples with the same settings and
stop tokens as the server path, and records the prompt ids, the completion ids (stop token
included: the model sampled it) and each sampled token's logprob after temperature and top-p,
the same "processed" logprobs vLLM reports for RL. torch and transformers are imported here only, and
only when a model is loaded, so the rest of the CLI stays fast and works without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import pickle
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, TypeVar

from nanbeige.agent.backends.completion import Completion
from nanbeige.agent.backends.dequantized import load_gguf
from nanbeige.agent.backends.llm import LLMConfig
from nanbeige.agent.backends.local_model import LocalModelError, load_problem, model_name, resolve_small_model
from nanbeige.agent.backends.prompts import Conversation, Prompter, identity

T = TypeVar("T")

# Tokens that end an assistant turn in ChatML-style templates, besides the tokenizer's own eos.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")


def _until(cancelled: threading.Event) -> Any:
    """Stopping criteria for `generate` that end it once `cancelled` is set."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Cancelled(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            import torch

            return torch.full((input_ids.shape[0],), cancelled.is_set(), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Cancelled()])


def _imports() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise LocalModelError(
            f"the in-process model needs torch and transformers ({exc.name} is missing): "
            "pip install 'nanbeige[local]', or start a model server"
        ) from None
    return torch, transformers


# Where the model runs in this process on a CPU, settings the user left at their defaults are cut to a
# size a CPU gets through: a few tokens a second make a 16,384-token reply take hours and 600 turns days.
CPU_MAX_TOKENS = 1024
CPU_MAX_TURNS = 10


@contextmanager
def loading(notice: Callable[[str], None], model: str) -> Iterator[None]:
    """Around the load of `model` in this process: where the notice can show a wait as it goes (its
    `waiting`: the command line's line with the seconds so far) it does, else it is told once."""
    what = f"loading {model_name(model)} in this process"
    waiting = getattr(notice, "waiting", None)
    if waiting is None:
        notice(f"{what} …")
        yield
        return
    with waiting(what):
        yield


def on_cpu() -> bool:
    """Whether a model loaded here would run on the CPU."""
    torch, _ = _imports()
    return not torch.cuda.is_available()


@contextmanager
def quiet_load(transformers: Any) -> Iterator[None]:
    """Keep transformers' and the hub's progress bars (de-quantizing a GGUF, loading weights, downloads)
    off stderr while a model loads, and put them back as they were after: in a log file each redraw is a
    line of noise, in a terminal they break the live view, and a script's own bars are its own business.
    Transformers' warnings stay at errors only (they would come again at each reply). `--verbose` leaves
    all of them on."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    transformers.utils.logging.set_verbosity_error()
    hub_bars, own_bars = not are_progress_bars_disabled(), transformers.utils.logging.is_progress_bar_enabled()
    disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf  # its bar is tqdm's own, no switch turns it off
    except ImportError:
        gguf = None
    gguf_bar = getattr(gguf, "tqdm", None)
    if gguf_bar is not None:
        gguf.tqdm = functools.partial(gguf_bar, disable=True)
    try:
        yield
    finally:
        if gguf_bar is not None:
            gguf.tqdm = gguf_bar
        if hub_bars:
            enable_progress_bars()
        if own_bars:
            transformers.utils.logging.enable_progress_bar()


def stop_ids(tokenizer: Any) -> list[int]:
    """Token ids that end an assistant turn: the tokenizer's eos and the ChatML end-of-turn tokens."""
    vocab = tokenizer.get_vocab()
    ids = {tokenizer.eos_token_id} | {vocab[token] for token in END_OF_TURN if token in vocab}
    return sorted(i for i in ids if i is not None)


class TransformersLLM:
    """A model loaded once, in this process; `complete` runs generation in a worker thread."""

    def __init__(
        self,
        config: LLMConfig,
        gguf_file: str | None = None,
        device: str | None = None,
        verbose: bool = False,
        chat_template: tuple[str, str] | None = None,
    ):
        """`chat_template`: (its name, its text) to render prompts with instead of the tokenizer's own, as token
        mode does (`--chat-template`, or the model's deep-search template in the mcp-xml dialect)."""
        torch, transformers = _imports()
        with contextlib.nullcontext() if verbose else quiet_load(transformers):
            self._load(torch, transformers, config, gguf_file, device)
        self._use_template(config, chat_template)
        self.lock = asyncio.Lock()  # one generation at a time: the model is not shared between threads

    def _use_template(self, config: LLMConfig, chat_template: tuple[str, str] | None) -> None:
        name, text = chat_template or (None, None)
        if not text and not self.tokenizer.chat_template:
            raise LocalModelError(
                f"{config.model!r} has no chat template; the in-process backend needs one (--chat-template FILE)"
            )
        self.prompter = Prompter(self.tokenizer, text)
        self.tokenizer_identity, self.template_identity = identity(self.tokenizer, self.prompter.chat_template, name)

    def _load(
        self, torch: Any, transformers: Any, config: LLMConfig, gguf_file: str | None, device: str | None
    ) -> None:
        self.config = config.for_dialect("mcp-xml")  # a no-op for a config set up for its dialect
        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        source, gguf_file = resolve_small_model(config.model, gguf_file)
        try:
            if gguf_file:
                self.tokenizer, self.model = load_gguf(transformers, source, gguf_file, dtype)
            else:
                self.tokenizer = transformers.AutoTokenizer.from_pretrained(source)
                self.model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise LocalModelError(load_problem(source, gguf_file, exc)) from None
        except pickle.UnpicklingError:  # transformers reads a .bin with weights_only=True: it never runs code
            raise LocalModelError(
                f"cannot load the folder {source!r}: its weights hold more than tensors (a pickle that could run "
                "code): refused, never unpickled; save them as safetensors"
            ) from None
        self.model.to(self.device).eval()
        self.stop_ids = self._stop_ids()

    def _stop_ids(self) -> list[int]:
        return stop_ids(self.tokenizer)

    def new_conversation(self, group: str | None = None) -> Conversation:
        return Conversation()

    def count_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, conversation: Conversation | None
    ) -> int:
        return self.prompter.count(messages, tools, conversation)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        conversation: Conversation | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        # The tokenizer is used only on the event loop's thread (as `count_prompt` is), the model only in
        # the worker thread, one generation at a time. A cancelled call (Ctrl-C, SIGTERM, a timeout) stops
        # its generation at the next token, so nothing waits for a long reply at exit.
        conversation = conversation or Conversation()
        cancelled = threading.Event()
        async with self.lock:
            started = time.perf_counter()
            prompt_ids = self.prompter.prompt_ids(messages, tools, conversation)
            streamer = self._streamer(on_text) if on_text is not None else None
            try:
                completion_ids, logprobs = await asyncio.to_thread(
                    self._generate, prompt_ids, max_tokens or self.config.max_tokens, cancelled, streamer
                )
            except asyncio.CancelledError:
                cancelled.set()
                raise
            self.prompter.sampled(conversation, prompt_ids, completion_ids)
        return self._completion(prompt_ids, completion_ids, logprobs, time.perf_counter() - started)

    async def complete_text(self, prompt: str, max_tokens: int, temperature: float) -> Completion:
        """A plain text completion of `prompt`, tokenized as a server tokenizes a text prompt (special
        tokens added as the tokenizer adds them), sampled at `temperature` with nothing else set."""
        cancelled = threading.Event()
        config = dataclasses.replace(self.config, temperature=temperature, top_p=1.0, repetition_penalty=1.0, stop=[])
        async with self.lock:
            started = time.perf_counter()
            prompt_ids = self.tokenizer(prompt)["input_ids"]
            try:
                completion_ids, logprobs = await asyncio.to_thread(
                    self._generate, prompt_ids, max_tokens, cancelled, None, config
                )
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return self._completion(prompt_ids, completion_ids, logprobs, time.perf_counter() - started, stops=[])

    def _streamer(self, on_text: Callable[[str], None]) -> Any:
        """A transformers streamer that hands the reply's text to `on_text` on the event loop's thread,
        a word at a time as transformers decodes it (special tokens shown: `<think>` marks reasoning),
        without the token that ends the reply: it is no text of the reply (`<|im_end|>` on the screen)."""
        from transformers import TextStreamer

        loop, stops, torch = asyncio.get_running_loop(), set(self.stop_ids), self.torch

        class ToLoop(TextStreamer):
            def put(self, value: Any) -> None:
                if not self.next_tokens_are_prompt:
                    kept = [token for token in value.reshape(-1).tolist() if token not in stops]
                    if not kept:
                        return
                    value = torch.tensor(kept)
                super().put(value)

            def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
                if text:
                    loop.call_soon_threadsafe(on_text, text)

        return ToLoop(self.tokenizer, skip_prompt=True, skip_special_tokens=False)

    def _generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        cancelled: threading.Event,
        streamer: Any = None,
        config: LLMConfig | None = None,
    ) -> tuple[list[int], list[float]]:
        """Sample a reply: its token ids (the stop token included) and each one's sampling logprob."""
        torch, c = self.torch, config or self.config
        input_ids = torch.tensor([prompt_ids], device=self.device)
        # top_k=0 overrides transformers' default of 50: sampling must match the server path (vLLM: no top-k).
        sampling = (
            {"do_sample": True, "temperature": c.temperature, "top_p": c.top_p, "top_k": 0}
            if c.temperature > 0
            else {"do_sample": False}
        )
        if c.stop:
            sampling |= {"stop_strings": c.stop, "tokenizer": self.tokenizer}
        if c.repetition_penalty not in (None, 1.0):  # as vLLM applies it: to prompt and reply tokens alike
            sampling["repetition_penalty"] = c.repetition_penalty
        with torch.inference_mode():
            out = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_tokens,
                eos_token_id=self.stop_ids,
                pad_token_id=self.stop_ids[0],
                output_scores=True,
                return_dict_in_generate=True,
                stopping_criteria=_until(cancelled),
                streamer=streamer,
                **sampling,
            )
        completion_ids = out.sequences[0, len(prompt_ids) :].tolist()
        # scores are the logits after temperature and top-p (shape: one (1, vocab) row per new token)
        logprobs = [
            torch.log_softmax(score[0].float(), dim=-1)[token].item()
            for score, token in zip(out.scores, completion_ids)
        ]
        return completion_ids, logprobs

    def _completion(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        logprobs: list[float],
        latency_s: float,
        stops: list[str] | None = None,
    ) -> Completion:
        ended = bool(completion_ids) and completion_ids[-1] in self.stop_ids
        text_ids = completion_ids[:-1] if ended else completion_ids
        content = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        stops = self.config.stop if stops is None else stops
        cut = min((content.find(s) for s in stops if s in content), default=-1)
        if cut >= 0:  # like a server: the text ends before the stop string
            content, ended = content[:cut], True
        return Completion(
            message={"role": "assistant", "content": content},
            finish_reason="stop" if ended else "length",
            usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids)},
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            logprobs=logprobs,
            latency_s=latency_s,
        )

    async def aclose(self) -> None:
        pass


async def in_thread(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` in a daemon thread. Unlike `asyncio.to_thread`, Ctrl-C or SIGTERM during a slow
    model load or probe ends the command at once: nothing waits for the thread at exit. (Generation
    does not use it: torch's thread state must be torn down before the process exits, and a cancelled
    generation stops by itself.)"""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        try:
            outcome: tuple[bool, Any] = (True, work(*args))
        except BaseException as exc:  # handed to the waiting task, which raises it
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(_settle, done, outcome)
        except RuntimeError:  # the loop is gone: the command already ended
            pass

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        return await done
    finally:
        if not done.cancelled():  # it is ending: let it finish before the process may exit
            thread.join()


def _settle(done: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    succeeded, value = outcome
    if done.done():  # the waiting task was cancelled meanwhile
        return
    if succeeded:
        done.set_result(value)
    else:
        done.set_exception(value)
