"""A judge or critic that is down, through the command line: refused or hanging, it is one error line within
the timeout and retries the flags allow, not a traceback or a wait on every trajectory."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port
from test_cli import nanbeige
from test_judge import assert_one_error_line, make, write


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A loopback HTTP endpoint that accepts every connection and never answers: a hung server. Yields its
    URL and the connections it took (a call that timed out asks again on a new one)."""
    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)

        def accept() -> None:
            with contextlib.suppress(OSError):  # the listener closed: the test is over
                while True:
                    held.append(listener.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", held
        finally:
            for connection in held:
                connection.close()


def graded_by_a_judge(tmp_path: Path, count: int = 6) -> Path:
    """Trajectories whose answer only the LLM judge can grade (it is not the gold answer word for word)."""
    return write(
        tmp_path / "in.jsonl", [make(f"t{n}", answer="Lutetia", grader="equivalent/reference") for n in range(count)]
    )


@pytest.mark.slow
def test_an_unreachable_judge_is_one_error_line_even_when_many_trajectories_fail_at_once(tmp_path: Path) -> None:
    src, out = graded_by_a_judge(tmp_path), tmp_path / "out.jsonl"
    judge_url = f"http://127.0.0.1:{free_port()}/v1"  # refused: nothing listens there
    result = nanbeige("judge", str(src), "--out", str(out), "--no-critic", "--judge-base-url", judge_url)
    assert_one_error_line(result, "outcome judge", "unreachable", judge_url)
    assert not out.exists() or not out.read_bytes()  # nothing judged, nothing written: a resume grades them all


def test_a_hanging_judge_is_one_error_line_within_its_timeout_and_retries(tmp_path: Path) -> None:
    src, out = graded_by_a_judge(tmp_path), tmp_path / "out.jsonl"
    with silent_server() as (judge_url, calls):
        result = nanbeige(
            "judge",
            str(src),
            "--out",
            str(out),
            "--no-critic",
            "--judge-base-url",
            judge_url,
            "--request-timeout",
            "1",
            "--retries",
            "1",
            "--concurrency",
            "4",
        )
        asked = len(calls)
    assert_one_error_line(result, "outcome judge", "did not answer within 1 s", judge_url)
    # bounded by the flags, however slow the machine: each of the 4 calls in flight asked twice at most, and
    # the trajectories not yet started never asked (the command ended, within the helper's time limit)
    assert 1 <= asked <= 4 * 2
    assert not out.exists() or not out.read_bytes()


def test_a_hanging_critic_stops_the_command_instead_of_timing_out_every_turn(tmp_path: Path) -> None:
    src, out = write(tmp_path / "in.jsonl", [make(f"t{n}") for n in range(6)]), tmp_path / "out.jsonl"
    with silent_server() as (critic_url, calls):
        result = nanbeige(
            "judge",
            str(src),
            "--out",
            str(out),
            "--grader",
            "gaia-exact",
            "--critic-base-url",
            critic_url,
            "--critic-model",
            "critic-model",
            "--request-timeout",
            "1",
            "--retries",
            "0",
        )
        asked = len(calls)
    assert_one_error_line(result, "critic", critic_url, "did not answer", "within 1 s")
    assert asked < 6 * 3  # stopped early, not every turn of the 6 trajectories asked and recorded unjudged
    assert not out.exists() or not out.read_bytes()
