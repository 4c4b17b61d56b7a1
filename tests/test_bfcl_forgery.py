"""The code a model writes in a BFCL item runs in the item's process, beside the package's own: it can write
into the exchange with the host, read what the sandbox holds and shape what grading runs. The host answers
only what the package could have asked, records only the replies it served, hides the package's answers from
the items, and grading runs only calls of the package's functions with literal arguments. Each attack runs
through `nanbeige eval` in a real jail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from bfcl_oracle import Replies, block, multi_turn_calls, script_for
from fake_openai import FakeOpenAI
from fake_site import Site
from test_bfcl_jail import eval_command, one_item

from nanbeige.evals import bfcl

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bwrap, the sandbox's jail")


def forging(script: Replies, item_id: str, code: str) -> object:
    """The scripted model, but the first reply of `item_id` is a call whose argument name runs `code` in the
    sandbox (as Python, written in hex so that any text fits in a name), where the package evaluates it."""
    attack = {"name": "ls", "arguments": {f"a=exec(bytes.fromhex('{code.encode().hex()}').decode()),b": 1}}
    question = script.first_user(script.items[item_id][0])

    def model(request: dict) -> str:
        if question in request["prompt"] and "<tool_response>" not in request["prompt"]:
            return block(attack)
        return script(request)

    return model


def result_lines(out: Path) -> dict[str, dict]:
    lines = [json.loads(x) for path in (out / "bfcl" / "result").rglob("*.json") for x in path.open()]
    return {line["id"]: line for line in lines}


def test_a_question_the_models_own_code_writes_is_not_answered(tmp_path: Path) -> None:
    """The model's code runs in the item's process, beside the package's: it can write any question into the
    exchange. The host answers a page or a search only for a call the model made in the reply it just gave;
    this one it never made, so the page is not fetched (though the operator allowed loopback pages), and the
    item, whose sandbox broke the exchange, scores nothing."""
    script = script_for({"multi_turn_base": 1})
    with Site() as site:
        forged = site.url("/forged")
        code = f"import bfcl_inside\nbfcl_inside.Host.ask({{'fetch': {{'url': {forged!r}, 'mode': 'raw'}}}})"
        with FakeOpenAI(forging(script, "multi_turn_base_0", code), vllm=True) as server:
            ours = one_item(
                "bfcl-multi-turn-base", server.base_url, tmp_path / "out", env={"NANBEIGE_ALLOW_PRIVATE_URLS": "1"}
            )
        paths = [path for path, _ in site.requests]
    assert ours.returncode == 0, ours.stderr
    assert "/forged" not in paths
    line = result_lines(tmp_path / "out")["multi_turn_base_0"]
    assert line["result"].startswith("Error during inference: ") and "asked" in line["result"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["wrong_ids"] == ["multi_turn_base_0"]


def test_a_result_line_the_models_own_code_forges_scores_nothing(tmp_path: Path) -> None:
    """The model's code can read the package's ground truth in the sandbox and send a result line built from
    it, as if the item were done. The host records only the replies it served: the line is refused and the
    item is wrong, as the model's own replies make it."""
    script = script_for({"multi_turn_base": 2})
    entry, truth, _ = script.items["multi_turn_base_1"]
    right = [
        ["\n".join(block(c) for c in multi_turn_calls(calls, entry["function"])), "Done."] if calls else ["Which?"]
        for calls in truth
    ]
    counts = [[0] * len(turn) for turn in right]
    line = {"id": "multi_turn_base_1", "result": right, "inference_log": [], "latency": counts}
    line |= {"input_token_count": counts, "output_token_count": counts}
    code = (
        "import bfcl_inside, json, threading\n"
        f"bfcl_inside.Host.questions.put({{'done': json.loads({json.dumps(line)!r}), 'files': {{}}}})\n"
        "threading.Event().wait()\n"
    )
    with FakeOpenAI(forging(script, "multi_turn_base_1", code), vllm=True) as server:
        ours = eval_command(
            "bfcl-multi-turn-base", "--limit", "2", "--base-url", server.base_url, "--out", str(tmp_path / "out")
        )
    assert ours.returncode == 0, ours.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["wrong_ids"] == ["multi_turn_base_1"]
    assert result_lines(tmp_path / "out")["multi_turn_base_1"]["result"] != right


def test_the_models_code_cannot_read_the_packages_answers_while_its_item_runs(tmp_path: Path) -> None:
    """Generating an item needs none of the package's answers: its sandbox shows them as an empty folder, so
    the model's code there cannot read them to feed its model through a tool result. Grading, which needs
    them, still has them: the item gets its official verdict."""
    script = script_for({"multi_turn_base": 1})
    code = (
        "import os, bfcl_eval\n"
        "folder = os.path.join(os.path.dirname(bfcl_eval.__file__), 'data', 'possible_answer')\n"
        "raise RuntimeError(f'answers: {sorted(os.listdir(folder))[:1]}')\n"
    )
    with FakeOpenAI(forging(script, "multi_turn_base_0", code), vllm=True) as server:
        ours = eval_command(
            "bfcl-multi-turn-base", "--limit", "1", "--base-url", server.base_url, "--out", str(tmp_path / "out")
        )
        prompts = "".join(request["prompt"] for request in server.requests)
    assert ours.returncode == 0, ours.stderr
    assert "answers: []" in prompts and "BFCL_v4" not in prompts.split("answers: ", 1)[1][:40]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["wrong_ids"] == ["multi_turn_base_0"]  # graded: its first turn made no right call


def test_a_call_built_to_change_the_checker_is_not_run_when_grading(tmp_path: Path) -> None:
    """The official runner `eval()`s each multi-turn call in the process that checks them: a call whose
    code replaces the checker makes every item graded after it right (here the second, whose model never
    answers). Such a call is not run when grading; a call of the item's own functions is, as upstream."""
    script = script_for({"multi_turn_base": 2})
    code = (
        "import sys\n"
        "runner = sys.modules.get('bfcl_eval.eval_checker.eval_runner')\n"
        "if runner is not None:\n"
        "    runner.multi_turn_checker = lambda *a, **k: {'valid': True}\n"
    )
    with FakeOpenAI(forging(script, "multi_turn_base_0", code), vllm=True) as server:
        ours = eval_command(
            "bfcl-multi-turn-base", "--limit", "2", "--base-url", server.base_url, "--out", str(tmp_path / "out")
        )
    assert ours.returncode == 0, ours.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["wrong_ids"] == ["multi_turn_base_0", "multi_turn_base_1"]


def test_what_grading_runs_is_a_call_of_the_packages_functions_with_literal_arguments() -> None:
    from nanbeige.evals.bfcl_jail import runs_only_the_package

    bfcl.official()
    for call in ("cd(folder='document')", "sort(file_name='report.pdf')", "ls(a=[1, {'b': (2, 3.5)}], c=None)"):
        assert runs_only_the_package(call), call
    for call in (
        "ls(a=__import__('os').system('id'),b=1)",  # code in an argument's name
        "open(file='score.json', mode='w')",  # a builtin
        "execute_multi_turn_func_call(func_call_list=[])",  # the package's executor itself
        "method(x=1)",  # a local of the executor
        "ls(**{'a': 1})",
        "gorillafilesystem_instance.ls(a=1)",
        "ls(a=1) or ls(b=2)",
    ):
        assert not runs_only_the_package(call), call
