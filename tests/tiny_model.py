"""A tiny randomly initialised Llama model with a real (trained here) byte-level BPE tokenizer and a
Nanbeige-style ChatML template, written to a folder like a Hugging Face checkpoint. No download."""

from __future__ import annotations

from pathlib import Path

# ChatML as Nanbeige's deep-search template renders it: messages verbatim, `<think>` kept in content.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "<think> I should search for this. </think> The answer is \\boxed{42}.",
    "<use_mcp_tool> <server_name>search</server_name> <tool_name>google_search</tool_name> "
    '<arguments> {"q": "capital of France"} </arguments> </use_mcp_tool>',
    "You are a helpful assistant. Today is: 2026-11-21. What is the capital of France? Paris.",
]


def prompt_texts() -> list[str]:
    """What the runs' prompts are mostly made of: the built-in servers' tool descriptions (their sources'
    docstrings) and the mcp-xml prompt's layout. Trained on these as well, the tokenizer writes a run's
    prompt in about 3,600 tokens instead of 8,600, and every test that runs the model pre-fills less."""
    import nanbeige.servers
    from nanbeige.agent.reference import mcp_prompt

    sources = [path for folder in nanbeige.servers.__path__ for path in sorted(Path(folder).glob("*.py"))]
    return [path.read_text() for path in [*sources, Path(mcp_prompt.__file__)]]


def make_tiny_model(folder: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 20 + prompt_texts(), trainer)
    tokenizer.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>"])  # added, not special: as in Nanbeige
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        pad_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        rope_theta=70_000_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def make_tiny_gguf(folder: Path) -> Path:
    """A Llama GGUF file of a few kilobytes (random float32 weights, a byte-level BPE tokenizer trained here),
    written with the `gguf` package that transformers reads GGUF files with: for the tests of what happens
    around reading a GGUF file, which do not need SmolLM2's de-quantization to take seconds."""
    import json

    import gguf
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 5, trainer)
    bpe = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(bpe["vocab"], key=bpe["vocab"].get)
    hidden, ffn, heads, kv_heads = 16, 32, 2, 1
    path = folder / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if token in specials else gguf.TokenType.NORMAL for token in tokens])
    writer.add_token_merges([merge if isinstance(merge, str) else " ".join(merge) for merge in bpe["merges"]])
    writer.add_bos_token_id(bpe["vocab"]["<|im_start|>"])
    writer.add_eos_token_id(bpe["vocab"]["<|im_end|>"])
    random = np.random.default_rng(0)
    kv = hidden // heads * kv_heads
    # Shapes as torch's (out, in); the writer stores them the GGUF way round.
    shapes = {
        "token_embd": (len(tokens), hidden),
        "output": (len(tokens), hidden),
        "output_norm": (hidden,),
        "blk.0.attn_norm": (hidden,),
        "blk.0.ffn_norm": (hidden,),
        "blk.0.attn_q": (hidden, hidden),
        "blk.0.attn_k": (kv, hidden),
        "blk.0.attn_v": (kv, hidden),
        "blk.0.attn_output": (hidden, hidden),
        "blk.0.ffn_gate": (ffn, hidden),
        "blk.0.ffn_up": (ffn, hidden),
        "blk.0.ffn_down": (hidden, ffn),
    }
    for name, shape in shapes.items():
        writer.add_tensor(f"{name}.weight", (random.standard_normal(shape) * 0.02).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
