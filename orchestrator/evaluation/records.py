"""The results of an evaluation: one record per submission, the results file, the JUnit report.

The results file is JSON lines, appended and flushed (and fsynced) as each submission ends,
so a crash loses no finished result; a line cut short by a crash is dropped when the file is
resumed. When an id appears twice (an ``infra_error`` run again by ``--resume``), the last
record counts.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any
from xml.etree import ElementTree

from ..errors import ConfigError
from ..files import replace_file
from ..safe_text import visible
from .grading import Status
from .submissions import InvalidLine

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_JUNIT_OUTPUT_CHARS = 64 << 10


@dataclass(frozen=True)
class EvalResult:
    """What one submission did: its outcome, its output and what ran it.

    Attributes:
        status: the outcome (``Status``); ``message`` says it in a sentence.
        phase: "code" or "tests": the cell that decided a non-passing outcome.
        stdout, stderr: what the code (and tests) printed, at most the run's output limit
            (``output_truncated``: the submission printed more and was stopped; the rest is not kept).
        error: the exception (type, message, line, snippet, traceback of the user's frames).
        diff: expected_stdout against stdout, when they differ.
        durations: seconds: ``total`` (from taking a sandbox to the verdict), ``sandbox`` (waiting
            for a started sandbox), ``code`` and ``tests`` (inside the sandbox).
        limits: what the sandbox ran under: timeout, memory, cpus, pids, output, network.
        image, image_id: the sandbox image's tag and id.
        grading: "default" or "strict": how its tests reached its code (docs/eval.md).
        cpu_seconds: CPU time of the sandbox's cgroup while it ran (the engine's counter; None: not known).
        wall_seconds: the host's clock around its code and tests.
        peak_memory: the most bytes its sandbox's cgroup was charged (the engine's; the idle agent included).
        signal: the signal that ended its interpreter ("SIGSEGV"), from the grading harness's ``waitpid``.
        runs: each run's status, message and figures (``--runs``), in order.
        flaky: the runs' statuses differ.

    Where each figure comes from: ``accounting``.
    """

    id: str
    status: Status
    message: str
    line: int = 0
    phase: str | None = None
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    error: dict[str, Any] | None = None
    diff: str | None = None
    durations: dict[str, float] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    image: str = ""
    image_id: str | None = None
    sandbox_id: str | None = None
    finished_at: float = 0.0
    grading: str = "default"
    cpu_seconds: float | None = None
    wall_seconds: float | None = None
    peak_memory: int | None = None
    signal: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    flaky: bool = False

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EvalResult:
        """A record read back from a results file (unknown fields ignored).

        Raises:
            ConfigError: it has no id or no known status.
        """
        if not isinstance(data.get("id"), str):
            raise ConfigError("a result record without an 'id'")
        try:
            status = Status(data.get("status"))
        except ValueError:
            raise ConfigError(f"result {data['id']!r} has an unknown status {data.get('status')!r}") from None
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        for name, fits in _FIGURES.items():  # an earlier version's record has none; an edited one may be wrong
            if name in known and not fits(known[name]):
                del known[name]
        return cls(**{**known, "status": status})


def _is_seconds(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e12)


_FIGURES: dict[str, Callable[[Any], bool]] = {
    "cpu_seconds": _is_seconds,
    "wall_seconds": _is_seconds,
    "peak_memory": lambda value: value is None or (type(value) is int and value >= 0),
    "signal": lambda value: value is None or isinstance(value, str),
    "runs": lambda value: isinstance(value, list) and all(isinstance(run, dict) for run in value),
    "flaky": lambda value: isinstance(value, bool),
}


class ResultsFile:
    """The ``--out`` file: replaced by a new run, or kept (resume) with what an earlier run finished read; then one
    flushed line per result."""

    def __init__(self, path: Path, *, resume: bool, fsync: bool = True) -> None:
        """Open ``path``: to be emptied when the run begins (a new run), or kept and repaired (``resume``).

        A new run's file keeps what it holds until ``begin()`` (or the first ``append``), so a run
        that cannot start (no image, no engine) leaves the results of the run before it.

        Raises:
            ConfigError: the file cannot be opened, or a complete line of it is not a result record.
        """
        self.path = path
        self._fsync = fsync
        self._empty_at_begin = not resume
        self.previous: dict[str, EvalResult] = {}
        try:
            if resume and path.exists():
                self.previous = _read_records(path)
            # errors="replace": a lone surrogate (valid in the JSON a sandbox sends) must not stop the run's writes
            self._file: IO[str] = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        except OSError as exc:
            raise ConfigError(f"cannot open the results file {path}: {exc}") from None

    def begin(self) -> None:
        """The run starts: a new run's file is emptied now. Calling it again does nothing."""
        if self._empty_at_begin:
            self._empty_at_begin = False
            self._file.close()  # opened again as "w" empties it: also what cannot be truncated (/dev/null, a pipe)
            try:
                self._file = open(self.path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
            except OSError as exc:
                raise ConfigError(f"cannot open the results file {self.path}: {exc}") from None

    def finished(self) -> set[str]:
        """Ids an earlier run finished (an ``infra_error`` is not finished: it runs again)."""
        return {key for key, record in self.previous.items() if record.status is not Status.INFRA_ERROR}

    def append(self, result: EvalResult) -> None:
        """Write one record and make it durable before returning."""
        self.begin()
        self._file.write(json.dumps(result.to_json(), ensure_ascii=False, allow_nan=False) + "\n")
        self._file.flush()
        if self._fsync:
            try:
                os.fsync(self._file.fileno())
            except OSError as exc:  # EINVAL: a file that cannot be synced (/dev/null, a pipe): nothing to make durable
                if exc.errno != errno.EINVAL:
                    raise

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_records(path: Path) -> dict[str, EvalResult]:
    """Every complete record of a results file; a last line cut short by a crash is removed from the file."""
    raw = path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    if len(complete) != len(raw):
        with open(path, "r+b") as handle:
            handle.truncate(len(complete))
    records: dict[str, EvalResult] = {}
    for number, line in enumerate(complete.decode("utf-8", "replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = EvalResult.from_json(json.loads(line, parse_constant=_not_json))
        except (ValueError, TypeError, ConfigError) as exc:
            raise ConfigError(
                f"{path} line {number} is not a result record ({exc}); is it the results file of an earlier run?"
            ) from None
        records[record.id] = record
    return records


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def status_counts(results: Iterable[EvalResult]) -> dict[Status, int]:
    counts = dict.fromkeys(Status, 0)
    for result in results:
        counts[result.status] += 1
    return counts


def _xml_text(text: str, limit: int = _JUNIT_OUTPUT_CHARS, *, multiline: bool = True) -> str:
    """Sandbox-made text as JUnit holds it: control and format characters shown as escapes (a report printed
    on a terminal obeys none), what XML cannot hold replaced."""
    text = text if len(text) <= limit else text[:limit] + "\n[... cut for the report ...]"
    return _NOT_XML.sub("\ufffd", visible(text, multiline=multiline))


def junit_properties(result: EvalResult) -> dict[str, str]:
    """A result's figures as its testcase's ``<properties>`` (a figure not known is left out)."""
    properties = {
        "cpu_seconds": None if result.cpu_seconds is None else f"{result.cpu_seconds:.3f}",
        "wall_seconds": None if result.wall_seconds is None else f"{result.wall_seconds:.3f}",
        "peak_memory": None if result.peak_memory is None else str(result.peak_memory),
        "signal": result.signal,
        "status": result.status.value,
        "runs": str(len(result.runs)) if result.runs else None,
        "verdicts": ",".join(str(run.get("status")) for run in result.runs) if len(result.runs) > 1 else None,
        "flaky": "true" if result.flaky else None,
    }
    return {key: value for key, value in properties.items() if value is not None}


def _add_properties(parent: ElementTree.Element, properties: Mapping[str, str]) -> None:
    if properties:
        holder = ElementTree.SubElement(parent, "properties")
        for key, value in properties.items():
            ElementTree.SubElement(holder, "property", name=key, value=_xml_text(value, multiline=False))


def write_junit(
    path: Path,
    results: Iterable[EvalResult],
    invalid: Iterable[InvalidLine],
    *,
    name: str,
    seconds: float,
    properties: Mapping[str, str] | None = None,
) -> None:
    """A JUnit XML report: a testcase per submission (``failure`` for failed, ``error`` for the other
    non-passing outcomes with the status as its type) and per invalid input line; each testcase's figures as its
    ``<properties>`` (``junit_properties``), ``properties`` as the suite's."""
    results = list(results)
    invalid = list(invalid)
    counts = status_counts(results)
    failures = counts[Status.FAILED]
    errors = len(results) - failures - counts[Status.PASSED] + len(invalid)
    suite = ElementTree.Element(
        "testsuite",
        name=name,
        tests=str(len(results) + len(invalid)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
        time=f"{seconds:.3f}",
    )
    _add_properties(suite, properties or {})
    for result in results:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=name,
            name=_xml_text(result.id, multiline=False),
            time=f"{result.durations.get('total', 0):.3f}",
        )
        _add_properties(case, junit_properties(result))
        if not result.passed:
            kind = "failure" if result.status is Status.FAILED else "error"
            detail = "\n\n".join(
                part for part in (result.diff, (result.error or {}).get("traceback")) if isinstance(part, str) and part
            )
            message = _xml_text(result.message, multiline=False)
            element = ElementTree.SubElement(case, kind, type=result.status.value, message=message)
            element.text = _xml_text(detail)
        if result.stdout:
            ElementTree.SubElement(case, "system-out").text = _xml_text(result.stdout)
        if result.stderr:
            ElementTree.SubElement(case, "system-err").text = _xml_text(result.stderr)
    for line in invalid:
        case = ElementTree.SubElement(suite, "testcase", classname=name, name=_xml_text(f"line {line.line}"))
        ElementTree.SubElement(case, "error", type="invalid_input", message=_xml_text(line.describe()))
    ElementTree.indent(suite)
    try:
        replace_file(path, ElementTree.tostring(suite, encoding="utf-8", xml_declaration=True))
    except OSError as exc:
        raise ConfigError(f"cannot write the JUnit report {path}: {exc}") from None
