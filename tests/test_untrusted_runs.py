"""What an earlier run left is untrusted too: an eval's out folder, rollouts and judged files that a
killed writer cut mid-line, a trajectory to resume, a training run's checkpoints and metrics. A line
torn by a kill (the last one, as our writers append) is skipped, saying so, and its work done again
while every whole line is kept; anything else that does not fit is one line naming the file and its
line, a non-zero exit, and nothing written. A file a flag names in a folder that cannot be made is one
line too, before the model is asked. Commands run in this process, against loopback models."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from conftest import TEST_SERVER
from fake_openai import FakeOpenAI, mcp_answer
from reference_tree import make_reference
from test_untrusted_inputs import assert_no_crash, assert_refused, files_in, jsonl, nanbeige, rollout

from nanbeige.agent.trajectory.trajectory_file import load_trajectories

TASKS = [
    {"task_id": f"t{n}", "Question": f"What is {n}+{n}?", "Level": 1, "Final answer": "4", "file_name": ""}
    for n in (1, 2, 3)
]


def torn(path: Path) -> bytes:
    """Cut the file's last line in half, as a writer killed mid-line leaves it; returns the whole lines kept."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    return b"".join(lines[:-1])


# ---------------------------------------------------------------- eval: its out folder


def run_eval(tmp_path: Path, server: FakeOpenAI) -> object:
    data = tmp_path / "metadata.jsonl"
    if not data.exists():
        data.write_bytes(jsonl(*TASKS))
    return nanbeige(
        "eval",
        "gaia",
        "--data",
        data,
        "--out",
        tmp_path / "out",
        "--grader",
        "official",
        "-k",
        "1",
        "--concurrency",
        "1",
        "--base-url",
        server.base_url,
        "--no-default-servers",
    )


def test_an_eval_killed_mid_line_resumes_keeping_every_whole_result(tmp_path: Path) -> None:
    results = tmp_path / "out" / "results.jsonl"
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        assert run_eval(tmp_path, server).exit_code == 0
        kept = torn(results)
        resumed = run_eval(tmp_path, server)
    assert_no_crash(resumed)
    assert resumed.exit_code == 0, resumed.output
    assert f"{results}:3: the last line is cut short" in resumed.output
    assert "resuming: 2 of 3 runs already done" in resumed.output
    assert results.read_bytes().startswith(kept)  # the whole lines, byte for byte
    rows = [json.loads(line) for line in results.read_bytes().splitlines()]
    assert sorted(row["task_id"] for row in rows) == ["t1", "t2", "t3"]  # the torn run done again, once


RESULTS = {
    "malformed JSON mid-file": b'{"task_id": "t1", "run": 0, "corr\n',
    "a list where the task id belongs": json.dumps({"task_id": ["t1"], "run": 0}).encode() + b"\n",
    "text where the run number belongs": json.dumps({"task_id": "t1", "run": "0"}).encode() + b"\n",
    "a list where a row belongs": b"[1, 2]\n",
}


@pytest.mark.parametrize("case", RESULTS)
def test_an_eval_folder_with_a_bad_result_line_is_refused_and_left_as_it_is(tmp_path: Path, case: str) -> None:
    results = tmp_path / "out" / "results.jsonl"
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        assert run_eval(tmp_path, server).exit_code == 0
        lines = results.read_bytes().splitlines(keepends=True)
        results.write_bytes(lines[0] + RESULTS[case] + lines[2])  # the second run's line replaced
        before = files_in(tmp_path)
        result = run_eval(tmp_path, server)
    assert_refused(result, results, 2)
    assert files_in(tmp_path) == before


def test_an_eval_folder_whose_manifest_is_not_an_object_is_refused(tmp_path: Path) -> None:
    manifest = tmp_path / "out" / "eval.json"
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        assert run_eval(tmp_path, server).exit_code == 0
        manifest.write_text('["gaia"]\n')
        before = files_in(tmp_path)
        result = run_eval(tmp_path, server)
        report = nanbeige("eval", "report", tmp_path / "out")
    assert_refused(result, manifest, None, "not an eval")
    assert_refused(report, manifest, None, "not an eval")
    assert files_in(tmp_path) == before


# ---------------------------------------------------------------- eval: links in its out folder

VICTIM = b"the user's own file, which no eval may touch\n"


def link_out(link: Path, victim: Path, content: bytes = VICTIM) -> None:
    """Make `link` (a file or folder of a finished eval) a symbolic link to `victim`, outside the folder."""
    if victim.suffix:
        victim.write_bytes(content)
    else:
        victim.mkdir()
        (victim / "data_overall.csv").write_bytes(content)
    if link.is_dir():
        for path in sorted(link.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        link.rmdir()
    else:
        link.unlink()
    link.symlink_to(victim)


def victim_files(victim: Path) -> dict[str, bytes]:
    return {".": victim.read_bytes()} if victim.is_file() else files_in(victim)


# A file of an eval with one run of three done made a link, and how much of the file the linked one holds.
GENERIC_LINKS = {
    "report.json (rewritten)": ("report.json", 0),
    "trajectories.jsonl (appended to)": ("trajectories.jsonl", 0),
    "results.jsonl (its first row: the other runs would be appended)": ("results.jsonl", 1),
    "eval.json (the whole manifest: the eval would be resumed)": ("eval.json", None),
}


@pytest.mark.parametrize("case", GENERIC_LINKS)
@pytest.mark.parametrize("command", ["eval --out", "eval report"])
def test_a_link_in_an_eval_folder_is_refused_and_the_file_it_points_to_is_left_alone(
    tmp_path: Path, case: str, command: str
) -> None:
    name, lines = GENERIC_LINKS[case]
    out, victim = tmp_path / "out", tmp_path / "elsewhere.json"
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        assert run_eval(tmp_path, server).exit_code == 0
        kept = b"".join((out / name).read_bytes().splitlines(keepends=True)[:lines])
        (out / "results.jsonl").write_bytes((out / "results.jsonl").read_bytes().splitlines(keepends=True)[0])
        link_out(out / name, victim, kept if lines != 0 else VICTIM)
        before = victim_files(victim)
        result = run_eval(tmp_path, server) if command == "eval --out" else nanbeige("eval", "report", out)
    assert victim_files(victim) == before
    assert_refused(result, out / name, None, "is a symbolic link")


def bfcl_folder(tmp_path: Path, server: FakeOpenAI) -> object:
    return nanbeige(
        "eval", "bfcl-simple-python", "--limit", "2", "--base-url", server.base_url, "--out", tmp_path / "out"
    )


BFCL_LINKS = {  # a part of a finished BFCL eval made a link: a folder, or a file
    "its score folder (stale tables deleted, score files written)": ("bfcl/score", "elsewhere"),
    "a result file (rewritten, torn lines dropped)": ("bfcl/result/*/*/*_result.json", "elsewhere.json"),
    "its report (rewritten)": ("report.json", "elsewhere.json"),
}


@pytest.mark.parametrize("case", BFCL_LINKS)
@pytest.mark.parametrize("command", ["eval --out", "eval report"])
def test_a_link_in_a_bfcl_folder_is_refused_and_what_it_points_to_is_left_alone(
    tmp_path: Path, case: str, command: str
) -> None:
    from bfcl_oracle import script_for

    pattern, outside = BFCL_LINKS[case]
    out, victim = tmp_path / "out", tmp_path / outside
    with FakeOpenAI(script_for({"simple_python": 2}), vllm=True) as server:
        made = bfcl_folder(tmp_path, server)
        assert made.exit_code == 0, made.output
        [link] = out.glob(pattern)
        link_out(link, victim)
        before = victim_files(victim)
        result = bfcl_folder(tmp_path, server) if command == "eval --out" else nanbeige("eval", "report", out)
    assert victim_files(victim) == before
    assert_refused(result, link, None, "is a symbolic link")


# ---------------------------------------------------------------- collect and judge: their out files


def test_a_collect_killed_mid_line_resumes_keeping_every_whole_rollout(tmp_path: Path) -> None:
    questions, out = tmp_path / "questions.jsonl", tmp_path / "rollouts.jsonl"
    questions.write_bytes(jsonl({"id": "q1", "question": "What is 2+2?", "answer": "4"}))
    command = [
        "collect",
        "--questions",
        questions,
        "-G",
        "3",
        "--out",
        out,
        "--concurrency",
        "1",
        "--no-default-servers",
        "--allow-inexact",
    ]
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        assert nanbeige(*command, "--base-url", server.base_url).exit_code == 0
        kept = torn(out)  # the third rollout's end line
        resumed = nanbeige(*command, "--base-url", server.base_url)
    assert_no_crash(resumed)
    assert resumed.exit_code == 0, resumed.output
    assert "the last line is cut short" in resumed.output and "resuming: 2 of 3 rollouts" in resumed.output
    assert out.read_bytes().startswith(kept)
    finished = [t for t in load_trajectories(out) if t.finished]
    assert sorted(t.rollout_index for t in finished) == [0, 1, 2]


def test_a_judge_killed_mid_line_resumes_keeping_every_whole_trajectory(tmp_path: Path) -> None:
    rollouts, judged = tmp_path / "rollouts.jsonl", tmp_path / "judged.jsonl"
    rollouts.write_bytes(jsonl(*rollout("a"), *rollout("b", answer="5"), *rollout("c")))
    assert nanbeige("judge", rollouts, "--out", judged, "--no-critic", "--concurrency", "1").exit_code == 0
    kept = torn(judged)  # the last trajectory's end line
    resumed = nanbeige("judge", rollouts, "--out", judged, "--no-critic")
    assert_no_crash(resumed)
    assert resumed.exit_code == 0, resumed.output
    assert f"{judged}:9: the last line is cut short" in resumed.output
    assert "1 trajectory judged" in resumed.output and "2 were already there" in resumed.output
    assert judged.read_bytes().startswith(kept)
    rewards = {t.id: t.reward for t in load_trajectories(judged, warn=lambda text: None)}
    assert rewards == {"a": 1.0, "b": 0.0, "c": 1.0}


# ---------------------------------------------------------------- resume: a trajectory file


def asked(tmp_path: Path, server: FakeOpenAI) -> Path:
    path = tmp_path / "run.jsonl"
    result = nanbeige("ask", "q", "--base-url", server.base_url, "--no-default-servers", "--trajectory", path)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    path.write_bytes(jsonl(*records[:-1]))  # killed before its end line: resumable
    return path


START_FIELDS = {
    "text where a limit's number belongs": ("limits", "max_turns", "many"),
    "a list where a limit's number belongs": ("limits", "keep_tool_results", [5]),
    "text where the temperature belongs": ("sampling", "temperature", "hot"),
    "an object where the server's address belongs": ("limits", "server", {"url": "http://127.0.0.1:9"}),
}


@pytest.mark.parametrize("case", START_FIELDS)
def test_a_start_record_with_a_setting_of_the_wrong_type_is_not_resumed(tmp_path: Path, case: str) -> None:
    where, name, value = START_FIELDS[case]
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        path = asked(tmp_path, server)
        records = [json.loads(line) for line in path.read_bytes().splitlines()]
        records[0][where][name] = value
        path.write_bytes(jsonl(*records))
        result = nanbeige("resume", path, "--base-url", server.base_url, "--no-default-servers")
    assert_refused(result, path, 1, name)
    assert path.read_bytes() == jsonl(*records)


def test_a_resume_record_with_a_wall_time_that_is_not_a_number_is_skipped_saying_so(tmp_path: Path) -> None:
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        path = asked(tmp_path, server)
        start = json.loads(path.read_bytes().splitlines()[0])
        path.write_bytes(
            path.read_bytes()
            + jsonl({"type": "resume", "trajectory_id": start["id"], "num_turns": 0, "wall_s": "forever"})
        )
        result = nanbeige("resume", path, "--base-url", server.base_url, "--no-default-servers")
    assert_no_crash(result)
    assert f"{path}:4: skipped the resume record" in result.output and result.exit_code == 0, result.output


def test_a_run_killed_mid_line_is_resumed_saying_its_last_line_was_skipped(tmp_path: Path) -> None:
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        path = asked(tmp_path, server)
        kept = torn(path)  # its only turn, cut
        result = nanbeige("resume", path, "--base-url", server.base_url, "--no-default-servers")
    assert_no_crash(result)
    assert result.exit_code == 0 and f"{path}:3: the last line is cut short" in result.output, result.output
    assert path.read_bytes().startswith(kept)
    [trajectory] = load_trajectories(path, warn=lambda text: None)
    assert trajectory.answer == "4" and len(trajectory.turns) == 2  # the cut turn made again


def test_a_reference_checkout_named_in_a_trajectory_file_is_never_run(tmp_path: Path) -> None:
    """Reading a checkout runs its prompt functions: a trajectory file naming one (a crafted folder beside
    it) must not choose code to run. The resume asks for --reference instead, and runs nothing."""
    checkout = make_reference(tmp_path / "checkout")
    prompts = checkout / "apps/miroflow-agent/src/utils/prompt_utils.py"
    ran = tmp_path / "ran"
    prompts.write_text(f"import pathlib\npathlib.Path({str(ran)!r}).write_text('ran')\n" + prompts.read_text())
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        path = asked(tmp_path, server)
        records = [json.loads(line) for line in path.read_bytes().splitlines()]
        identity = {"commit": None, "sha256": "0" * 64, "python": "3.12"}
        records[0]["limits"]["reference"], records[0]["reference"] = {"path": str(checkout), **identity}, identity
        path.write_bytes(jsonl(*records))
        result = nanbeige("resume", path, "--base-url", server.base_url, "--no-default-servers")
    assert_no_crash(result)
    assert result.exit_code == 2 and "resume it with --reference PATH" in result.output
    assert str(checkout) in result.output
    assert not ran.exists() and path.read_bytes() == jsonl(*records)


# ---------------------------------------------------------------- files named by flags, in folders that cannot be made

NOWHERE = Path("/proc/nowhere")  # /proc takes no new entry, even from root, whom permission bits let through
QUESTIONS = [{"id": "q1", "question": "What is 2+2?", "answer": "4"}]
WRITES = {  # the command, and the file it was told to write
    "ask --trajectory": (["ask", "q", "--trajectory", NOWHERE / "t.jsonl"], NOWHERE / "t.jsonl"),
    "ask --cache": (
        ["ask", "q", "--trajectory", "{tmp}/t.jsonl", "--mcp", "{testkit}", "--cache", NOWHERE / "c.sqlite"],
        NOWHERE / "c.sqlite",
    ),
    "research --trajectory": (["research", "q", "--trajectory", NOWHERE / "t.jsonl"], NOWHERE / "t.jsonl"),
    "research --report": (
        ["research", "q", "--trajectory", "{tmp}/t.jsonl", "--report", NOWHERE / "r.md"],
        NOWHERE / "r.md",
    ),
    "eval --out": (
        ["eval", "gaia", "--data", "{tmp}/metadata.jsonl", "--out", NOWHERE / "out", "--grader", "official", "-k", "1"],
        NOWHERE / "out",
    ),
    "collect --out": (
        ["collect", "--questions", "{tmp}/questions.jsonl", "-G", "1", "--allow-inexact", "--out", NOWHERE / "r.jsonl"],
        NOWHERE / "r.jsonl",
    ),
}


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("case", WRITES)
def test_a_file_whose_folder_cannot_be_made_is_one_line_before_the_model_is_asked(tmp_path: Path, case: str) -> None:
    command, path = WRITES[case]
    (tmp_path / "metadata.jsonl").write_bytes(jsonl(*TASKS))
    (tmp_path / "questions.jsonl").write_bytes(jsonl(*QUESTIONS))
    testkit = "testkit=" + shlex.join(TEST_SERVER)
    args = [str(arg).format(tmp=tmp_path, testkit=testkit) for arg in command]
    with FakeOpenAI([], default=mcp_answer("4")) as server:
        result = nanbeige(*args, "--base-url", server.base_url, "--no-default-servers")
        assert server.requests == []  # the model was never asked
    assert_no_crash(result)
    assert result.exit_code != 0, result.output
    [error] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert str(path) in error and "cannot" in error, error
    assert files_in(tmp_path).keys() == {"metadata.jsonl", "questions.jsonl"}  # nothing left behind


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_judge_out_in_a_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(jsonl(*rollout("a")))
    result = nanbeige("judge", rollouts, "--out", NOWHERE / "judged.jsonl", "--no-critic")
    assert_refused(result, NOWHERE / "judged.jsonl", None, "cannot make /proc/nowhere")
