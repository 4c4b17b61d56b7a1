"""The size limits the code keeps (CONTRIBUTING.md): a Python file of at most 400 lines, a function of at most
60. The files and functions over them when the limits were set are listed with their size then as a ceiling:
they may shrink, never grow, and leave the list once under the limit. Sizes are physical lines as `ruff format`
writes them; a function counts from its `def` to its last line, nested functions and methods included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
FILE_LIMIT = 400
FUNCTION_LIMIT = 60

FILE_CEILINGS = {
    "agent/cache.py": 415,
    "agent/cli/commands.py": 510,
    "agent/cli/options.py": 482,
    "agent/cli/research.py": 433,
    "agent/cli/rl_commands.py": 503,
    "agent/cli/serve.py": 436,
    "agent/cli/train_commands.py": 597,
    "agent/llm.py": 471,
    "agent/local.py": 444,
    "agent/loop.py": 445,
    "agent/reference_pieces.py": 517,
    "agent/setup.py": 556,
    "agent/toolbox.py": 449,
    "agent/trajectory.py": 511,
    "evals/bfcl_run.py": 435,
    "evals/code_formats.py": 425,
    "evals/code_problems.py": 413,
    "evals/code_tests.py": 439,
    "evals/runner.py": 476,
    "tests/fake_openai.py": 561,
    "tests/test_cache.py": 450,
    "tests/test_code_formats.py": 532,
    "tests/test_code_grader.py": 550,
    "tests/test_code_judge.py": 734,
    "tests/test_hardening.py": 500,
    "tests/test_judge.py": 631,
    "tests/test_loop.py": 537,
    "tests/test_real_vllm.py": 489,
    "tests/test_research.py": 433,
    "tests/test_resume.py": 450,
    "tests/test_reward_hacking.py": 456,
    "tests/test_sandbox.py": 690,
    "tests/test_sandbox_jail.py": 831,
    "tests/test_search.py": 514,
    "tests/test_serve.py": 401,
    "tests/test_train.py": 409,
    "tests/test_train_loop.py": 515,
    "tools/sandbox/local.py": 596,
    "tools/search.py": 452,
    "trainer/batches.py": 422,
    "trainer/judge.py": 504,
    "trainer/loop.py": 464,
}

FUNCTION_CEILINGS = {
    "agent/cli/commands.py::evaluate": 74,
    "agent/cli/commands.py::serve": 106,
    "agent/cli/options.py::run_settings": 89,
    "agent/cli/program.py::resume": 61,
    "agent/cli/research.py::research_command": 61,
    "agent/cli/resume.py::settings_for": 63,
    "agent/cli/rl_commands.py::collect": 66,
    "agent/cli/rl_commands.py::judge": 150,
    "agent/cli/train_commands.py::train": 393,
    "agent/loop.py::_final_turn": 73,
    "agent/loop.py::_turns": 67,
    "agent/loop.py::run": 91,
    "agent/setup.py::ready": 68,
    "tests/benchmarks/concurrent_runs.py::measure": 77,
    "tests/benchmarks/vllm_prefix_cache.py::one_run": 66,
    "tests/fake_openai.py::FakeOpenAI._handler": 158,
    "tests/fake_openai.py::FakeOpenAI._handler.Handler.do_POST": 71,
    "tests/test_cluster.py::collect_and_judge_on_two_nodes": 69,
    "tests/test_cluster_lost.py::eval_and_judge_losing_a_node": 89,
    # one name, too long to split
    "tests/test_code_judge.py::test_programs_are_run_against_their_problems_tests_and_rewarded_by_pass_rate_and_form": 91,  # noqa: E501
    "tests/test_collect.py::test_collected_rollouts_are_judged_by_the_judge_command": 72,
    "tests/test_python_server.py::test_a_session_with_state_errors_and_files": 62,
    "tests/test_real_vllm.py::test_collect_groups_concurrently_token_exact_and_from_the_prefix_cache": 85,
    "tests/test_real_vllm.py::test_collect_over_a_pool_of_two_endpoints_keeps_each_run_on_one_and_token_exact": 61,
    "tests/test_sandbox_jail.py::test_a_server_killed_outright_leaves_no_process_and_the_next_one_sweeps_the_rest": 96,
    "tests/test_token_mode.py::test_token_mode_finds_the_tokenizer_at_the_root_the_server_lists_or_takes_one_named": 71,
    "tests/test_train_loop.py::test_dynamic_sampling_draws_questions_until_a_group_is_informative": 62,
    "tests/test_train_loop.py::test_lora_adapters_are_hot_loaded_and_the_next_iteration_samples_from_them": 74,
    "tests/test_train_loop.py::test_the_loop_runs_code_rl_with_the_papers_difficulty_filter": 65,
    "tests/test_train_loop.py::test_the_train_command_runs_the_loop_from_its_flags": 62,
    "tests/test_train_loop_ray.py::loop_with_and_without_ray": 62,
    "tools/sandbox/jail.py::jail_args": 65,
    "trainer/loss.py::policy_loss": 64,
    "trainer/synth.py::synthesize": 74,
    "trainer/train.py::train_step": 68,
}


def python_files() -> list[str]:
    """The repository's Python files: the packages' folders, the tests and the documentation's hooks."""
    folders = ("agent", "evals", "trainer", "tools", "servers", "tests", "docs")
    return sorted(str(path.relative_to(ROOT)) for folder in folders for path in (ROOT / folder).rglob("*.py"))


def function_sizes(tree: ast.AST, prefix: str = "") -> dict[str, int]:
    """Each function's lines, by its dotted name in the module (`Class.method`, `outer.inner`)."""
    sizes: dict[str, int] = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                sizes[name] = max(sizes.get(name, 0), node.end_lineno - node.lineno + 1)
            sizes.update(function_sizes(node, name + "."))
        else:
            sizes.update(function_sizes(node, prefix))
    return sizes


def test_no_file_grows_past_its_limit() -> None:
    sizes = {name: len((ROOT / name).read_text().splitlines()) for name in python_files()}
    over = [
        f"{name}: {lines} lines (limit {FILE_CEILINGS.get(name, FILE_LIMIT)})"
        for name, lines in sizes.items()
        if lines > max(FILE_LIMIT, FILE_CEILINGS.get(name, 0))
    ]
    assert not over, "split these files: " + "; ".join(over)
    done = [name for name, ceiling in FILE_CEILINGS.items() if sizes.get(name, 0) <= FILE_LIMIT]
    assert not done, f"under {FILE_LIMIT} lines now (or gone): take them out of FILE_CEILINGS: {done}"


def test_no_function_grows_past_its_limit() -> None:
    sizes = {
        f"{name}::{function}": lines
        for name in python_files()
        for function, lines in function_sizes(ast.parse((ROOT / name).read_text())).items()
    }
    over = [
        f"{name}: {lines} lines (limit {FUNCTION_CEILINGS.get(name, FUNCTION_LIMIT)})"
        for name, lines in sizes.items()
        if lines > max(FUNCTION_LIMIT, FUNCTION_CEILINGS.get(name, 0))
    ]
    assert not over, "split these functions: " + "; ".join(over)
    done = [name for name in FUNCTION_CEILINGS if sizes.get(name, 0) <= FUNCTION_LIMIT]
    assert not done, f"under {FUNCTION_LIMIT} lines now (or gone): take them out of FUNCTION_CEILINGS: {done}"


def test_a_function_is_measured_from_its_def_to_its_last_line() -> None:
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n\n        return g\n")
    assert function_sizes(tree) == {"A.f": 5, "A.f.g": 2}
