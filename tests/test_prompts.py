"""Prompt ids built fast (compiled template, chunk-cached tokenization, verbatim extension) are
exactly what plain transformers gives: for a byte-level BPE, a sentencepiece-style (Metaspace)
tokenizer like Nanbeige's, and SmolLM2's real tokenizer; and the safety checks turn a shortcut
off where it would be wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_smollm2 import GGUF, smollm2_folder
from tiny_model import CHAT_TEMPLATE, CORPUS, make_tiny_model

from nanbeige.agent.backends.prompts import Conversation, Prompter

# A template with the usual context-dependent parts: a default system prompt, tool results grouped
# in one user turn, reasoning rendered from `reasoning_content`, tools listed in the system turn.
GROUPING_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nDefault.{% if tools %} Tools: "
    "{{ tools | map(attribute='name') | join(', ') }}{% endif %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% elif m['role'] == 'assistant' and m.get('reasoning_content') %}<|im_start|>assistant\n<think>\n"
    "{{ m['reasoning_content'] }}\n</think>\n\n{{ m['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def metaspace_tokenizer(folder: Path) -> Any:
    """A sentencepiece-style BPE (spaces as "▁", a "▁" prepended to the first word only), as the
    Llama tokenizer Nanbeige uses."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"])
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    tokenizer.add_tokens(["<think>", "</think>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|im_start|>", eos_token="<|im_end|>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="module", params=["byte-level", "metaspace", "smollm2"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "byte-level":
        return AutoTokenizer.from_pretrained(make_tiny_model(folder))
    if request.param == "metaspace":
        return metaspace_tokenizer(folder)
    return AutoTokenizer.from_pretrained(str(smollm2_folder()), gguf_file=GGUF)


def conversation(turns: int) -> list[dict[str, Any]]:
    messages = [{"role": "user", "content": "What is the capital of France?  Two  spaces, tabs\tand\nnewlines."}]
    for i in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": f" <think>step {i}</think>  search {i} ",
                "reasoning_content": f"thinking {i}" if i % 2 else None,
            }
        )
        messages += [{"role": "tool", "content": f" result {i}.{k} é ✓ \n"} for k in range(1 + i % 3)]
    return messages


def plain_ids(tokenizer: Any, messages: list[dict[str, Any]], template: str) -> list[int]:
    text = tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, GROUPING_TEMPLATE])
def test_every_prompt_of_a_growing_conversation_matches_plain_transformers(tokenizer: Any, template: str) -> None:
    prompter, state = Prompter(tokenizer, template), Conversation()
    messages = conversation(40)
    for end in range(1, len(messages) + 1):
        assert prompter.prompt_ids(messages[:end], None, state) == plain_ids(tokenizer, messages[:end], template)
    assert prompter.compiled is not None and prompter.split_token == "<|im_start|>"  # both shortcuts stayed on
    assert prompter.render(messages, [{"name": "search"}]) == tokenizer.apply_chat_template(
        messages, tools=[{"name": "search"}], chat_template=template, add_generation_prompt=True, tokenize=False
    )


def test_a_rewritten_history_is_tokenized_afresh_and_only_new_chunks_are_tokenized(tokenizer: Any) -> None:
    prompter, state = Prompter(tokenizer, GROUPING_TEMPLATE), Conversation()
    messages = conversation(30)
    prompter.prompt_ids(messages[:-1], None, state), prompter.prompt_ids(messages, None, state)  # past the self-checks
    calls = []
    prompter._encode_whole = lambda text: calls.append(text) or tokenizer(text, add_special_tokens=False)["input_ids"]
    rewritten = [*messages[:5], {**messages[5], "content": "(omitted)"}, *messages[6:]]
    assert prompter.prompt_ids(rewritten, None, state) == plain_ids(tokenizer, rewritten, GROUPING_TEMPLATE)
    assert len(calls) == 1 and "(omitted)" in calls[0]  # the one changed chunk


def test_completions_are_extended_verbatim_within_a_segment(tokenizer: Any) -> None:
    prompter, state = Prompter(tokenizer, CHAT_TEMPLATE), Conversation()
    messages = conversation(0)
    prompt = prompter.prompt_ids(messages, None, state)
    completion = letter_by_letter(tokenizer, "Paris")
    prompter.sampled(state, prompt, completion)
    text = tokenizer.decode(completion[:-1])
    grown = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "Sure?"}]
    nxt = prompter.prompt_ids(grown, None, state)
    assert nxt[: len(prompt) + len(completion)] == prompt + completion
    assert tokenizer.decode(nxt) == tokenizer.decode(plain_ids(tokenizer, grown, CHAT_TEMPLATE))
    other = [{"role": "user", "content": "Another question"}]
    assert prompter.prompt_ids(other, None, state) == plain_ids(tokenizer, other, CHAT_TEMPLATE)  # no stale extension


def letter_by_letter(tokenizer: Any, text: str) -> list[int]:
    """Ids the model may sample that are not the canonical tokenization of `text`, then end-of-turn."""
    ids = [tokenizer.convert_tokens_to_ids(c) for c in text]
    assert ids != tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_one_prompter_serves_interleaved_conversations_each_extended_verbatim(tokenizer: Any) -> None:
    prompter = Prompter(tokenizer, CHAT_TEMPLATE)
    states = [Conversation(), Conversation()]
    histories = [[{"role": "user", "content": "First question"}], [{"role": "user", "content": "Second one"}]]
    sent: list[list[list[int]]] = [[], []]
    for step in range(6):
        for which in (0, 1):  # one turn of each conversation in turn, over the same prompter
            prompt = prompter.prompt_ids(histories[which], None, states[which])
            if sent[which]:
                assert prompt[: len(sent[which][-1])] == sent[which][-1]  # extends its own last prompt + completion
            completion = letter_by_letter(tokenizer, f"Paris{which}{step}")
            prompter.sampled(states[which], prompt, completion)
            sent[which].append(prompt + completion)
            histories[which] = [
                *histories[which],
                {"role": "assistant", "content": tokenizer.decode(completion[:-1])},
                {"role": "user", "content": f"Result {step}"},
            ]


def test_a_split_point_that_changes_tokenization_is_caught_and_dropped(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(make_tiny_model(tmp_path / "tiny"))
    prompter = Prompter(tokenizer)
    prompter.split_token = "e"  # cuts words apart: joined chunk ids differ from the whole text's
    messages = conversation(3)
    assert prompter.prompt_ids(messages) == plain_ids(tokenizer, messages, CHAT_TEMPLATE)
    assert prompter.split_token == ""  # chunking is off for this tokenizer from now on


def test_a_compiled_render_that_differs_is_caught_and_dropped(tmp_path: Path) -> None:
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import _compile_jinja_template

    tokenizer = AutoTokenizer.from_pretrained(make_tiny_model(tmp_path / "tiny"))
    prompter = Prompter(tokenizer)
    prompter.compiled = _compile_jinja_template(GROUPING_TEMPLATE)  # stands for any divergence
    messages = conversation(2)
    assert prompter.render(messages) == tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert prompter.compiled is None
