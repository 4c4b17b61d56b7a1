"""Search results as the model's training harness (MiroThinker v1.0's `search_and_scrape_webpage`
server) passed them on: Serper's organic items whole, minus links into Hugging Face datasets and
spaces, and every string holding a `%` percent-decoded, except the escapes listed in KEPT_ESCAPES.

Backends without Serper's items (SearXNG, the local index) get items in Serper's shape from
`organic`, and the same blocking and decoding.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

# Substrings of a link (as found, before decoding; case as written) that drop its result.
BLOCKED_LINKS = ("huggingface.co/datasets", "huggingface.co/spaces")
# Escapes of characters that would change a URL's meaning (or, for %25, start a new escape); the
# reference left them encoded, uppercased, whatever their case among those listed here. The others,
# `%3d` and `%2b` in lower case included, were decoded.
KEPT_ESCAPES = re.compile("%2F|%2f|%3F|%3f|%23|%26|%3D|%20|%2B|%25")


def decode_percent(text: str) -> str:
    """`text` with its percent-escapes decoded as UTF-8, bytes that do not decode dropped, and the
    KEPT_ESCAPES left as escapes (uppercased): `Caf%C3%A9_%28x%29` -> `Café_(x)`, `a%2fb` -> `a%2Fb`."""
    if "%" not in text:
        return text
    pieces = KEPT_ESCAPES.split(text)
    kept = [escape.upper() for escape in KEPT_ESCAPES.findall(text)]
    # The pieces between kept escapes are decoded apart: a multi-byte character cannot span a kept
    # escape, so this is the same as decoding the whole around them.
    decoded = [unquote(piece, encoding="utf-8", errors="ignore") for piece in pieces]
    return "".join(d + k for d, k in zip(decoded, kept + [""]))


def decode_strings(value: Any) -> Any:
    """`value` with `decode_percent` applied to every string inside it, through dicts (their values,
    not their keys) and lists; other values unchanged."""
    if isinstance(value, str):
        return decode_percent(value)
    if isinstance(value, list):
        return [decode_strings(v) for v in value]
    if isinstance(value, dict):
        return {k: decode_strings(v) for k, v in value.items()}
    return value


def blocked(item: Any) -> bool:
    link = item.get("link") if isinstance(item, dict) else None
    return isinstance(link, str) and any(b in link for b in BLOCKED_LINKS)


def serper_organic(raw_items: Any) -> list[Any]:
    """Serper's organic items as it sent them, every field and in its order, without blocked links.
    Serper honours `num` itself, so nothing is cut (fewer come back when some are blocked)."""
    return [item for item in raw_items if not blocked(item)] if isinstance(raw_items, list) else []


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def organic_item(raw: Any, position: int) -> dict[str, Any] | None:
    """A result of another backend in Serper's organic shape, or None when it has no link."""
    if not isinstance(raw, dict) or not _text(raw.get("link")):
        return None
    item: dict[str, Any] = {
        "title": _text(raw.get("title")),
        "link": _text(raw["link"]),
        "snippet": _text(raw.get("snippet")),
    }
    if raw.get("date"):
        item["date"] = str(raw["date"])
    item["position"] = raw.get("position") if isinstance(raw.get("position"), int) else position
    return item


def organic(raw_items: Any, num: int) -> list[dict[str, Any]]:
    """The first `num` usable results of a backend other than Serper (which do not stop at `num`
    themselves), in Serper's shape, without blocked links."""
    items = [organic_item(raw, n) for n, raw in enumerate(raw_items if isinstance(raw_items, list) else [], 1)]
    return [i for i in items if i and not blocked(i)][:num]
