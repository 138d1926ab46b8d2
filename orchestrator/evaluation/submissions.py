"""What ``orchestrator eval`` reads: one JSON submission per line, checked field by field, with line numbers.

A line that is not a valid submission becomes an ``InvalidLine`` naming the line, the id when
there is one, and what is wrong; it never stops the lines after it. Ids must be unique in the
file: a second line with an id already seen is invalid (the first one runs).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..checks import is_integer, is_number
from ..config import MIN_MEMORY_WHY, MIN_SANDBOX_MEMORY
from ..errors import ConfigError
from ..spelling import did_you_mean
from ..units import describe_bytes, describe_duration, parse_duration, parse_size

MAX_ID_CHARS = 200
MAX_FIELD_BYTES = 4 << 20
"""Most bytes each of ``code``, ``tests``, ``stdin`` and ``files`` may take as they travel to the sandbox (JSON text:
an escaped character takes 2 to 6 bytes). Each request to the agent stays well within its 16 MiB header limit."""
MAX_TIMEOUT = 24 * 3600
"""Most seconds a submission may run (its own ``timeout`` or the run's default)."""
FIELDS = ("id", "code", "tests", "stdin", "expected_stdout", "timeout", "memory", "files", "grading")
GRADING_MODES = ("default", "strict")
"""How a submission's tests reach its code (docs/eval.md, "How a verdict is made")."""


@dataclass(frozen=True)
class Submission:
    """One piece of untrusted code to grade.

    Attributes:
        id: unique in its file; names its result.
        code: the Python source under test.
        tests: Python run after ``code`` in the same namespace; an ``AssertionError`` there means failed.
        stdin: what ``input()`` and ``sys.stdin`` read while ``code`` runs (None: nothing, ``input()`` raises EOFError).
        expected_stdout: what ``code`` must print (compared line by line, trailing spaces and blank lines aside).
        timeout: seconds for ``code`` and ``tests`` together, or a duration ("90s"; None: the run's default).
        memory: the sandbox's memory limit, bytes or a size ("256m"; None: the run's default).
        files: relative path -> text, written in the workspace before ``code`` runs.
        grading: "strict" (the tests run in an interpreter of their own and reach the code's functions through
            plain data only) or "default"; None: the run's (``EvalOptions.strict``).

    ``code``, ``tests``, ``stdin`` and ``files`` may each take ``MAX_FIELD_BYTES`` as JSON.
        line: the line of the file it came from (1-based; 0 when built in Python).
    """

    id: str
    code: str
    tests: str | None = None
    stdin: str | None = None
    expected_stdout: str | None = None
    timeout: float | None = None
    memory: int | None = None
    files: dict[str, str] = field(default_factory=dict)
    grading: str | None = None
    line: int = 0

    def __post_init__(self) -> None:
        _check_submission(self)


@dataclass(frozen=True)
class InvalidLine:
    """A line that is not a submission: where, which id (if any), and what is wrong."""

    line: int
    id: str | None
    message: str

    def describe(self) -> str:
        named = f" (id {self.id!r})" if self.id is not None else ""
        return f"line {self.line}{named}: {self.message}"


def read_submissions(lines: Iterable[str | bytes]) -> Iterator[Submission | InvalidLine]:
    """Parse JSONL: each non-blank line one submission, in file order; invalid lines come out as ``InvalidLine``."""

    def parsed() -> Iterator[Submission | InvalidLine]:
        for number, raw in enumerate(lines, start=1):
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            if text.strip():
                yield parse_line(text, number)

    return unique_ids(parsed())


def submissions_from(items: Iterable[Submission | Mapping[str, Any]]) -> Iterator[Submission | InvalidLine]:
    """Submissions given in Python: ``Submission``s or JSON-like dicts (numbered from 1 for the messages)."""

    def parsed() -> Iterator[Submission | InvalidLine]:
        for number, item in enumerate(items, start=1):
            if isinstance(item, Submission):
                yield item
            elif isinstance(item, Mapping):
                yield parse_line(json.dumps(item, default=str), number)
            else:
                yield InvalidLine(number, None, f"a submission is a Submission or a dict, not {type(item).__name__}")

    return unique_ids(parsed())


def unique_ids(items: Iterable[Submission | InvalidLine]) -> Iterator[Submission | InvalidLine]:
    """Pass ``items`` on; a submission whose id came before becomes an ``InvalidLine`` (the first one runs)."""
    seen: dict[str, int] = {}
    for number, item in enumerate(items, start=1):
        if isinstance(item, Submission):
            line = item.line or number
            if item.id in seen:
                yield InvalidLine(line, item.id, f"duplicate id: line {seen[item.id]} has it already")
                continue
            seen[item.id] = line
        yield item


def parse_line(text: str, number: int = 0) -> Submission | InvalidLine:
    """One line of the submissions file."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return InvalidLine(number, None, f"not valid JSON ({exc})")
    if not isinstance(data, dict):
        return InvalidLine(number, None, f"a submission is a JSON object, not {type(data).__name__}")
    raw_id = data.get("id")
    named = raw_id if isinstance(raw_id, str) else (str(raw_id) if isinstance(raw_id, int) else None)
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        listed = ", ".join(name + did_you_mean(name, FIELDS) for name in unknown)
        return InvalidLine(number, named, f"unknown field(s) {listed}; allowed: {', '.join(FIELDS)}")
    try:
        return submission_from_json(data, number)
    except ConfigError as exc:
        return InvalidLine(number, named, str(exc))


def submission_from_json(data: dict[str, Any], line: int = 0) -> Submission:
    """A ``Submission`` from a decoded JSON object (``id`` may be an int; ``memory`` a size like "256m").

    Raises:
        ConfigError: a field is missing or has the wrong type or value.
    """
    if "id" not in data:
        raise ConfigError("missing 'id'")
    raw_id = data["id"]
    if not (isinstance(raw_id, str) or is_integer(raw_id)):
        raise ConfigError(f"'id' must be a string or an integer, not {type(raw_id).__name__}")
    if "code" not in data:
        raise ConfigError("missing 'code'")
    return Submission(
        id=str(raw_id),
        code=data["code"],
        tests=data.get("tests"),
        stdin=data.get("stdin"),
        expected_stdout=data.get("expected_stdout"),
        timeout=data.get("timeout"),
        memory=data.get("memory"),
        files=data.get("files") or {},
        grading=data.get("grading"),
        line=line,
    )


def _check_submission(submission: Submission) -> None:
    if not isinstance(submission.id, str) or not submission.id.strip():
        raise ConfigError("'id' must be a non-empty string")
    if len(submission.id) > MAX_ID_CHARS or any(ord(char) < 32 for char in submission.id):
        raise ConfigError(f"'id' must be at most {MAX_ID_CHARS} printable characters")
    for name in ("code", "tests", "stdin", "expected_stdout"):
        value = getattr(submission, name)
        if name != "code" and value is None:
            continue
        _check_text(f"'{name}'", value)
        if name != "expected_stdout":  # compared on the host: it never travels
            _check_size(name, json.dumps(value, ensure_ascii=False))
    if submission.timeout is not None:
        object.__setattr__(submission, "timeout", read_timeout("'timeout'", submission.timeout))
    if submission.memory is not None:
        object.__setattr__(submission, "memory", read_memory("'memory'", submission.memory))
    _check_files(submission.files)
    if submission.grading is not None and submission.grading not in GRADING_MODES:
        raise ConfigError(f"'grading' must be one of {', '.join(map(repr, GRADING_MODES))}, got {submission.grading!r}")


def read_timeout(what: str, value: object) -> float:
    """A submission's time limit (its own or the run's default) in seconds, from a number or a duration ("90s",
    "2m"): more than 0 seconds, at most a day.

    Raises:
        ConfigError: naming ``what``.
    """
    if not (isinstance(value, str) or is_number(value)):
        raise ConfigError(f"{what} must be a number of seconds or a duration, not {type(value).__name__}")
    try:
        seconds = parse_duration(value)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ConfigError(f"{what} must be more than 0 and at most a day, got {describe_duration(seconds)}")
    return seconds


def read_memory(what: str, value: object) -> int:
    """A sandbox's memory limit in bytes, from bytes or a size ("256m"): at least ``MIN_SANDBOX_MEMORY``.

    Raises:
        ConfigError: naming ``what``.
    """
    if not (isinstance(value, str) or is_integer(value)):
        raise ConfigError(f'{what} must be a size like "256m" or bytes, not {type(value).__name__}')
    try:
        size = parse_size(value)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    if size < MIN_SANDBOX_MEMORY:
        raise ConfigError(
            f"{what} must be at least {MIN_SANDBOX_MEMORY >> 20} MiB{MIN_MEMORY_WHY}, got {describe_bytes(size)}"
        )
    return size


def _check_files(files: Any) -> None:
    if not isinstance(files, dict):
        raise ConfigError(f"'files' must be an object of relative path -> text, not {type(files).__name__}")
    for path, content in files.items():
        normal = posixpath.normpath(path) if isinstance(path, str) else ""
        if not normal or normal.startswith(("/", "../")) or normal in (".", "..") or "\0" in normal:
            raise ConfigError(f"'files': {path!r} must be a relative path inside the workspace")
        _check_text(f"'files': the content of {path!r}", content)
    if files:
        _check_size("files", json.dumps(json.dumps(files, ensure_ascii=False), ensure_ascii=False))


def _check_text(what: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string, not {type(value).__name__}")
    try:
        value.isascii() or value.encode("utf-8")  # the frame would fail on a lone surrogate
    except UnicodeEncodeError:
        raise ConfigError(f"{what} must be valid Unicode text (it has a lone surrogate)") from None


def files_payload(files: Mapping[str, str]) -> str:
    """How ``files`` travel: one JSON text (the sandbox reads it from its stdin while placing them)."""
    return json.dumps(files, ensure_ascii=False)


def _check_size(name: str, travelling: str) -> None:
    size = len(travelling.encode("utf-8", "surrogatepass"))
    if size > MAX_FIELD_BYTES:
        raise ConfigError(
            f"'{name}' takes {size} bytes as JSON; at most {MAX_FIELD_BYTES} travel to the sandbox per field "
            "(escaped characters such as tabs and control characters count 2 to 6 bytes)"
        )
