"""Every fenced example of README.md and docs/*.md runs as written (the convention: tests/docs/README.md).

One test per block, named by the document and line (``test_example[README.md:63]``). A document's
blocks run in order in one namespace, directory and store; when one fails, the later blocks of
that document are skipped, naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_fences import NOT_EXAMPLES, PARSED, RUN, Fence, read_fences
from doc_runner import DocumentRun

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _examples() -> list[Fence]:
    return [fence for document in DOCUMENTS for fence in read_fences(document) if fence.language not in NOT_EXAMPLES]


EXAMPLES = _examples()
LAST_OF_DOCUMENT = {fence.path: fence for fence in EXAMPLES if fence.not_run is None}


def _param(fence: Fence) -> object:
    marks: list[pytest.MarkDecorator] = []
    if fence.language in RUN:
        marks.append(pytest.mark.docker)
    if fence.not_run is not None:
        marks.append(pytest.mark.skip(reason=f"not run: {fence.not_run}"))
    return pytest.param(fence, id=fence.where, marks=marks)


class _Current:
    """The document whose blocks are running, opened at its first block and closed after its last."""

    run: DocumentRun | None = None

    @classmethod
    def open(cls, document: Path) -> DocumentRun:
        if cls.run is not None and cls.run.document != document:
            cls.close()
        if cls.run is None:
            cls.run = DocumentRun(document)
        return cls.run

    @classmethod
    def close(cls) -> None:
        run, cls.run = cls.run, None
        if run is not None:
            run.close()


@pytest.fixture(scope="module", autouse=True)
def _close_last_document() -> Iterator[None]:
    yield
    _Current.close()


@pytest.fixture
def document(fence: Fence) -> Iterator[DocumentRun]:
    run = _Current.open(fence.path)
    yield run
    if LAST_OF_DOCUMENT[fence.path] is fence:
        _Current.close()


@pytest.mark.parametrize("fence", [_param(fence) for fence in EXAMPLES])
def test_example(fence: Fence, document: DocumentRun) -> None:
    if fence.language not in RUN | PARSED:
        pytest.fail(
            f"{fence.where}: the docs tests do not know how to run a ```{fence.language} block: use one of "
            f"{sorted(RUN | PARSED)}, or mark it <!-- not run: why --> (tests/docs/README.md)"
        )
    if document.failed is not None:
        pytest.skip(f"an earlier block of {fence.path.name} failed ({document.failed})")
    try:
        document.run(fence)
    except BaseException:
        document.failed = fence.where
        raise
