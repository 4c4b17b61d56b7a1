"""A loopback web site for scraping tests: an article page with navigation and ads, a PDF, a
redirect, a 404, and a fake Jina Reader that serves any URL as markdown."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pdf import make_pdf

ARTICLE = """<!doctype html><html><head><title>The Orbit of Mars</title></head><body>
<nav><a href="/">Home</a> | <a href="/news">News</a> | <a href="/shop">Shop</a></nav>
<div class="ad">BUY CHEAP TELESCOPES NOW! Limited offer!</div>
<article><h1>The Orbit of Mars</h1>
<p>Mars orbits the Sun at an average distance of 227.9 million kilometres. One Martian year lasts
687 Earth days. Its orbit is more eccentric than Earth's, with an eccentricity of 0.0934.</p>
<p>The planet was visited by the Viking 1 lander in 1976, the first successful landing on Mars.
Later missions include Pathfinder (1997), Spirit and Opportunity (2004) and Curiosity (2012).</p>
</article>
<footer>Copyright Example Space News. <a href="/privacy">Privacy</a></footer>
</body></html>"""


class Site:
    """`with Site() as site:` serves on 127.0.0.1; `site.url(path)`; `site.requests` logs (path, headers).
    `jina_status` makes the Jina endpoint (`/jina/<url>`) answer with that status first."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.jina_statuses: list[int] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_port

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> Site:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                site.requests.append((self.path, dict(self.headers)))
                if self.path.startswith("/jina/"):
                    status = site.jina_statuses.pop(0) if site.jina_statuses else 200
                    target = self.path[len("/jina/") :]
                    body = f"Title: Mars\n\nURL Source: {target}\n\nMarkdown Content:\nMars has two moons."
                    self.reply(
                        status,
                        body.encode() if status == 200 else b'{"code": %d}' % status,
                        "text/plain" if status == 200 else "application/json",
                        {"Retry-After": "0"},
                    )
                elif self.path == "/article":
                    self.reply(200, ARTICLE.encode(), "text/html; charset=utf-8")
                elif self.path == "/paper.pdf":
                    self.reply(200, make_pdf(["Phobos orbits Mars in 7 hours and 39 minutes."]), "application/pdf")
                elif self.path == "/long.txt":
                    body = "".join(f"Line {i}: the Red Planet has seasons and dust storms.\n" for i in range(400))
                    self.reply(200, body.encode(), "text/plain")
                elif self.path.startswith("/redirect?to="):
                    self.reply(302, b"", "text/plain", {"Location": self.path.split("=", 1)[1]})
                else:
                    self.reply(404, b"not found", "text/plain")

        return Handler
