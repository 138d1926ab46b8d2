"""``orchestrator eval``: grade untrusted submissions in bulk, each in a fresh hardened sandbox (docs/eval.md)."""

from .evaluator import EvalOptions, EvalReport, Evaluator, sweep_dead_runs
from .grading import Status
from .records import EvalResult, ResultsFile, write_junit
from .submissions import InvalidLine, Submission, read_submissions, submission_from_json, submissions_from

__all__ = [
    "EvalOptions",
    "EvalReport",
    "EvalResult",
    "Evaluator",
    "InvalidLine",
    "ResultsFile",
    "Status",
    "Submission",
    "read_submissions",
    "submission_from_json",
    "submissions_from",
    "sweep_dead_runs",
    "write_junit",
]
