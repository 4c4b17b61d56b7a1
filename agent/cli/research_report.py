"""The report of a research run, as markdown or standalone HTML: the question, the answer, the
reasoning in brief, and numbered citations of the sources the run read.

Citations come only from the trajectories, never from the model's text: a page counts as read when
a `scrape_and_extract_info` call fetched it and returned an extract (the URL is the call's, the
passage the extract); a search result's URL and snippet were shown to the model too, and are cited
when the answer or the reasoning names that URL. A URL the model only wrote is never cited. URLs in
the reasoning that match a citation get its number; `[n]` the model wrote itself point at nothing
the run numbered and are left as written.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import Any

from nanbeige.agent.cli.console import visible
from nanbeige.agent.run import dialects
from nanbeige.agent.trajectory.trajectory import Trajectory, Turn, counted_turns

SCRAPE_TOOL, SEARCH_TOOL = "scrape_and_extract_info", "google_search"
PASSAGE_CHARS = 800  # a passage is trimmed to this
REASONING_CHARS = 2500
_URL = re.compile(r"https?://[^\s<>\"'`\])}]+")
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # controls, bidi overrides


@dataclass
class Citation:
    """One source of the run."""

    url: str
    title: str = ""
    passages: list[str] = field(default_factory=list)
    """What the run took from it: the extracts of a page read, else the search snippet shown."""
    read: bool = False
    """True when a scrape fetched the page; False for a search result seen only as a snippet."""


@dataclass
class Report:
    question: str
    answer: str | None
    reasoning: str
    """The final reply's visible text (no `<think>` part), trimmed, with citation numbers added."""
    citations: list[Citation]
    attempts: list[str]
    """One line per attempt: how it ended."""
    trajectory_file: str = ""


def build(question: str, attempts: list[Trajectory], answer: str | None, trajectory_file: str = "") -> Report:
    text = reasoning_text(attempts[-1]) if attempts else ""
    cited = [s for s in sources(attempts) if s.read or _mentions(f"{text}\n{answer or ''}", s.url)]
    return Report(
        question=question,
        answer=answer,
        reasoning=numbered(text, cited),
        citations=cited,
        attempts=[_attempt_line(n, t) for n, t in enumerate(attempts, start=1)],
        trajectory_file=trajectory_file,
    )


def sources(attempts: list[Trajectory]) -> list[Citation]:
    """Every page scraped and every search result shown, in the order the run first met them, one
    entry per URL."""
    by_url: dict[str, Citation] = {}
    for trajectory in attempts:
        for turn in trajectory.turns:
            for call, result in zip(turn.tool_calls, turn.tool_results):
                if result.is_error:
                    continue
                if call.name == SCRAPE_TOOL and isinstance(call.arguments.get("url"), str):
                    _add_page(by_url, call.arguments["url"], _extract(result.text))
                elif call.name == SEARCH_TOOL:
                    for hit in _hits(result.text):
                        source = by_url.setdefault(_key(hit["link"]), Citation(url=hit["link"]))
                        source.title = source.title or hit["title"]
                        if not source.read and hit["snippet"] and hit["snippet"] not in source.passages:
                            source.passages.append(hit["snippet"])
    return list(by_url.values())


def _add_page(by_url: dict[str, Citation], url: str, extract: str | None) -> None:
    if not extract:  # a failed scrape, or nothing extracted: nothing of the page was used
        return
    source = by_url.setdefault(_key(url), Citation(url=url))
    if not source.read:
        source.read, source.passages = True, []  # the extract replaces the snippet
    if extract not in source.passages:
        source.passages.append(extract)


def _extract(text: str) -> str | None:
    """The extract a scrape returned; the whole text when a scrape server answers in plain text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text.strip() or None
    if not isinstance(value, dict):
        return text.strip() or None
    if value.get("success") is False:
        return None
    extract = value.get("extracted_info")
    return extract.strip() or None if isinstance(extract, str) else None


def _hits(text: str) -> list[dict[str, str]]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    organic = value.get("organic") if isinstance(value, dict) else None
    return [
        {"link": h["link"], "title": str(h.get("title") or ""), "snippet": str(h.get("snippet") or "")}
        for h in organic or []
        if isinstance(h, dict) and isinstance(h.get("link"), str) and h["link"]
    ]


def _key(url: str) -> str:
    return url.strip().rstrip("/")


def _urls(text: str) -> list[str]:
    return [match.rstrip(".,;:!?") for match in _URL.findall(text)]


def _mentions(text: str, url: str) -> bool:
    return _key(url) in {_key(u) for u in _urls(text)}


def numbered(text: str, citations: list[Citation]) -> str:
    """The text with ` [n]` after each URL that is citation n."""
    numbers = {_key(c.url): n for n, c in enumerate(citations, start=1)}

    def mark(match: re.Match[str]) -> str:
        url = match.group().rstrip(".,;:!?")
        n = numbers.get(_key(url))
        return match.group() if n is None else url + f" [{n}]" + match.group()[len(url) :]

    return _URL.sub(mark, text)


def reasoning_text(trajectory: Trajectory) -> str:
    """The visible text of the attempt's last reply that made no tool call, trimmed."""
    for turn in reversed(trajectory.turns):
        text = _visible(turn)
        if text and not turn.rolled_back and not turn.tool_calls:
            return text if len(text) <= REASONING_CHARS else text[:REASONING_CHARS] + " …"
    return ""


def _visible(turn: Turn) -> str:
    return dialects.visible_text(turn.assistant.get("content") or "").strip()


def _attempt_line(number: int, trajectory: Trajectory) -> str:
    turns = counted_turns(trajectory.turns)
    wall = trajectory.timings.get("wall_s", 0.0)
    return (
        f"Attempt {number} ({trajectory.id}): {trajectory.stop_reason} after {turns} turn{'s' * (turns != 1)} "
        f"in {wall:.1f}s"
    )


def _clean(text: str) -> str:
    """The text with the keys the run knows taken out (before any escaping could disguise them) and no
    control characters."""
    return _UNSAFE.sub("", visible(text))


def _trim(text: str) -> str:
    text = _clean(text).strip()
    return text if len(text) <= PASSAGE_CHARS else text[:PASSAGE_CHARS] + " …"


# ---------------------------------------------------------------- markdown


def _md(text: str) -> str:
    """Text safe in markdown: no control characters, no raw HTML a viewer would run, and no link or
    image of the model's or a page's making (a viewer would fetch an image: `![x](https://tracker/)`),
    since `[` and `]` are escaped; only `_md_link` makes links, to the pages cited."""
    escaped = html.escape(_clean(text), quote=False).replace("[", "\\[").replace("]", "\\]")
    return _CITATION_MARK.sub(r"[\1]", escaped)  # a bare [n] links nothing: kept readable


# an escaped `[n]` followed by neither `(` (an inline link) nor `:` (a link definition)
_CITATION_MARK = re.compile(r"\\\[(\d+)\\\](?![(:])")


def _md_link(citation: Citation) -> str:
    title = _md(citation.title or citation.url)
    if not citation.url.lower().startswith(("http://", "https://")):
        return f"{title} ({_md(citation.url)})"
    target = "".join(f"%{ord(ch):02X}" if ch in " ()<>" else ch for ch in _clean(citation.url))
    return f"[{title}]({target})"


def to_markdown(report: Report) -> str:
    lines = [
        "# Research report",
        "",
        f"**Question:** {_md(report.question)}",
        "",
        "## Answer",
        "",
        _md(report.answer) if report.answer is not None else "*No answer was found.*",
        "",
    ]
    if report.reasoning:
        lines += ["## Reasoning in brief", "", _md(report.reasoning), ""]
    lines += ["## Sources", ""]
    if not report.citations:
        lines += ["*The run read no pages.*", ""]
    for n, citation in enumerate(report.citations, start=1):
        kind = "" if citation.read else " (search result)"
        lines.append(f"{n}. {_md_link(citation)}{kind}")
        for passage in citation.passages:
            lines += ["", *[f"   > {line}" for line in _md(_trim(passage)).splitlines()]]
        lines.append("")
    lines += ["## The run", "", *[f"- {_md(line)}" for line in report.attempts]]
    if report.trajectory_file:
        lines.append(f"- Trajectories: `{_md(report.trajectory_file)}`")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- HTML

_STYLE = """body{font:16px/1.5 system-ui,sans-serif;max-width:48em;margin:2em auto;padding:0 1em;color:#222}
blockquote{margin:.5em 0 .5em 1em;padding-left:1em;border-left:3px solid #ccc;color:#444;white-space:pre-wrap}
.answer{font-size:1.2em;font-weight:bold}.reasoning{white-space:pre-wrap}.url{font-size:.85em;color:#666;
word-break:break-all}li{margin-bottom:1em}"""


def _h(text: str) -> str:
    return html.escape(_clean(text), quote=True)


def _html_link(citation: Citation) -> str:
    title = _h(citation.title or citation.url)
    if not citation.url.lower().startswith(("http://", "https://")):
        return title
    return f'<a href="{_h(citation.url)}" rel="noreferrer noopener">{title}</a>'


def to_html(report: Report) -> str:
    """The report as one standalone page: everything escaped, no scripts, no external assets (its
    Content-Security-Policy allows none)."""
    parts: list[Any] = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>Research report: {_h(report.question[:80])}</title><style>{_STYLE}</style></head><body>",
        "<h1>Research report</h1>",
        f"<p><strong>Question:</strong> {_h(report.question)}</p>",
        "<h2>Answer</h2>",
        f'<p class="answer">{_h(report.answer)}</p>'
        if report.answer is not None
        else "<p><em>No answer was found.</em></p>",
    ]
    if report.reasoning:
        parts += ["<h2>Reasoning in brief</h2>", f'<p class="reasoning">{_h(report.reasoning)}</p>']
    parts.append("<h2>Sources</h2>")
    if not report.citations:
        parts.append("<p><em>The run read no pages.</em></p>")
    else:
        parts.append("<ol>")
        for citation in report.citations:
            kind = "" if citation.read else " (search result)"
            quotes = "".join(f"<blockquote>{_h(_trim(p))}</blockquote>" for p in citation.passages)
            parts.append(f'<li>{_html_link(citation)}{kind}<div class="url">{_h(citation.url)}</div>{quotes}</li>')
        parts.append("</ol>")
    parts += ["<h2>The run</h2><ul>", *[f"<li>{_h(line)}</li>" for line in report.attempts], "</ul>"]
    if report.trajectory_file:
        parts.append(f"<p>Trajectories: <code>{_h(report.trajectory_file)}</code></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
