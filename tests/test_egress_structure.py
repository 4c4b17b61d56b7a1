"""One egress guard: every URL the program fetches on someone else's behalf (a model's, a handed-over file's)
goes through `tools/egress.py`, which refuses loopback, private and link-local addresses after resolving
them, checks every redirect and caps what it reads. The only other code that opens outbound HTTP connections
is a client of an endpoint the user configured (a model server, a judge, a search API), named below with
what it talks to. A new fetch anywhere else fails this test until it uses the guard or is named here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("agent", "evals", "servers", "tools", "trainer")
GUARD = "tools/egress.py"

OUTBOUND = {
    *(f"httpx.{name}" for name in ("get", "post", "put", "patch", "delete", "head", "options", "request", "stream")),
    "httpx.Client",
    "httpx.AsyncClient",
    *(f"requests.{name}" for name in ("get", "post", "put", "patch", "delete", "head", "options", "request")),
    "requests.Session",
    "requests.session",
    "urllib.request.urlopen",
    "urllib.request.build_opener",
    "http.client.HTTPConnection",
    "http.client.HTTPSConnection",
    "aiohttp.ClientSession",
    "aiohttp.request",
}
"""The calls that open an outbound HTTP connection, by their full names."""

USER_CONFIGURED = {
    ("agent/backends/llm.py", "OpenAIChat.__init__"): "the model endpoint the user configured",
    ("agent/backends/local_model.py", "check_model_available"): "the Hugging Face hub (HF_ENDPOINT), before a download",
    ("agent/backends/model_server.py", "_probe"): "the model server the user named, asked what it is",
    ("agent/cli/serve.py", "_wait_ready"): "the vLLM server `serve` itself started, on loopback",
    ("evals/bfcl_run.py", "ServerTokenizer._count"): "the model server's /tokenize",
    ("evals/runner.py", "run_here"): "the judge endpoints of the eval's settings",
    ("evals/sharded.py", "open_shard"): "the judge endpoints of the eval's settings",
    ("tools/scrape.py", "fetch_jina"): "Jina Reader (JINA_BASE_URL); the page's address is checked first",
    ("tools/scrape.py", "extract_info"): "the extraction model (NANBEIGE_SUMMARY_BASE_URL)",
    ("tools/search.py", "Searcher.__init__"): "the search API the user configured (Serper, Jina, SearXNG, ...)",
    ("trainer/rewards.py", "_judge_all"): "the judge endpoints of the training settings",
    ("trainer/rewards_sharded.py", "open_shard"): "the judge endpoints of the training settings",
    ("trainer/sync.py", "client"): "the inference servers whose weights the trainer updates",
    ("trainer/synth.py", "_run_workers"): "the model endpoint that writes synthetic questions",
}
"""(file, function) -> the endpoint it talks to: a place the user chose, never a URL from a model or a file."""


def imported_names(tree: ast.Module) -> dict[str, str]:
    """Each name a module binds by an import (anywhere in it), as the full dotted name it stands for."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def full_name(node: ast.expr, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = full_name(node.value, names)
        return f"{owner}.{node.attr}" if owner else None
    return None


def outbound_calls(path: Path, relative: str) -> list[tuple[str, str, int, str]]:
    """(file, function, line, call) for each outbound HTTP call in a source file; the function is its
    qualified name (`Class.method`), or `<module>`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
    names = imported_names(tree)
    found = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            if isinstance(child, ast.Call) and (name := full_name(child.func, names)) in OUTBOUND:
                found.append((relative, ".".join(scope) or "<module>", child.lineno, name))
            visit(child, scope)

    visit(tree, [])
    return found


def project_calls() -> list[tuple[str, str, int, str]]:
    calls = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            calls += outbound_calls(path, path.relative_to(ROOT).as_posix())
    return calls


def test_only_the_egress_guard_and_named_endpoint_clients_open_outbound_connections() -> None:
    calls = project_calls()
    unguarded = [
        f"{where}:{line} {function}() calls {name}"
        for where, function, line, name in calls
        if where != GUARD and (where, function) not in USER_CONFIGURED
    ]
    assert not unguarded, "fetch through tools/egress.py, or name a user-configured endpoint's client here"
    assert any(where == GUARD for where, *_ in calls)  # the scan sees the guard's own client: it finds calls


def test_every_endpoint_client_named_here_still_exists() -> None:
    """A name left here after its code moved would let the next fetch in its place through unseen."""
    seen = {(where, function) for where, function, _, _ in project_calls()}
    assert set(USER_CONFIGURED) <= seen, set(USER_CONFIGURED) - seen


def test_the_scan_reports_a_fetch_planted_in_a_file(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import httpx as web\n"
        "import urllib.request\n"
        "from requests import get as fetch\n"
        "\n"
        "class Reader:\n"
        "    async def read(self, url):\n"
        "        async with web.AsyncClient() as client:\n"
        "            return await client.get(url)\n"
        "\n"
        "def page(url):\n"
        "    return urllib.request.urlopen(url).read() + fetch(url).content\n"
        "\n"
        "def harmless(client: web.AsyncClient) -> None:\n"  # a type named, no connection opened
        "    print(web.Timeout(5))\n"
    )
    assert outbound_calls(planted, "planted.py") == [
        ("planted.py", "Reader.read", 7, "httpx.AsyncClient"),
        ("planted.py", "page", 11, "urllib.request.urlopen"),
        ("planted.py", "page", 11, "requests.get"),
    ]
