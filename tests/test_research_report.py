"""`nanbeige research`'s report: which pages it cites (only scrapes that returned an extract, each page once,
passages the run let go of read back from the trajectory file), what it never makes of the model's text (links,
images, keys), and the report paths and flags refused before a run starts. The attempts themselves are
`tests/test_research.py`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from test_research import NANBEIGE, QUESTION

from nanbeige.agent.cli import research_report as report
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Trajectory, Turn
from nanbeige.agent.trajectory.trajectory_file import TrajectoryWriter


def test_open_without_a_report_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [NANBEIGE, "research", QUESTION, "--open"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 2
    assert "--open opens the report: pass --report PATH too" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_a_report_path_that_would_lose_something_is_refused_before_the_run(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    for target, why in ((tmp_path / "run.jsonl", "is the trajectory file"), (tmp_path / "pipe", "not a regular file")):
        result = subprocess.run(
            [NANBEIGE, "research", QUESTION, "--trajectory", str(tmp_path / "run.jsonl"), "--report", str(target)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
        )
        assert result.returncode == 2 and why in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # nothing started, nothing written


def test_the_markdown_report_makes_no_link_or_image_of_the_models_text(tmp_path: Path) -> None:
    from nanbeige.agent.cli.research import Research
    from nanbeige.agent.cli.research_command import write_report

    reply = "See ![pixel](http://tracker.example/p.png), [click](javascript:alert(1)) and [1]: http://x [2]."
    trajectory = Trajectory(question=QUESTION, answer="42", stop_reason="answered")
    trajectory.turns.append(Turn(index=0, assistant={"role": "assistant", "content": reply}))
    write_report(tmp_path / "report.md", Research(QUESTION, [trajectory]), tmp_path / "none.jsonl", False)
    text = (tmp_path / "report.md").read_text()
    assert "![pixel](" not in text and "[click](" not in text and "[1]:" not in text
    assert "!\\[pixel\\](" in text and "\\[click\\](" in text and " [2]." in text  # shown as written, linking nothing


def test_keys_are_taken_out_of_the_report_before_it_is_escaped(tmp_path: Path) -> None:
    from nanbeige.agent.cli.console import hide
    from nanbeige.agent.cli.research import Research
    from nanbeige.agent.cli.research_command import write_report

    key = 'key<with>&amp"1'
    trajectory = Trajectory(question=QUESTION, answer=f"the key is {key}", stop_reason="answered")
    trajectory.turns.append(Turn(index=0, assistant={"role": "assistant", "content": f"It is {key}. \\boxed{{x}}"}))
    hide([key])
    try:
        for name in ("report.md", "report.html"):
            write_report(tmp_path / name, Research(QUESTION, [trajectory]), tmp_path / "none.jsonl", False)
            text = (tmp_path / name).read_text()
            assert "REDACTED" in text and "&lt;with&gt;" not in text and "with&gt;" not in text
    finally:
        hide([])


def scrape(url: str, result: str, is_error: bool = False) -> Turn:
    call = ToolCall(
        server="jina_scrape_llm_summary",
        name="scrape_and_extract_info",
        arguments={"url": url, "info_to_extract": "facts"},
    )
    return Turn(
        index=0,
        assistant={"role": "assistant", "content": "<think>read</think>"},
        tool_calls=[call],
        tool_results=[ToolResult(text=result, is_error=is_error)],
    )


def test_only_scrapes_that_returned_an_extract_are_cited_and_a_page_read_twice_is_cited_once() -> None:
    page = {"success": True, "url": "https://a.example/x", "extracted_info": "First fact.", "error": ""}
    trajectory = Trajectory(
        question=QUESTION,
        turns=[
            scrape("https://a.example/x", json.dumps(page)),
            scrape("https://b.example/failed", json.dumps({"success": False, "extracted_info": "", "error": "404"})),
            scrape("https://c.example/timeout", "Tool call timed out", is_error=True),
            scrape("https://d.example/empty", json.dumps({**page, "extracted_info": "  "})),
            scrape("https://a.example/x/", json.dumps({**page, "extracted_info": "Second fact."})),
            scrape("https://e.example/plain", "Plain text from a scrape server of your own."),
        ],
        answer="42",
        stop_reason="answered",
    )
    built = report.build(QUESTION, [trajectory], "42")
    assert [(c.url, c.passages) for c in built.citations] == [
        ("https://a.example/x", ["First fact.", "Second fact."]),
        ("https://e.example/plain", ["Plain text from a scrape server of your own."]),
    ]


def test_the_report_reads_passages_the_run_let_go_of_from_the_trajectory_file(tmp_path: Path) -> None:
    from nanbeige.agent.cli.research import Research
    from nanbeige.agent.cli.research_command import write_report
    from nanbeige.agent.run.loop import RELEASED

    extract = json.dumps({"success": True, "url": "https://example.com/a", "extracted_info": "Mars: 687 days."})
    trajectory = Trajectory(question=QUESTION, answer="1374", stop_reason="answered")
    trajectory.turns.append(
        Turn(
            index=0,
            assistant={"role": "assistant", "content": "Reading."},
            tool_calls=[
                ToolCall(
                    "jina_scrape_llm_summary",
                    "scrape_and_extract_info",
                    {"url": "https://example.com/a", "info_to_extract": "year"},
                )
            ],
            tool_results=[ToolResult(extract)],
        )
    )
    writer = TrajectoryWriter(tmp_path / "run.jsonl")
    writer.start(trajectory)
    writer.turn(trajectory, trajectory.turns[0])
    writer.end(trajectory)
    writer.close()
    trajectory.turns[0].tool_results[0].text = RELEASED  # as a long run holds it once out of the model's view
    write_report(tmp_path / "report.md", Research(QUESTION, [trajectory]), tmp_path / "run.jsonl", False)
    report = (tmp_path / "report.md").read_text()
    assert "https://example.com/a" in report and "Mars: 687 days." in report and RELEASED not in report
