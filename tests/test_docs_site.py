"""The documentation site builds with `mkdocs build --strict`, and its configuration page is made from the
command line itself: every option of every command is on it, under its own command, hidden ones included; and
the built pages render as written (no prose turned into code)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import typer

from nanbeige.agent.cli.program import app

ROOT = Path(__file__).parent.parent

pytest.importorskip("mkdocs", reason="the docs site needs mkdocs (the dev extra)")
pytest.importorskip("material", reason="the docs site needs mkdocs-material (the dev extra)")


def every_command(command: Any, path: str = "nanbeige") -> list[tuple[str, Any]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += every_command(sub, f"{path} {name}")
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def sections(page: str) -> dict[str, str]:
    """Each command's part of the configuration page, by its heading's id (`nanbeige-train-report`)."""
    return {
        match.group(1): match.group(2)
        for match in re.finditer(r'<h3 id="(nanbeige[\w-]*)"(.*?)(?=<h[23] |</article>)', page, re.S)
    }


def test_the_configuration_page_lists_every_option_of_every_command_under_that_command(site: Path) -> None:
    parts = sections((site / "configuration" / "index.html").read_text())
    commands = every_command(typer.main.get_command(app))
    assert len(commands) >= 20
    for path, command in commands:
        part = parts[path.replace(" ", "-")]
        items = re.findall(r"<li>(.*?)</li>", part, re.S)
        named = {
            name: item
            for item in items
            for head in re.findall(r"^<code>(.*?)</code>", item)
            for name in re.findall(r"--?[\w-]+", head)
        }  # each item opens with the option's names
        for option in (param for param in command.params if param.param_type_name == "option"):
            name = next((name for name in option.opts if name.startswith("--")), option.opts[0])
            item = named.get(name)
            assert item is not None, f"{path}: {name} is not on the configuration page"
            assert ("hidden from" in item) == bool(option.hidden), f"{path} {name}: hidden is {option.hidden}"
    # options that only one command has sit under that command alone
    assert "--lora-rank" in parts["nanbeige-train"] and "--lora-rank" not in parts["nanbeige-collect"]
    assert "--top-p" in parts["nanbeige-collect"] and "--top-p" not in parts["nanbeige-train"]
    assert "Setting: <code>lora_rank</code>" not in parts["nanbeige-train"]  # a group's own options are flags only
    assert "Setting: <code>top_p</code>" in parts["nanbeige-collect"]


def test_every_page_is_built(site: Path) -> None:
    pages = sorted(path.stem for path in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 15
    for stem in pages:
        assert (site / ("index.html" if stem == "index" else f"{stem}/index.html")).is_file(), stem


def test_the_readme_links_to_pages_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)", (ROOT / "README.md").read_text())
    assert len(links) >= 10
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing


class InlineCode(HTMLParser):
    """The built page's inline code spans (a <code> outside <pre>), and its text outside any code."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[str] = []
        self.prose: list[str] = []
        self.pre = self.code = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "pre":
            self.pre += 1
        elif tag == "code":
            self.code += 1
            if not self.pre:
                self.spans.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self.pre -= 1
        elif tag == "code":
            self.code -= 1

    def handle_data(self, data: str) -> None:
        if self.code and not self.pre:
            self.spans[-1] += data
        elif not self.code:
            self.prose.append(data)


def test_no_page_renders_prose_as_code_or_a_fence_as_text(site: Path) -> None:
    """A ``` in the middle of a line opens a code span that runs to the next one: code-rl.md showed twenty
    lines of prose as code. Inline code is a name, a flag, a short command; a fence is never left as text."""
    for page in sorted(site.glob("**/index.html")):
        found = InlineCode()
        found.feed(page.read_text(encoding="utf-8"))
        long = [span[:80] for span in found.spans if len(span.split()) > 25]
        assert long == [], (page.relative_to(site), long)
        assert not any("```" in text for text in found.prose), page.relative_to(site)


def test_every_page_wraps_long_code_lines_and_never_breaks_a_name_in_a_table(site: Path) -> None:
    """At 1280 px a code block shows about 84 characters: the quick start's first command ran on hidden under
    a scroll bar, and the theme broke names in table cells between any two letters (NANBEIGE_SEARCH_B|ACKEND).
    Each page loads the site's stylesheet, which wraps code blocks and keeps a table's names whole."""
    css = (site / "stylesheets" / "extra.css").read_text()
    rules = {
        selector.strip(): body
        for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", re.sub(r"/\*.*?\*/", "", css, flags=re.S))
    }
    assert "white-space: pre-wrap" in rules[".md-typeset pre > code"]
    assert "white-space: nowrap" in rules[".md-typeset table:not([class]) code"]
    long_lines = 0
    for page in sorted(site.glob("**/index.html")):
        html = page.read_text(encoding="utf-8")
        assert re.search(r'<link[^>]+href="[./]*stylesheets/extra\.css"', html), page.relative_to(site)
        for block in re.findall(r"<pre[^>]*>(.*?)</pre>", html, re.S):
            long_lines += sum(len(re.sub(r"<[^>]+>", "", line)) > 84 for line in block.splitlines())
    assert long_lines > 0  # what the stylesheet is for: long lines are there to wrap


def prose_sections(markdown: str) -> list[tuple[str, int]]:
    """Each section of a page (its heading, or the page's start) and how many words of prose it holds (code
    blocks left out)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.DOTALL | re.MULTILINE)
    sections, heading = [], "(the start)"
    words = 0
    for line in text.splitlines():
        if re.match(r"#{1,4} ", line):
            sections.append((heading, words))
            heading, words = line, 0
        else:
            words += len(line.split())
    return [*sections, (heading, words)]


def test_every_long_page_has_subheadings_so_its_table_of_contents_is_not_empty() -> None:
    """The site's table of contents is the page's headings: a page of 2,000 words under one heading has none. No
    section of a page runs past 800 words of prose."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        if page.name == "configuration.md":  # its option reference is a list to look things up in, not prose
            start, end = "<!-- the option reference, written by", "<!-- the end of the option reference -->"
            text = text.split(start)[0] + text.split(end)[1]
        long = [(heading, words) for heading, words in prose_sections(text) if words > 800]
        assert long == [], (page.name, long)


def test_the_committed_option_reference_is_the_command_lines_own() -> None:
    """docs/configuration.md holds the option reference itself, so that it reads on GitHub; it is what the
    program says today (after changing an option: `python docs/hooks.py`)."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    committed = hooks.committed_reference((ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"))
    assert committed == hooks.reference().strip("\n"), (
        "docs/configuration.md's option reference is stale: python docs/hooks.py"
    )
