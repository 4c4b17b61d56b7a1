"""What the model sees: keep-K, the token estimate, and the repetition guard."""

from __future__ import annotations

from nanbeige.agent.run.context import History, degenerate, estimate_tokens, repeated_call
from nanbeige.agent.run.dialects import OMITTED
from nanbeige.agent.trajectory.trajectory import ToolCall, Turn


def test_only_the_last_k_tool_results_are_shown() -> None:
    history = History("system", "question", keep_tool_results=2)
    for i in range(5):
        history.add_turn({"role": "assistant", "content": f"call {i}"}, [{"role": "user", "content": f"result {i}"}])
    shown = [m["content"] for m in history.messages]
    assert shown == [
        "system",
        "question",
        "call 0",
        OMITTED,
        "call 1",
        OMITTED,
        "call 2",
        OMITTED,
        "call 3",
        "result 3",
        "call 4",
        "result 4",
    ]


def test_keep_minus_one_shows_everything_and_omitting_never_mutates_old_requests() -> None:
    history = History("s", "q", keep_tool_results=-1)
    history.add_turn({"role": "assistant", "content": "a"}, [{"role": "user", "content": "r"}])
    assert history.messages[-1]["content"] == "r"
    history = History("s", "q", keep_tool_results=0)
    observation = {"role": "user", "content": "r"}
    history.add_turn({"role": "assistant", "content": "a"}, [observation])
    assert history.messages[-1]["content"] == OMITTED and observation["content"] == "r"


def test_several_tool_messages_of_one_turn_are_omitted_together() -> None:
    history = History("s", "q", keep_tool_results=1)
    history.add_turn(
        {"role": "assistant", "content": "a"}, [{"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]
    )
    history.add_turn({"role": "assistant", "content": "b"}, [{"role": "tool", "content": "r3"}])
    assert [m["content"] for m in history.messages[2:]] == ["a", OMITTED, OMITTED, "b", "r3"]


def test_next_prompt_uses_the_servers_count_plus_an_estimate_of_what_is_new() -> None:
    history = History("s", "q", keep_tool_results=5)
    assert history.next_prompt_tokens(None) == history.estimated_tokens
    turn = Turn(index=0, assistant={"content": "x"}, usage={"prompt_tokens": 1000, "completion_tokens": 50})
    history.add_turn({"role": "assistant", "content": "x"}, [{"role": "user", "content": "y" * 3000}])
    assert history.next_prompt_tokens(turn) == 1000 + 50 + estimate_tokens("y" * 3000)


def test_after_a_rolled_back_reply_the_next_prompt_is_the_one_it_answered() -> None:
    """Seen against real vLLM: a dropped reply's tokens and the first prompt's estimate were counted again
    on top of the server's count (1,872 + 256 + 2,048 in a 4,096 context), ending runs as context_limit."""
    history = History("s" * 4000, "q" * 4000, keep_tool_results=5)
    dropped = Turn(
        index=0,
        assistant={"content": "cut off"},
        rolled_back=True,
        usage={"prompt_tokens": 1872, "completion_tokens": 256},
    )
    assert history.next_prompt_tokens(dropped) == 1872  # nothing was added: the same prompt is sent again
    history.add_turn({"role": "assistant", "content": "x"}, [{"role": "user", "content": "y" * 300}])
    kept = Turn(index=1, assistant={"content": "x"}, usage={"prompt_tokens": 1872, "completion_tokens": 10})
    history.add_turn({"role": "assistant", "content": "z"}, [{"role": "user", "content": "w" * 30}])
    dropped = Turn(
        index=2,
        assistant={"content": "again"},
        rolled_back=True,
        usage={"prompt_tokens": 1990, "completion_tokens": 400},
    )
    assert history.next_prompt_tokens(kept) == 1872 + 10 + estimate_tokens("w" * 30)
    assert history.next_prompt_tokens(dropped) == 1990


def test_the_estimate_errs_high_for_english_and_cjk() -> None:
    english = "The quick brown fox jumps over the lazy dog. " * 100  # about 1000 real tokens
    assert estimate_tokens(english) > 1000
    assert estimate_tokens("南北阁" * 100) >= 300  # CJK: about one token per character


def test_a_reply_looping_on_itself_is_caught() -> None:
    assert degenerate("Let me think. " + "I will search again. " * 40)
    assert not degenerate("A normal reply that says one thing once, " * 3)


def test_the_same_call_three_times_in_a_row_is_refused() -> None:
    call = ToolCall("s", "google_search", {"q": "x"})
    same = [Turn(index=i, assistant={}, tool_calls=[ToolCall("s", "google_search", {"q": "x"})]) for i in range(2)]
    assert repeated_call(same, call, limit=3)
    assert not repeated_call(same[:1], call, limit=3)
    different = same[:1] + [Turn(index=1, assistant={}, tool_calls=[ToolCall("s", "google_search", {"q": "y"})])]
    assert not repeated_call(different, call, limit=3)
