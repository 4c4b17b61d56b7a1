"""BFCL on the real data shipped in `bfcl-eval` (installed with --no-deps), graded by the package's own AST
checker; and three real `simple` items answered by a real small model (SmolLM2-135M-Instruct) in process."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from nanbeige.agent.scripted import ScriptedLLM
from nanbeige.evals import bfcl
from nanbeige.evals.tasks import LoadError, Task

# Items per category in bfcl-eval 2026.3.23 (BFCL V4).
COUNTS = {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200, "live_simple": 258,
          "live_multiple": 1053, "live_parallel": 16, "live_parallel_multiple": 24}
JSON_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def installed() -> None:
    if importlib.util.find_spec("bfcl_eval") is None:
        pytest.fail(f"bfcl-eval is not installed: {bfcl.INSTALL}")


@pytest.fixture(scope="module")
def simple() -> list[Task]:
    installed()
    return bfcl.load("simple")


def schema_types(schema: dict[str, Any]) -> list[Any]:
    """Every `type` in a parameter schema, at any depth (a parameter may itself be named "type")."""
    found = [schema["type"]] if "type" in schema else []
    for sub in (schema.get("properties") or {}).values():
        found += schema_types(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += schema_types(schema[key])
    return found


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


def ground_truth_calls(task: Task) -> list[tuple[str, dict]]:
    """The calls a perfect model makes, under the tool names it was offered."""
    calls = []
    for call in task.metadata["ground_truth"]:
        (name, params), = call.items()
        calls.append((bfcl.tool_name(name), {p: first_choice(o) for p, o in params.items()
                                             if first_choice(o) is not None}))
    return calls


# ---------------------------------------------------------------- loading and tools


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_each_category_loads_and_its_functions_become_tools(category: str) -> None:
    installed()
    tasks = bfcl.load(category)
    assert len(tasks) == COUNTS[category]
    assert len({t.id for t in tasks}) == len(tasks)
    for task in tasks:
        assert task.question.strip() and task.level == category
        assert task.metadata["category"] == category and task.metadata["functions"]
        assert json.loads(task.answer) == task.metadata["ground_truth"]
        tools = bfcl.tools_for(task.metadata["functions"])
        types = [t for tool in tools for t in schema_types(tool["function"]["parameters"])]
        assert set(types) <= JSON_SCHEMA_TYPES  # no "dict", "float", "tuple" or "any" left
        names = [t["function"]["name"] for t in tools]
        assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) for name in names)
        assert sorted(bfcl.name_map(task.metadata["functions"]).values()) == \
            sorted(f["name"] for f in task.metadata["functions"])


def test_the_first_turn_is_kept_whole_system_message_included() -> None:
    installed()
    task = next(t for t in bfcl.load("live_simple") if t.id == "live_simple_58-27-0")
    messages = task.metadata["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert task.metadata["system"] == messages[0]["content"]
    assert task.question == messages[1]["content"] == "list movies in Mumbai?"


def test_bfcl_types_become_json_schema_at_every_depth() -> None:
    function = {"name": "geo.route.plan", "description": "Plan a route.", "parameters": {
        "type": "dict", "required": ["stops"], "properties": {
            "stops": {"type": "array", "items": {"type": "dict", "properties": {
                "at": {"type": "tuple", "items": {"type": "float"}}, "note": {"type": "any"}}}},
            "options": {"type": "dict", "properties": {"speed": {"type": "float", "default": 1.5}}}}}}
    (tool,) = bfcl.tools_for([function])
    assert tool["function"]["name"] == "geo_route_plan"
    assert tool["function"]["description"] == "Plan a route. Note that the provided function is in Python 3 syntax."
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["stops"]
    stop = parameters["properties"]["stops"]["items"]
    assert stop["type"] == "object"
    assert stop["properties"]["at"] == {"type": "array", "items": {"type": "number"}}
    assert stop["properties"]["note"] == {}  # any value: untyped
    assert parameters["properties"]["options"]["properties"]["speed"] == {"type": "number", "default": 1.5}
    assert function["parameters"]["type"] == "dict"  # the task's own schema is left as it was


def test_unknown_categories_and_a_missing_package_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LoadError, match="known: simple_python, multiple, .*live_parallel_multiple"):
        bfcl.load("irrelevance")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, package=None: None if name == "bfcl_eval" else real_find_spec(name, package))
    with pytest.raises(LoadError, match=re.escape("pip install --no-deps bfcl-eval==2026.3.23")):
        bfcl.load("simple")


def test_a_data_folder_of_the_same_layout_is_read(tmp_path: Path) -> None:
    installed()
    source = bfcl.package_data()
    name = "BFCL_v4_parallel.json"
    (tmp_path / "possible_answer").mkdir()
    for part in ("", "possible_answer/"):
        lines = (source / f"{part}{name}").read_text(encoding="utf-8").splitlines()[:2]
        (tmp_path / f"{part}{name}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert [t.id for t in bfcl.load("parallel", tmp_path)] == ["parallel_0", "parallel_1"]
    (tmp_path / "possible_answer" / name).unlink()
    with pytest.raises(LoadError, match="possible_answer"):
        bfcl.load("parallel", tmp_path)


# ---------------------------------------------------------------- grading by the official checker


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_the_ground_truth_is_graded_correct(category: str) -> None:
    installed()
    for task in bfcl.load(category)[:3]:
        verdict = bfcl.grade(task, ground_truth_calls(task))
        assert (verdict.correct, verdict.grader, verdict.reason) == (True, "bfcl-ast", ""), task.id


def test_dotted_names_are_graded_under_their_original_names(simple: list[Task]) -> None:
    task = next(t for t in simple if "." in t.metadata["functions"][0]["name"])
    calls = ground_truth_calls(task)
    assert "." not in calls[0][0]  # the model calls the tool name it was offered
    assert bfcl.grade(task, calls).correct is True
    assert json.loads(bfcl.grade(task, calls).extracted)[0].keys() == {task.metadata["functions"][0]["name"]}


def test_wrong_missing_and_misnamed_calls_are_wrong_with_the_checkers_reason(simple: list[Task]) -> None:
    task = simple[0]  # calculate_triangle_area(base=10, height=5, unit="units")
    ((name, arguments),) = ground_truth_calls(task)
    wrong = bfcl.grade(task, [(name, arguments | {"base": 11})])
    assert wrong.correct is False and "Invalid value for parameter 'base'" in wrong.reason
    missing = bfcl.grade(task, [])
    assert missing.correct is False and "Wrong number of functions" in missing.reason
    misnamed = bfcl.grade(task, [("calculate_area", arguments)])
    assert misnamed.correct is False and "not found in model output" in misnamed.reason


def test_parallel_calls_are_matched_in_any_order() -> None:
    installed()
    task = bfcl.load("parallel")[0]
    calls = ground_truth_calls(task)
    assert len(calls) > 1
    assert bfcl.grade(task, calls[::-1]).correct is True
    assert bfcl.grade(task, calls[:-1]).correct is False


def test_the_checker_is_loaded_without_leaving_a_stand_in_registry(simple: list[Task]) -> None:
    bfcl.grade(simple[0], [])
    assert "bfcl_eval.constants.model_config" not in sys.modules


# ---------------------------------------------------------------- running a task


@pytest.mark.anyio
async def test_a_task_is_one_call_whose_tool_calls_are_read_back(simple: list[Task]) -> None:
    task = simple[0]
    ((name, arguments),) = ground_truth_calls(task)
    block = json.dumps({"name": name, "arguments": arguments})
    llm = ScriptedLLM([f"<tool_call>{block}</tool_call>"])
    calls, reply = await bfcl.run_bfcl_task(task, llm)
    assert calls == [(name, arguments)] and block in reply
    assert llm.calls == [task.metadata["messages"]]  # the item's own messages, nothing added
    assert bfcl.grade(task, calls).correct is True


@pytest.mark.slow
@pytest.mark.anyio
async def test_nanbeige_eval_scores_three_real_items_with_a_real_small_model_in_process(tmp_path: Path) -> None:
    """The whole pipeline: the setup layer loads SmolLM2 in process, each item is one call in the tool-call
    dialect, the package's checker grades it, and the report counts it. The score is whatever it is."""
    from test_smollm2 import GGUF, smollm2_folder

    from nanbeige.agent.config import BackendConfig, RunSettings, ToolsConfig
    from nanbeige.agent.llm import LLMConfig
    from nanbeige.evals.benchmarks import BENCHMARKS
    from nanbeige.evals.runner import EvalConfig, evaluate, read_results

    settings = RunSettings(llm=LLMConfig(model=str(smollm2_folder()), temperature=0.0, repetition_penalty=1.0,
                                         max_tokens=48),
                           backend=BackendConfig(backend="transformers", gguf_file=GGUF),
                           tools=ToolsConfig(default_servers=True))  # BFCL turns the built-in servers off
    config = EvalConfig(bench=BENCHMARKS["bfcl-simple-python"], data=None, out=tmp_path / "out", k=1, limit=3)
    report = await evaluate(config, settings, notice=lambda text: None)
    rows = read_results(tmp_path / "out")
    assert sorted(row["task_id"] for row in rows) == sorted(task.id for task in bfcl.load("simple_python")[:3])
    for row in rows:
        assert row["grader"] == "bfcl-ast" and row["correct"] in (True, False), row
        assert row["correct"] or row["reason"]  # the checker says why it is wrong
        assert isinstance(json.loads(row["prediction"]), list)  # the calls as BFCL's model_output
    assert report["tasks"] == 3 and report["levels"] == {"simple_python": report["levels"]["simple_python"]}
