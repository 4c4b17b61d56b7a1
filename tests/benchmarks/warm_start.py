"""The learning benchmark's warm start: the small model is taught the search call by imitation before RL.

SmolLM2-135M-Instruct never calls a tool on its own (0 calls in 175 rollouts, `docs/does-it-learn.md`), so
every GRPO group fails and there is nothing to learn from. A person in that place teaches the calls first:
`train --objective sft` on the passing rollouts of a policy that does call them. Here that policy is a
program, the teacher: it searches for the person the question names, reads the birth year off the search
result whose title is that person, and answers it; it never sees the reference answer. Its rollouts go
through the real commands (collect in token mode against a loopback vLLM that replies with the teacher's
text, the real search server on the local index, judge's exact match), so SFT imitates only the rollouts the
grader passed, and only on questions of the warm-start split: people in neither the loop's training
questions nor the held-out ones.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the loopback vLLM fake

from fake_openai import FakeOpenAI  # noqa: E402

PERSON = re.compile(r"In what year was (.+?) born\?")
BORN = re.compile(r"\((?:born |b\. )?(\d{3,4})\s*[–-]")
"""A summary's description that gives a birth year: "French musician and teacher (1887–1979)"."""
TOOL_TURN = "<|im_start|>tool\n"


def teacher_reply(prompt: str) -> str:
    """The teacher's next reply to a rendered prompt: a search for the person, or the year read off the
    result whose title is the person ("unknown" when none gives one: a failed rollout SFT leaves out)."""
    person = PERSON.findall(prompt)
    if not person:
        return "unknown"
    if TOOL_TURN not in prompt:
        # two results, not the server's ten: every token of a rollout is a token the trainer runs forward and
        # backward on, and on two cores training runs at 60 to 80 tokens a second
        call = {"name": "google_search", "arguments": {"q": person[-1], "num": 2}}
        return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
    result = prompt.rsplit(TOOL_TURN, 1)[1].split("<|im_end|>", 1)[0]
    try:
        organic = json.loads(result).get("organic") or []
    except (ValueError, AttributeError):
        return "unknown"
    for entry in organic:
        found = BORN.search(str(entry.get("snippet") or ""))
        if entry.get("title") == person[-1] and found:
            return found[1]
    return "unknown"


def teacher_server(model: str) -> FakeOpenAI:
    """A loopback vLLM in token mode whose replies are the teacher's, tokenized with the model's tokenizer."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model)

    def policy(request: dict[str, Any]) -> str:
        return teacher_reply(tokenizer.decode(request["prompt"]))

    return FakeOpenAI(
        policy,
        vllm=True,
        tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        stop_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )


def checkpoints(folder: Path) -> list[Path]:
    """The SFT run's checkpoints, one a step, in order."""
    return sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


def warm_start(
    model: str,
    work: Path,
    questions: list[dict[str, str]],
    stage: Callable[[list[str], Path, dict[str, str] | None], float],
    flags: tuple[list[str], list[str], dict[str, str]],
    sft: list[str],
) -> tuple[list[Path], dict[str, Any], float]:
    """Teacher rollouts on `questions`, judged, then SFT of `model` on the passing ones, a checkpoint each
    step: the checkpoints, what the judge found (`passing`, `rollouts`) and the wall time. `stage(command,
    log, env)` runs one command; `flags` are the run flags, the search server's flags and its environment.
    Done once: a second call finds the checkpoints."""
    folder = work / "warm"
    folder.mkdir(exist_ok=True)
    (folder / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    run_flags, search, env = flags
    bin_ = Path(sys.executable).parent / "nanbeige"
    seconds = 0.0
    if not checkpoints(folder / "train"):
        with teacher_server(model) as server:
            collect = [str(bin_), "collect", "--questions", str(folder / "questions.jsonl"), "-G", "1"]
            collect += ["--out", str(folder / "rollouts.jsonl"), "--base-url", server.base_url, "--model", model]
            collect += ["--token-mode", "--concurrency", "4", *search, *run_flags]
            seconds += stage(collect, folder / "collect.log", env)
        judge = [str(bin_), "judge", str(folder / "rollouts.jsonl"), "--out", str(folder / "judged.jsonl")]
        seconds += stage([*judge, "--no-critic"], folder / "judge.log", None)
        train = [str(bin_), "train", "--objective", "sft", "--data", str(folder / "judged.jsonl"), "--model", model]
        train += ["--out", str(folder / "train"), "--off-policy", "--save-every", "1", *sft]
        seconds += stage(train, folder / "train.log", None)
    records = [json.loads(line) for line in (folder / "judged.jsonl").read_text().splitlines()]
    rewards = [record.get("reward") for record in records if record.get("type") == "end"]
    judged = {"passing": sum(1 for r in rewards if r and r > 0), "rollouts": len(rewards)}
    return checkpoints(folder / "train"), judged, seconds
