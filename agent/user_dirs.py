"""The user's own folders: where nanbeige keeps what belongs to the person running it, never to a folder
they stand in or a file handed over (their settings file, the settings files they trusted, their cache key)."""

from __future__ import annotations

import os
from pathlib import Path


def config_dir() -> Path:
    """nanbeige's folder in the user's config folder (the platform's: `$XDG_CONFIG_HOME`, else `~/.config`;
    a relative `$XDG_CONFIG_HOME` is ignored, as the XDG specification says)."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    return (Path(base) if Path(base).is_absolute() else Path.home() / ".config") / "nanbeige"


def cache_dir() -> Path:
    """nanbeige's folder in the user's cache folder (`$XDG_CACHE_HOME`, else `~/.cache`; a relative
    `$XDG_CACHE_HOME` is ignored): what can be made again, kept to save time (de-quantized GGUF weights)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(base) if Path(base).is_absolute() else Path.home() / ".cache") / "nanbeige"
