"""Search results in Serper's `organic` shape, the one the model was trained on, whatever backend
found them: links decoded for reading, links the model must not follow left out."""

from __future__ import annotations

import re
import string
from typing import Any

BLOCKED_LINKS = ("huggingface.co/datasets", "huggingface.co/spaces", "unifuncs")
UNRESERVED = set(string.ascii_letters + string.digits + "-._~")


def decode_link(url: str) -> str:
    """Percent-escapes decoded so links read as text (`Caf%C3%A9` -> `Café`), except escapes of
    reserved or unsafe characters (`%2F`, `%3F`, `%20`, ...), which would change the URL's meaning."""
    def decode(match: re.Match[str]) -> str:
        text = bytes.fromhex(match.group().replace("%", "")).decode("utf-8", errors="surrogateescape")
        return "".join(ch if _safe(ch) else _escape(ch) for ch in text)

    return re.sub(r"(?:%[0-9A-Fa-f]{2})+", decode, url)


def _safe(ch: str) -> bool:
    return ch in UNRESERVED if ch.isascii() else ch.isprintable() and not ch.isspace()


def _escape(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", errors="surrogateescape"))


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def organic_item(raw: Any, position: int) -> dict[str, Any] | None:
    """One result in Serper's organic shape, or None when it has no link (Serper's fields can be null)."""
    if not isinstance(raw, dict) or not _text(raw.get("link")):
        return None
    item: dict[str, Any] = {"title": _text(raw.get("title")), "link": decode_link(_text(raw["link"])),
                            "snippet": _text(raw.get("snippet"))}
    if raw.get("date"):
        item["date"] = str(raw["date"])
    sitelinks = raw.get("sitelinks") or raw.get("siteLinks")
    if isinstance(sitelinks, list):
        item["sitelinks"] = [{"title": _text(s.get("title")), "link": decode_link(_text(s["link"]))}
                             for s in sitelinks if isinstance(s, dict) and _text(s.get("link"))]
    position = raw.get("position") if isinstance(raw.get("position"), int) else position
    item["position"] = position
    return item


def organic(raw_items: Any, num: int) -> list[dict[str, Any]]:
    """The first `num` usable results, without links the model must not follow."""
    items = [organic_item(raw, n) for n, raw in enumerate(raw_items if isinstance(raw_items, list) else [], 1)]
    kept = [i for i in items if i and not any(b in i["link"].lower() for b in BLOCKED_LINKS)]
    return kept[:num]
