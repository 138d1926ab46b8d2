"""The data-only boundary between a submission and its tests: what crosses, exactly typed and bounded; every
input may come from hostile code."""

from __future__ import annotations

import math

import pytest

from orchestrator.agent import boundary

PLAIN = [
    None,
    True,
    False,
    0,
    -7,
    10**15 - 1,
    10**15,
    -(10**40),
    math.factorial(3000),
    1.5,
    -0.0,
    1e308,
    math.inf,
    -math.inf,
    "",
    "text with \x00 and \u202e and \ud800",
    b"",
    b"\x00\xff raw",
    [],
    [1, [2, [3]]],
    (),
    (1,),
    ("a", (1, 2.5), [None]),
    {},
    {"a": 1, 2: "b", (1, 2): [3], None: {frozenset({1}): b"x"}},
    {1, 2, (3, 4)},
    frozenset({"a", frozenset({1})}),
]


@pytest.mark.parametrize("value", PLAIN, ids=lambda v: type(v).__name__)
def test_plain_values_cross_unchanged_with_their_exact_types(value: object) -> None:
    back = boundary.decode(boundary.encode(value))
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)


def test_nan_crosses_as_nan() -> None:
    back = boundary.decode(boundary.encode([math.nan]))
    assert math.isnan(back[0])


def test_a_tuple_stays_a_tuple_and_a_list_a_list_inside_each_other() -> None:
    value = [(1, [2, (3,)]), {"k": (4,)}]
    back = boundary.decode(boundary.encode(value))
    assert type(back[0]) is tuple and type(back[0][1]) is list and type(back[0][1][1]) is tuple
    assert type(back[1]["k"]) is tuple


class LyingInt(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class Anything:
    def __eq__(self, other: object) -> bool:
        return True


class MyList(list):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize(
    "value",
    [LyingInt(3), Anything(), MyList([1]), [1, Anything()], {"k": LyingInt(1)}, bytearray(b"x"), print, 1j, range(3)],
    ids=[
        "int-subclass",
        "object",
        "list-subclass",
        "nested",
        "dict-value",
        "bytearray",
        "function",
        "complex",
        "range",
    ],
)
def test_anything_but_exact_plain_types_is_refused(value: object) -> None:
    with pytest.raises(boundary.NotData, match="not plain data"):
        boundary.encode(value)


def test_cycles_depth_and_counts_are_bounded() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(boundary.NotData, match="deeper"):
        boundary.encode(cycle)
    deep: list[object] = []
    for _ in range(boundary.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(boundary.NotData, match="deeper"):
        boundary.encode(deep)
    with pytest.raises(boundary.NotData, match="more than"):
        boundary.encode([0] * (boundary.MAX_ITEMS + 1))


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"a": 1}', "JSON object"),
        (b"NaN", "NaN"),
        (b'["f", "NaN"]', "malformed float"),
        (b"[1]", "list is not part"),
        (b"[]", "list is not part"),
        (b'["q", 1]', "unknown tag"),
        (b'["i", "12"]', "malformed big int"),
        (b'["i", "0x1", "0x2"]', "malformed"),
        (b"12345678901234567890", "must be tagged"),
        (b'["b", "not base64!"]', "malformed bytes"),
        (b'["d", ["l"], 1]', "unhashable"),
        (b'["s", ["d"]]', "unhashable"),
        (b'["d", 1]', "a key and no value"),
        (b"[" * 100000, "not valid JSON"),
        (b'"\xff"', "not valid JSON"),
        (b"1 2", "not valid JSON"),
    ],
)
def test_bytes_that_are_not_an_encoding_are_refused(raw: bytes, why: str) -> None:
    with pytest.raises(boundary.NotData, match=why):
        boundary.decode(raw)


def test_too_deep_an_encoding_is_refused_not_a_recursion_error() -> None:
    raw = ('["l",' * (boundary.MAX_DEPTH + 5) + "1" + "]" * (boundary.MAX_DEPTH + 5)).encode()
    with pytest.raises(boundary.NotData, match="deeper"):
        boundary.decode(raw)


def test_exceptions_cross_by_builtin_name_only() -> None:
    raised = boundary.builtin_exception("ValueError", "bad", AssertionError)
    assert type(raised) is ValueError and str(raised) == "bad"
    for name in ("SystemExit", "KeyboardInterrupt", "MyError", "os.system", None, "UnicodeDecodeError"):
        fallback = boundary.builtin_exception(name, "text", AssertionError)
        assert type(fallback) is AssertionError and "the submission raised" in str(fallback), name


def test_an_exception_of_the_submissions_class_crosses_as_its_builtin_base() -> None:
    class Missing(KeyError):
        pass

    assert boundary.builtin_base(Missing("k")) == "KeyError"
    assert boundary.builtin_base(ValueError()) == "ValueError"
