"""Fetching a web page safely and turning it into text.

The model chooses the URLs, so every fetch goes through the egress guard (`egress.py`): only http(s),
and no connection to loopback, private, link-local or otherwise non-public addresses (unless allowed),
checked where the connection is made, after DNS resolution and for every redirect hop.
HTML becomes markdown (trafilatura); PDF becomes text (pypdf).
"""

from __future__ import annotations

import codecs
import io
from dataclasses import dataclass

from nanbeige.tools import egress
from nanbeige.tools.egress import FetchError, FetchPolicy

BROWSER_UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"


@dataclass
class Page:
    """A fetched page as text."""

    url: str
    """Final URL, after redirects."""
    text: str
    """Markdown for HTML, plain text for PDF and text types."""
    content_type: str


async def fetch_direct(url: str, policy: FetchPolicy, headers: dict[str, str] | None = None) -> Page:
    """GET a URL through the guard and convert it to text. Raises FetchError with a readable reason."""
    reply = await egress.get(url, policy, {"User-Agent": BROWSER_UA, **(headers or {})})
    if reply.status >= 400:
        raise FetchError(f"HTTP {reply.status} {reply.reason} for {url}")
    content_type = reply.headers.get("content-type", "")
    return Page(url=reply.url, text=to_text(reply.body, content_type, reply.url), content_type=content_type)


def to_text(body: bytes, content_type: str, url: str = "") -> str:
    """Page bytes as text: PDF through pypdf, HTML through trafilatura, anything else decoded."""
    if body.startswith(b"%PDF") or "application/pdf" in content_type:
        return pdf_to_text(body)
    text = body.decode(_charset(content_type), errors="replace")
    if "html" in content_type or text.lstrip()[:200].lower().startswith(("<!doctype html", "<html")):
        return html_to_markdown(text, url)
    return text


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.lower() == "charset":
            try:
                return codecs.lookup(value.strip('"')).name
            except LookupError:
                break
    return "utf-8"


def html_to_markdown(html: str, url: str = "") -> str:
    import trafilatura  # imported on first use: it loads lxml and friends

    markdown = trafilatura.extract(
        html,
        url=url or None,
        output_format="markdown",
        include_links=True,
        include_tables=True,
        include_formatting=True,
        include_images=False,
        favor_recall=True,
    )
    if markdown:
        return markdown
    # No main content found (a bare page or an app shell): fall back to all visible text.
    return trafilatura.html2txt(html) or ""


def pdf_to_text(body: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(body))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError) as exc:
        raise FetchError(f"the PDF could not be read: {exc}") from None
    return "\n\n".join(f"--- page {i} ---\n{text.strip()}" for i, text in enumerate(pages, start=1))
