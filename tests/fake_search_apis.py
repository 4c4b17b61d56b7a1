"""Loopback stand-ins for Serper and SearXNG, for tests and benchmarks.

`FakeSerper` answers `POST /search` the way google.serper.dev does: it checks `X-API-KEY`
(403 `{"message": "Unauthorized.", "statusCode": 403}` on a wrong key) and returns
`searchParameters`, `organic[]` and the extra blocks (knowledge graph, people also ask, related
searches, credits) that nanbeige must drop. `FakeSearXNG` answers `GET /search?format=json` with
SearXNG's JSON (`query`, `number_of_results`, `results[]` with `url/title/content/publishedDate`,
`answers`, `suggestions`, `unresponsive_engines`, ...) and 403 when another format is asked for, as an
instance does when the format is not enabled.

Both take a script of `Reply` objects (errors, delays) played in order before falling back to
results made up from the query: `results` (query -> result list) when given, else `count` results
per query, and none for a query containing "nothing".
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Reply:
    """One scripted answer: a status and JSON body, with headers, after an optional delay."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


UNAUTHORIZED = Reply(403, {"message": "Unauthorized.", "statusCode": 403})
NO_CREDITS = Reply(400, {"message": "Not enough credits", "statusCode": 400})
RATE_LIMITED = Reply(429, {"message": "Too many requests", "statusCode": 429}, {"Retry-After": "1"})
SERVER_ERROR = Reply(503, {"message": "Service unavailable", "statusCode": 503})


@dataclass
class Request:
    """What the fake received."""

    method: str
    path: str
    params: dict[str, str]
    body: Any
    headers: dict[str, str]


class FakeSearchAPI:
    """Base: a threaded HTTP server on 127.0.0.1; use as `with FakeSerper() as api:`, then `api.url`."""

    def __init__(
        self, script: list[Reply] | None = None, results: dict[str, list[dict[str, Any]]] | None = None, count: int = 15
    ):
        self.script = list(script or [])
        self.results = results
        self.count = count
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def __enter__(self) -> FakeSearchAPI:
        # a short poll interval: shutdown() waits for the loop to notice, 0.5 s by default
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def next_reply(self, request: Request) -> Reply:
        with self.lock:
            self.requests.append(request)
            if self.script:
                return self.script.pop(0)
        return self.answer(request)

    def answer(self, request: Request) -> Reply:
        raise NotImplementedError

    def made_up(self, query: str) -> list[dict[str, Any]]:
        """The results for a query: scripted by `results`, or `count` numbered pages."""
        if self.results is not None:
            return self.results.get(query, [])
        if "nothing" in query:
            return []
        slug = "-".join(query.split())
        return [
            {
                "title": f"{query} - page {i}",
                "link": f"https://example.com/{slug}/{i}",
                "snippet": f"Page {i} about {query}.",
            }
            for i in range(1, self.count + 1)
        ]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                reply = fake.next_reply(Request(method, parts.path, params, body, dict(self.headers)))
                time.sleep(reply.delay_s)
                data = json.dumps(reply.body).encode() if not isinstance(reply.body, bytes) else reply.body
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    pass

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler


class FakeSerper(FakeSearchAPI):
    """google.serper.dev's `/search`."""

    def __init__(self, *args: Any, api_key: str = "test-key", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.api_key = api_key

    def answer(self, request: Request) -> Reply:
        if request.path != "/search" or request.method != "POST":
            return Reply(404, {"message": "Not found", "statusCode": 404})
        if request.headers.get("X-API-KEY", request.headers.get("x-api-key")) != self.api_key:
            return UNAUTHORIZED
        body = request.body or {}
        query, num = body.get("q", ""), int(body.get("num", 10))
        organic = [{**r, "position": n} for n, r in enumerate(self.made_up(query)[:num], start=1)]
        params = {
            "q": query,
            "gl": body.get("gl", "us"),
            "hl": body.get("hl", "en"),
            "type": "search",
            "num": num,
            "engine": "google",
        }
        params.update({k: body[k] for k in ("page", "tbs", "location", "autocorrect") if k in body})
        return Reply(
            200,
            {
                "searchParameters": params,
                "knowledgeGraph": {"title": query, "type": "Thing", "description": "A knowledge graph entry."},
                "organic": organic,
                "peopleAlsoAsk": [{"question": f"What is {query}?", "snippet": "...", "link": "https://example.com/q"}],
                "relatedSearches": [{"query": f"{query} meaning"}],
                "credits": 1,
            },
        )


class FakeSearXNG(FakeSearchAPI):
    """A SearXNG instance's `/search` with the json format enabled."""

    def answer(self, request: Request) -> Reply:
        if request.path not in ("/", "/search"):
            return Reply(404, "Not Found")
        if request.params.get("format") != "json":
            return Reply(403, "Forbidden")
        query = request.params.get("q", "")
        results = [
            {
                "url": r["link"],
                "title": r["title"],
                "content": r["snippet"],
                "engine": "duckduckgo",
                "engines": ["duckduckgo", "brave"],
                "positions": [n],
                "score": 1.0 / n,
                "category": "general",
                "template": "default.html",
                "parsed_url": ["https", "example.com", "/", "", "", ""],
                "publishedDate": r.get("date"),
            }
            for n, r in enumerate(self.made_up(query), start=1)
        ]
        return Reply(
            200,
            {
                "query": query,
                "number_of_results": 0,
                "results": results,
                "answers": [],
                "corrections": [],
                "infoboxes": [],
                "suggestions": [f"{query} wiki"],
                "unresponsive_engines": [] if results else [["google", "timeout"]],
            },
        )
