"""BFCL's official pipeline as the oracle: scripted model replies in the shapes real models give (right and
wrong, well and badly formatted), and the package's own generator and runner run on them.

`Replies` answers each prompt of the Nanbeige handler from the item it recognises in it, so that both
pipelines, given the same model, see the same replies. `run_official` is what `bfcl generate
--skip-server-setup` followed by `bfcl evaluate --partial-eval` do, run in this process (the package's CLI
imports every vendor SDK; its functions do not, once the one-entry registry is in place).
"""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path
from typing import Any

from nanbeige.evals import bfcl


def first_choice(options: list[Any]) -> Any:
    """The first acceptable value of a parameter's options ("" marks it optional); None: leave it out."""
    given = [value for value in options if value != ""]
    return choice_value(given[0]) if given else None


def choice_value(value: Any) -> Any:
    # a dict parameter's options are themselves {key: [options]}; so are the dicts in a list of dicts
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return {key: first_choice(v) for key, v in value.items() if first_choice(v) is not None}
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return [choice_value(item) for item in value]
    return value


def right_calls(ground_truth: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls a perfect model makes for a single-turn item, as {"name", "arguments"}."""
    calls = []
    for call in ground_truth:
        ((name, params),) = call.items()
        calls.append(
            {"name": name, "arguments": {p: first_choice(o) for p, o in params.items() if first_choice(o) is not None}}
        )
    return calls


def block(call: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


def variant(index: int, calls: list[dict[str, Any]]) -> str:
    """Reply number `index % 10` of the shapes seen from real models; the official handler accepts some
    of them and rejects others."""
    right = "\n".join(block(c) for c in calls)
    if not calls:
        return "None of the functions fits this request; could you tell me more?"
    first = calls[0]
    wrong_args = {k: ("something else" if isinstance(v, str) else 987654) for k, v in first["arguments"].items()}
    shapes = [
        right,
        "".join("<tool_call>" + json.dumps(c) + "</tool_call>" for c in calls),  # no newlines inside the tags
        "<tool_call>\n" + repr(first) + "\n</tool_call>",  # Python's quotes: not JSON
        block({"name": first["name"], "arguments": {**first["arguments"], "unit_of_nothing": None}}),
        block({"name": first["name"].replace(".", "_"), "arguments": first["arguments"]}),
        right + '\n<tool_call>\n{"name": broken\n</tool_call>',  # one call the handler cannot read
        "<think>\nThe user wants a call, so I will make it.\n" + right,  # a <think> never closed
        "<think>\nok\n</think>\n\n" + block({"name": first["name"], "arguments": wrong_args}),
        "I cannot do that with the tools I have.",
        "<think>\nLet me call it.\n</think>\n\n" + right,
    ]
    return shapes[index % len(shapes)]


def multi_turn_calls(call_strings: list[str], functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's multi-turn ground truth (`cd(folder='document')`, `sort('report.pdf')`) as {"name", "arguments"}
    calls, positional arguments named after the function's parameters in their documented order."""
    calls = []
    for text in call_strings:
        node = ast.parse(text, mode="eval").body
        params = next((list(f["parameters"]["properties"]) for f in functions if f["name"] == node.func.id), [])
        arguments = {params[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
        calls.append(
            {
                "name": node.func.id,
                "arguments": arguments | {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords},
            }
        )
    return calls


class Replies:
    """The scripted model: recognises the item in a prompt by its first user message, and answers with
    that item's reply shape. Multi-turn items get the ground truth's calls for the turn the prompt is
    at (plain text once tool results came back), or, for every other one, a reply without calls."""

    def __init__(self, items: dict[str, tuple[dict[str, Any], Any, int]]):
        # item id -> (official entry, its ground truth or None, its position in the script)
        self.items = items
        self.by_question = {self.first_user(entry): item_id for item_id, (entry, _, _) in items.items()}

    @staticmethod
    def first_user(entry: dict[str, Any]) -> str:
        return next(m["content"] for m in entry["question"][0] if m["role"] == "user")

    def __call__(self, request: dict[str, Any]) -> str:
        prompt = request["prompt"]
        matches = [item_id for question, item_id in self.by_question.items() if question in prompt]
        if not matches:
            return "I do not know this question."
        item_id = max(matches, key=lambda i: len(self.first_user(self.items[i][0])))
        entry, truth, position = self.items[item_id]
        if item_id.startswith("multi_turn"):
            if prompt.rstrip().endswith("</tool_response><|im_end|>\n<|im_start|>assistant"):
                return "Done."
            turn = prompt.count("<|im_start|>user\n") - prompt.count("<|im_start|>user\n<tool_response>") - 1
            if position % 2 or truth is None or turn >= len(truth) or not truth[turn]:
                return "Which folder do you mean?"
            return "\n".join(block(c) for c in multi_turn_calls(truth[turn], entry["function"]))
        if item_id.startswith("web_search"):  # a search first, then an answer from what it found
            if "<tool_response>" not in prompt:
                return block({"name": "search_engine_query", "arguments": {"keywords": "sea otters sleeping"}})
            answer = truth[0] if position % 2 == 0 else "I do not know"
            return "{'answer': '" + answer + "', 'context': 'from the search results'}"
        if item_id.startswith("memory"):  # a prerequisite conversation, or a question on what it said
            if truth is None:
                return "Noted, thank you."
            answer = truth[0] if position % 2 == 0 else "I do not know"
            return "{'answer': '" + answer + "', 'context': 'from what you told me earlier'}"
        if truth is None:  # irrelevance, relevance: a call to the first function offered, or none
            offered = entry["function"][0]["name"] if entry.get("function") else "anything"
            return variant((0, 8, 1)[position % 3], [{"name": offered, "arguments": {}}])
        return variant(position, right_calls(truth))


def script_for(counts: dict[str, int]) -> Replies:
    """Replies for the first `counts[category]` items of each category."""
    from bfcl_eval.utils import is_relevance_or_irrelevance, load_ground_truth_entry

    items = {}
    for category, n in counts.items():
        entries = bfcl.official().utils.load_dataset_entry(category)[:n]
        truths: dict[str, Any] = {}
        if not is_relevance_or_irrelevance(category):  # memory truths are named "memory_..." for every backend
            shared = next((name for name in ("memory", "web_search") if category.startswith(name)), None)
            truths = {
                row["id"].replace(shared, category, 1) if shared else row["id"]: row["ground_truth"]
                for row in load_ground_truth_entry(category)
            }
        for position, entry in enumerate(entries):
            items[entry["id"]] = (entry, truths.get(entry["id"]), position)
    return Replies(items)


def tokenizer_folder(folder: Path) -> Path:
    """A model folder the official generator can load a tokenizer and config from without a download:
    a whitespace tokenizer and a config with a context length (only prompt sizes depend on them)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(folder)
    GPT2Config(n_positions=32768).save_pretrained(folder)
    return folder


def run_official(base_url: str, counts: dict[str, int], folder: Path, monkeypatch: Any) -> Path:
    """The official generator on the first `counts[category]` items of each category against the model at
    `base_url`, then the official runner; returns the score folder."""
    package = bfcl.official()
    generation = package.generation
    monkeypatch.setenv("REMOTE_OPENAI_BASE_URL", base_url)
    args = types.SimpleNamespace(
        temperature=bfcl.TEMPERATURE,
        num_threads=8,
        result_dir=folder / "result",
        run_ids=False,
        allow_overwrite=False,
        skip_server_setup=True,
        num_gpus=1,
        gpu_memory_utilization=0.9,
        backend="vllm",
        local_model_path=str(tokenizer_folder(folder / "model")),
        lora_modules=None,
        enable_lora=False,
        max_lora_rank=None,
        include_input_log=False,
        exclude_state_log=False,
    )
    categories, entries = generation.get_involved_test_entries(list(counts), False)
    chosen = {e["id"] for c, n in counts.items() for e in package.utils.load_dataset_entry(c)[:n]}
    cases = [
        case
        for case in generation.collect_test_cases(args, bfcl.HANDLER_ENTRY, categories, entries)
        if case["id"] in chosen
    ]
    bfcl.fresh_state()
    generation.generate_results(args, bfcl.HANDLER_ENTRY, cases)
    bfcl.fresh_state()
    package.runner.main(
        [bfcl.HANDLER_ENTRY], list(counts), str(folder / "result"), str(folder / "score"), partial_eval=True
    )
    return folder / "score"


def official_verdicts(score_folder: Path, ids: list[str]) -> dict[str, bool]:
    """Each item's verdict from the official score files (an item listed there was graded wrong)."""
    wrong = set()
    for path in (score_folder / bfcl.model_dir()).rglob("*_score.json"):
        wrong |= {json.loads(line).get("id") for line in path.read_text().splitlines()[1:] if line.strip()}
    return {item_id: item_id not in wrong for item_id in ids}
