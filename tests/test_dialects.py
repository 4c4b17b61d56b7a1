"""Offering tools and reading tool calls, in both dialects."""

from __future__ import annotations

from nanbeige.agent.run import dialects
from nanbeige.agent.trajectory.trajectory import ToolCall, ToolResult, Turn

TOOLS = [
    {
        "server": "search_and_scrape_webpage",
        "name": "google_search",
        "description": "Search the web.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
    {"server": "mine", "name": "lookup", "description": "Look up.", "input_schema": {"type": "object"}},
    {
        "server": "tool-python",
        "name": "run_python_code",
        "description": "Run code.",
        "input_schema": {"type": "object", "properties": {"code_block": {"type": "string"}}, "nullable": None},
    },
]


def call_block(server: str, tool: str, arguments: str) -> str:
    return (
        f"<use_mcp_tool>\n<server_name>{server}</server_name>\n<tool_name>{tool}</tool_name>\n"
        f"<arguments>\n{arguments}\n</arguments>\n</use_mcp_tool>"
    )


def test_mcp_xml_prompt_has_the_trained_structure() -> None:
    prompt = dialects.system_prompt("mcp-xml", TOOLS, "2026-11-21")
    sections = [
        "# Tool-Use Formatting Instructions",
        "## Server name: tool-python",
        "## Server name: search_and_scrape_webpage",
        "## Server name: mine",
        "# General Objective",
        "# Agent Specific Objective",
    ]
    positions = [prompt.index(s) for s in sections]
    assert positions == sorted(positions), "known servers first, in the reference's order, then the others"
    assert "### Tool name: google_search\nDescription: Search the web.\n" in prompt
    # schemas print as Python dicts with sorted keys, as the reference's SDK gave them
    assert (
        "Input JSON schema: {'nullable': None, 'properties': {'code_block': {'type': 'string'}}, 'type': 'object'}"
        in prompt
    )
    assert dialects.user_message("mcp-xml", "Q?").startswith("Q?\n") and "\\boxed{}" in dialects.user_message(
        "mcp-xml", "Q?"
    )


REFERENCE_SKELETON = [  # the reference harness's prompt, line by line: exact where structure, `*` where prose
    "* ",  # one sentence, ending in a space
    "",
    "*Today is: 2026-11-21",  # the date closes the second paragraph
    "",
    "# Tool-Use Formatting Instructions ",
    "",
    "*",
    "",
    "*`use_mcp_tool`.",
    "",
    "Description: ",
    "*",
    "",
    "Parameters:",
    "- server_name: (required) *",
    "- tool_name: (required) *",
    "- arguments: (required) *",
    "",
    "Usage:",
    "<use_mcp_tool>",
    "<server_name>server name here</server_name>",
    "<tool_name>tool name here</tool_name>",
    "<arguments>",
    "{",
    '"param1": "value1",',
    '"param2": "value2 \\"escaped string\\""',
    "}",
    "</arguments>",
    "</use_mcp_tool>",
    "",
    "Important Notes:",
    "- *",
    "- *",
    "",
    "*",
    "The functions you can call follow, with their input schemas in JSONSchema form:",
    "",
    "",
    "## Server name: tool-python",
    "### Tool name: run_python_code",
    "Description: Run code.",
    "Input JSON schema: *",
    "",
    "## Server name: search_and_scrape_webpage",
    "### Tool name: google_search",
    "Description: Search the web.",
    "Input JSON schema: *",
    "### Tool name: location_lookup",  # no blank line between the tools of one server
    "Description: Find a place.",
    "Input JSON schema: {'properties': {'place': {'title': 'Place', 'type': 'string'}, 'country': {'default': None, "
    "'title': 'Country', 'type': 'string'}}, 'required': ['place'], 'title': 'location_lookupArguments', "
    "'type': 'object'}",
    "",
    "## Server name: mine",
    "### Tool name: lookup",
    "Description: Look up.",
    "Input JSON schema: {'type': 'object'}",
    "",
    "# General Objective",
    "",
    "*",
    "",
    "# Agent Specific Objective",
    "",
    "*",  # the prompt is stripped: no newline after the last sentence
]


def test_the_mcp_xml_prompt_matches_the_reference_layout_line_by_line() -> None:
    # an optional parameter as a newer SDK writes it (`anyOf` with null) prints as the reference's SDK wrote it
    nullable = {
        "type": "object",
        "properties": {
            "place": {"title": "Place", "type": "string"},
            "country": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Country"},
        },
        "required": ["place"],
        "title": "location_lookupArguments",
    }
    tools = [
        *TOOLS,
        {
            "server": "search_and_scrape_webpage",
            "name": "location_lookup",
            "description": "Find a place.",
            "input_schema": nullable,
        },
    ]
    lines = dialects.system_prompt("mcp-xml", tools, "2026-11-21").split("\n")
    assert len(lines) == len(REFERENCE_SKELETON)
    for number, (line, expected) in enumerate(zip(lines, REFERENCE_SKELETON), start=1):
        head, star, tail = expected.partition("*")
        if star:
            assert line.startswith(head) and line.endswith(tail) and len(line) > len(head) + len(tail), (number, line)
        else:
            assert line == expected, (number, line)


def test_the_mcp_xml_prompt_is_pinned_by_a_golden_file() -> None:
    from pathlib import Path

    golden = Path(__file__).parent / "golden" / "mcp_system_prompt.txt"
    assert dialects.system_prompt("mcp-xml", TOOLS, "2026-11-21") == golden.read_text()


def test_a_system_prompt_template_of_ones_own() -> None:
    template = 'Tools:\n{tools}\nDate {date}. JSON stays as written: {"a": 1}'
    prompt = dialects.system_prompt("mcp-xml", TOOLS, "2026-11-21", template)
    assert prompt.startswith("Tools:\n\n## Server name: tool-python\n") and prompt.endswith(
        'Date 2026-11-21. JSON stays as written: {"a": 1}'
    )


def test_without_tools_the_prompt_does_not_describe_any() -> None:
    prompt = dialects.system_prompt("mcp-xml", [], "2026-11-21")
    assert "use_mcp_tool" not in prompt and "Today is: 2026-11-21" in prompt


def test_parses_a_call_after_the_reasoning() -> None:
    content = "<think>\nI should search.\n</think>\n\nSearching.\n" + call_block(
        "search_and_scrape_webpage", "google_search", '{"q": "Nanbeige"}'
    )
    parsed = dialects.parse_reply("mcp-xml", {"content": content}, TOOLS)
    assert parsed.tool_calls == [ToolCall("search_and_scrape_webpage", "google_search", {"q": "Nanbeige"})]
    assert parsed.format_error is None


def test_several_calls_in_one_message_all_run() -> None:
    content = call_block("mine", "lookup", '{"k": 1}') + "\n" + call_block("mine", "lookup", '{"k": 2}')
    parsed = dialects.parse_reply("mcp-xml", {"content": content}, TOOLS)
    assert [c.arguments for c in parsed.tool_calls] == [{"k": 1}, {"k": 2}]


def test_broken_json_is_repaired_and_nulls_dropped() -> None:
    content = call_block("mine", "lookup", "{'k': 'single quotes', \"x\": null, \"y\": [1, 2,]")
    [call] = dialects.parse_reply("mcp-xml", {"content": content}, TOOLS).tool_calls
    assert call.arguments == {"k": "single quotes", "y": [1, 2]}


def test_calls_inside_the_reasoning_count_as_the_reference_reads_the_whole_reply() -> None:
    content = (
        "<think>\nMaybe " + call_block("mine", "lookup", '{"k": 1}') + "\nno.\n</think>\n\nThe answer is \\boxed{42}."
    )
    parsed = dialects.parse_reply("mcp-xml", {"content": content}, TOOLS)
    assert [c.arguments for c in parsed.tool_calls] == [{"k": 1}]
    assert dialects.extract_answer("mcp-xml", content) == "42"  # the answer is still read after the reasoning


def test_a_call_after_an_unclosed_think_is_made() -> None:
    parsed = dialects.parse_reply("mcp-xml", {"content": "<think>\n" + call_block("mine", "lookup", "{}")}, TOOLS)
    assert [(c.server, c.name) for c in parsed.tool_calls] == [("mine", "lookup")]


def test_each_of_the_six_tags_marks_a_malformed_call_even_inside_the_reasoning() -> None:
    for tag in ("<use_mcp_tool>", "</use_mcp_tool>", "<server_name>", "</server_name>", "<arguments>", "</arguments>"):
        content = f"<think>\nI could write {tag} here.\n</think>\nOK"
        parsed = dialects.parse_reply("mcp-xml", {"content": content}, TOOLS)
        assert parsed.tool_calls == [] and "could not be parsed" in parsed.format_error, tag
    # <tool_name> is not one of them, as in the reference
    assert dialects.parse_reply("mcp-xml", {"content": "<tool_name>x</tool_name>"}, TOOLS).format_error is None


def test_a_malformed_call_becomes_a_message_for_the_model() -> None:
    missing_tool_name = "<use_mcp_tool>\n<server_name>mine</server_name>\n<arguments>{}</arguments>\n</use_mcp_tool>"
    parsed = dialects.parse_reply("mcp-xml", {"content": missing_tool_name}, TOOLS)
    assert parsed.tool_calls == [] and "could not be parsed" in parsed.format_error

    good_and_bad = call_block("mine", "lookup", '{"k": 1}') + call_block("mine", "lookup", "[1, 2]")
    parsed = dialects.parse_reply("mcp-xml", {"content": good_and_bad}, TOOLS)
    assert len(parsed.tool_calls) == 2 and parsed.format_error is None  # the good call still runs
    assert list(parsed.call_errors) == [1] and "not a JSON object" in parsed.call_errors[1]


def test_in_mcp_xml_only_a_boxed_answer_ends_the_run() -> None:
    assert dialects.mcp_xml_answer_problem("<think>x</think>\nSo it is \\boxed{42}.") is None
    assert "neither a tool call nor a final answer" in dialects.mcp_xml_answer_problem("Let me search first.")
    assert "<use_mcp_tool> format" in dialects.mcp_xml_answer_problem(
        '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
    )
    assert "empty" in dialects.mcp_xml_answer_problem("\\boxed{ }")


def test_a_wrong_server_name_is_fixed_when_only_one_server_has_the_tool() -> None:
    [call] = dialects.parse_reply(
        "mcp-xml", {"content": call_block("search", "google_search", '{"q": "x"}')}, TOOLS
    ).tool_calls
    assert call.server == "search_and_scrape_webpage"


def test_boxed_answer_with_nested_braces() -> None:
    assert dialects.extract_answer("mcp-xml", "So \\boxed{\\frac{1}{2}} it is") == "\\frac{1}{2}"
    assert dialects.extract_answer("mcp-xml", "<think>x</think>\nPlain answer.") == "Plain answer."


def test_tool_call_dialect_offers_functions_and_reads_server_parsed_calls() -> None:
    tools = TOOLS + [{"server": "other", "name": "lookup", "description": "", "input_schema": {}}]
    offered = dialects.request_tools("tool-call", tools)
    assert [t["function"]["name"] for t in offered] == [
        "google_search",
        "mine__lookup",
        "run_python_code",
        "other__lookup",
    ]
    assert dialects.request_tools("mcp-xml", tools) is None
    message = {
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "other__lookup", "arguments": '{"k": 3}'}}
        ],
    }
    assert dialects.parse_reply("tool-call", message, tools).tool_calls == [ToolCall("other", "lookup", {"k": 3}, "c1")]


def test_tool_call_dialect_reads_tool_call_blocks_in_the_text() -> None:
    content = (
        '<think>\nhm\n</think>\n<tool_call>\n{"name": "google_search", "arguments": {"q": "a"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "run_python_code", "arguments": {"code_block": "1"}}\n</tool_call>'
    )
    calls = dialects.parse_reply("tool-call", {"content": content}, TOOLS).tool_calls
    assert [(c.server, c.name) for c in calls] == [
        ("search_and_scrape_webpage", "google_search"),
        ("tool-python", "run_python_code"),
    ]
    assert [c.id for c in calls] == [None, None]  # the server never saw them as calls: no ids to answer
    broken = dialects.parse_reply("tool-call", {"content": "<tool_call>\nnot json at all\n</tool_call>"}, TOOLS)
    assert broken.format_error and not broken.tool_calls


def test_results_go_back_as_one_user_message_or_as_tool_messages() -> None:
    turn = Turn(
        index=0,
        assistant={},
        tool_calls=[ToolCall("a", "x", {}, "c1"), ToolCall("a", "y", {}, "c2")],
        tool_results=[ToolResult("one"), ToolResult("Unknown tool: y", is_error=True)],
    )
    # mcp-xml: the texts as the tools gave them, as the reference sends them (the error mark stays in the record)
    assert dialects.observation_messages("mcp-xml", turn) == [{"role": "user", "content": "one\nUnknown tool: y"}]
    assert dialects.observation_messages("tool-call", turn) == [
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: Unknown tool: y"},
    ]
    turn.tool_calls[0].id = None
    assert dialects.observation_messages("tool-call", turn)[0] == {"role": "tool", "content": "one"}


def test_a_server_parsed_call_with_broken_arguments_still_gets_a_result() -> None:
    message = {
        "content": "",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "google_search", "arguments": '{"q": "x"}'}},
            {"id": "b", "type": "function", "function": {"name": "google_search", "arguments": "[not an object]"}},
        ],
    }
    parsed = dialects.parse_reply("tool-call", message, TOOLS)
    assert [c.id for c in parsed.tool_calls] == ["a", "b"] and list(parsed.call_errors) == [1]


def test_reasoning_split_off_by_the_server_goes_back_into_the_history() -> None:
    assistant = {"role": "assistant", "content": "call", "reasoning": "why"}
    assert dialects.history_message("mcp-xml", assistant)["content"] == "<think>\nwhy\n</think>\n\ncall"
    assert dialects.history_message("tool-call", assistant)["reasoning_content"] == "why"


def test_the_boxed_answer_is_read_as_the_reference_reads_it() -> None:
    cases = {
        "first \\boxed{a}, then \\boxed {b}": "b",  # the last box wins; space before the brace is allowed
        "\\boxed{\\frac{1}{2}}": "\\frac{1}{2}",  # nested braces are counted
        "\\boxed{a\\}b}": "a\\}b",  # an escaped brace does not close the box
        "\\boxed{ Ulaanbaatar ": "Ulaanbaatar",  # a box left open runs to the end
        "\\boxed{}": "",
        "no box here": None,
    }
    for text, answer in cases.items():
        assert dialects.last_boxed(text) == answer, text


def test_our_summary_prompt_states_every_rule_an_exact_match_grader_depends_on() -> None:
    prompt = dialects.final_answer_instruction("mcp-xml", "How many moons?", summary=True)
    assert '"How many moons?"' in prompt and "\\boxed{}" in prompt and "Do not call any tool." in prompt
    for rule in (
        "a number;",
        "as few words as possible;",
        "a list of numbers, strings or both, separated by commas",
        "formatting instruction of the original question",
        "order, units, rounding, number of decimal places",
        "in digits, not words",
        "without thousands separators",
        "percent signs unless the question asks",
        "without articles and without abbreviations",
        "each element by the rule for numbers or for strings",
        "without punctuation such as '.', '!' or '?'",
        "invisible and non-printable characters",
        "do not work it out again",
        "best-informed guess",
    ):
        assert rule in prompt, rule
    assert "Put your final answer" not in dialects.final_answer_instruction("tool-call", "q", summary=True)


def test_the_user_message_ends_with_the_reference_answer_format_sentence() -> None:
    message = dialects.user_message("mcp-xml", "Q?")
    assert message.startswith("Q?\nYou should follow the format instruction in the request strictly")
    assert message.endswith("\\boxed{}.") and dialects.user_message("tool-call", "Q?") == "Q?"
