"""The one description of an OpenAI-compatible chat endpoint that a helper model is asked at: the LLM judge
(`evals/judges.py`), the turn critic (`trainer/critic.py`), the question writer (`trainer/synth.py`) and the
page extractor of the scrape tool (`tools/scrape.py`).

It lives here, in the lowest layer, because the scrape tool uses it and `tools/` imports nothing above it;
evals, the trainer and the CLI may all import from here. Each use keeps its own defaults as a constant
(`JUDGE_ENDPOINT`, `CRITIC_ENDPOINT`, `SYNTH_ENDPOINT`, `EXTRACTION_ENDPOINT`) next to the code that asks,
and a setting changed by a flag or an environment variable is `dataclasses.replace` of that constant.
How one call is made stays with each use (`evals/endpoint.py` for the judge, critic and writer).

The agent's own model (`agent/backends/llm.LLMConfig`) is not one of these: it streams, has a retry budget in seconds
that follows Retry-After, and takes its sampling from the dialect; it shares only the defaults below.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

LOCAL_BASE_URL = "http://127.0.0.1:8000/v1"
"""Where `nanbeige serve` answers: the agent's own model server."""
LOCAL_MODEL = "Nanbeige/Nanbeige4.1-3B"
"""The agent's own model."""
OPENAI_BASE_URL = "https://api.openai.com/v1"
"""OpenAI's API, where the judges' and the critic's default models are served."""


@dataclass(frozen=True)
class ChatEndpoint:
    """How to reach a helper chat model and how to ask it. Frozen: the per-use defaults are shared
    constants, changed only by `dataclasses.replace`."""

    base_url: str
    """OpenAI-compatible endpoint, up to and including `/v1`."""
    model: str | None
    """Model name sent with every request (and recorded where the use records one). None only for the
    LLM judge: each judge profile's own model."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token, if the server wants one. Never printed or logged."""
    temperature: float = 0.0
    """Sampling temperature. Unused by the LLM judge, whose profiles send their source's own fields."""
    max_tokens: int = 1024
    """Most tokens one reply may have. Unused by the LLM judge, as `temperature`."""
    timeout_s: float = 120.0
    """Most seconds one call may take in all, from the request to the answer's last byte."""
    retries: int = 2
    """How many times to ask again after a transport error or a 408/429/5xx answer (the critic: or a
    malformed reply)."""
    retry_wait_s: float = 1.0
    """Wait before the first retry; doubled for each later one."""
    more_base_urls: tuple[str, ...] = ()
    """Further endpoints serving the same model: the calls are spread over all of them, and one that fails
    is passed over for the next (`evals/endpoint.py`)."""
    template: Path | None = None
    """A file whose text replaces the use's built-in prompt verbatim (`--judge-template`,
    `--critic-template`); None: the built-in one. Unused by the question writer and the extractor."""


# scheme://userinfo@host...: the userinfo ends at the last @ before the path
URL_CREDENTIALS = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)@")


def url_credentials(value: str) -> list[str]:
    """The secrets in a URL's `user:password@`: the user:password text and the password alone, as
    written and percent-decoded (an error message may quote either)."""
    found = URL_CREDENTIALS.match(value.strip())
    if not found:
        return []
    userinfo = found.group(2)
    spelled = [userinfo, userinfo.partition(":")[2]]
    return spelled + [urllib.parse.unquote(s) for s in spelled if urllib.parse.unquote(s) != s]


def without_credentials(value: str) -> str:
    return URL_CREDENTIALS.sub(r"\1", value.strip()) if URL_CREDENTIALS.match(value.strip()) else value
