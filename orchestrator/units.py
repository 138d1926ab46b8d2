"""Durations and sizes for people: printed in two units at most, and read from command lines."""

from __future__ import annotations

import argparse

from .config import parse_duration
from .errors import ConfigError

_DURATION_UNITS = (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1))


def describe_duration(seconds: float | None) -> str:
    """Two units are enough for a person: 40s, 3m 12s, 2h 5m, 3d 4h; "-" for unknown."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    for unit, size, smaller, smaller_size in _DURATION_UNITS:
        if whole >= size:
            rest = (whole % size) // smaller_size
            return f"{whole // size}{unit}" + (f" {rest}{smaller}" if rest else "")
    return f"{whole}s"


def describe_bytes(size: int | None) -> str:
    """1023 B, 4.2 KiB, 3.0 MiB, 1.5 GiB; "-" for unknown."""
    if size is None:
        return "-"
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def duration_argument(text: str) -> float:
    """An argparse ``type``: seconds from "90", "30m", "1h30m"."""
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def optional_duration_argument(text: str) -> float | None:
    """Like ``duration_argument``, but empty means off (so compose can pass ``--older-than=${VAR:-}``)."""
    return duration_argument(text) if text.strip() else None


def positive_duration_argument(text: str) -> float:
    """Like ``duration_argument``, more than 0 seconds."""
    seconds = duration_argument(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return seconds
