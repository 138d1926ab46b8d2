"""Durations and sizes: one grammar for each, read wherever a person writes one, and printed in two units at most.

Every place that takes a duration or a size reads it here: CLI flags (``duration_argument``,
``size_argument``), ``ORCH_*`` variables and ``Settings`` fields (config.py), and evaluation options and
submissions (evaluation/). So ``5m`` means the same everywhere it is accepted.

Durations (seconds): a number of seconds (``90``, ``2.5``), or one or more terms of a number and a unit,
``s``, ``m``, ``h`` or ``d``, largest first or in any order, spaces allowed (``90s``, ``5m``, ``1.5h``,
``1h30m``, ``1h 30m``, ``7d``). Case does not matter. Never negative, never NaN or infinite.

Sizes (bytes), as ``docker run --memory`` reads them: a whole number of bytes (``2048``), or a number
and a unit ``k``, ``m``, ``g`` or ``t`` (binary: 1k = 1024 bytes), optionally followed by ``b`` or ``ib``
(``512m``, ``512MB``, ``512MiB``, ``1.5g``, ``2G``). Never negative.
"""

from __future__ import annotations

import argparse
import math
import re

from .checks import is_integer, is_number
from .errors import ConfigError

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION_TERM = re.compile(rf"({_NUMBER})\s*([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE = re.compile(rf"^\s*({_NUMBER})\s*(?:([kmgt])(i?b)?|(b))?\s*$", re.IGNORECASE)
_BYTES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_UNITS = (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1))

DURATION_HELP = "seconds, or a number with s, m, h or d (e.g. 90, 30s, 5m, 1h30m, 1.5h)"
"""What a duration may be, in the words every error and help text uses."""
SIZE_HELP = "bytes, or a number with k, m, g or t (e.g. 2048, 512m, 2g, 1.5g; 1k = 1024)"
"""What a size may be, in the words every error and help text uses."""


def parse_duration(text: str | float) -> float:
    """Seconds in a duration ("90", "30s", "5m", "1h30m", "1.5h", "7d"; or a number of seconds).

    Raises:
        ConfigError: not a duration, negative, NaN or infinite.
    """
    if is_number(text):
        seconds = float(text)
    elif isinstance(text, str):
        spelled = text.strip().lower()
        if re.fullmatch(_NUMBER, spelled):
            seconds = float(spelled)
        else:
            terms = _DURATION_TERM.findall(spelled)
            if not terms or _DURATION_TERM.sub("", spelled).strip():
                raise ConfigError(f"{text!r} is not a duration: use {DURATION_HELP}")
            seconds = sum(float(number) * _SECONDS[unit] for number, unit in terms)
    else:
        raise ConfigError(f"{text!r} is not a duration: use {DURATION_HELP}")
    if not 0 <= seconds < math.inf:
        raise ConfigError(f"a duration must be a finite number of seconds, not negative, got {text!r}")
    return seconds


def parse_size(text: str | int) -> int:
    """Bytes in a size ("512m", "2g", "10MB", "1.5g", "2048"; or an int of bytes), 1024-based as Docker's.

    Raises:
        ConfigError: not a size, or negative.
    """
    if is_integer(text):
        if text < 0:
            raise ConfigError(f"a size must not be negative, got {text!r}")
        return text
    match = _SIZE.match(text) if isinstance(text, str) else None
    if not match:
        raise ConfigError(f"{text!r} is not a size: use {SIZE_HELP}")
    number, unit, _, _ = match.groups()
    size = float(number) * _BYTES[unit.lower()] if unit else float(number)
    if not size.is_integer() and not unit:
        raise ConfigError(f"{text!r} is not a size: a number of bytes is whole")
    return int(size)


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
    """An argparse ``type``: seconds from "90", "30m", "1h30m" (``parse_duration``)."""
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


def size_argument(text: str) -> int:
    """An argparse ``type``: bytes from "512m", "2g", "2048" (``parse_size``)."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
