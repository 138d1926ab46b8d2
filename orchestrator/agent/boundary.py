"""The data-only boundary of strict grading: plain values as tagged JSON, never objects.

Standard library only (runs in the sandbox). In strict grading the tests run in an interpreter
of their own and reach the submission's functions through stubs: a call sends its arguments
as data and gets the result back as data (docs/eval.md, "Strict mode"). Only values of these
exact builtin types cross: None, bool, int, float (inf and nan too), str, bytes, list, tuple,
dict, set and frozenset. A subclass (an int whose ``__eq__`` always says True) is refused, so is
anything else, and so is a value past the bounds on nesting, item count and size. Every value
the tests see is built here, on their side, from the decoded JSON: no object of the submission's
ever reaches them.

The encoding: None, bool, str, finite floats and ints of at most 15 digits are JSON as they are;
every other value is a JSON array whose first element tags it: ``["l", ...]`` list, ``["t", ...]``
tuple, ``["s", ...]`` set, ``["z", ...]`` frozenset, ``["d", k1, v1, k2, v2, ...]`` dict,
``["b", "<base64>"]`` bytes, ``["i", "<hex>"]`` a bigger int, ``["f", "nan" | "inf" | "-inf"]``.
JSON objects are never used, so a tuple stays a tuple and a dict key may be any hashable value.

Frames on a link between two processes are a 4-byte big-endian length and that many bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import socket
import struct
from typing import Any, Callable, Dict, List

MAX_DEPTH = 100
MAX_ITEMS = 1_000_000
MAX_FRAME = 64 << 20
_SMALL_INT = 10**15
_HEX = re.compile(r"-?0x[0-9a-f]{1,2000000}\Z")
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_LENGTH = struct.Struct(">I")


class NotData(TypeError):
    """A value that may not cross the boundary (not plain data, too deep, too many items), or bytes that do
    not decode to one."""


class _Budget(object):
    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_ITEMS

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise NotData("more than %d values" % MAX_ITEMS)


def _tagged(value: Any, depth: int, budget: _Budget) -> Any:
    budget.take()
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if -_SMALL_INT < value < _SMALL_INT else ["i", hex(value)]
    if kind is float:
        if math.isfinite(value):
            return value
        return ["f", "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")]
    if kind is bytes:
        return ["b", base64.b64encode(value).decode("ascii")]
    if depth >= MAX_DEPTH:
        raise NotData("nested deeper than %d" % MAX_DEPTH)
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        tag = {list: "l", tuple: "t", set: "s", frozenset: "z"}[kind]
        return [tag] + [_tagged(item, depth + 1, budget) for item in value]
    if kind is dict:
        out: List[Any] = ["d"]
        for key, item in value.items():
            out.append(_tagged(key, depth + 1, budget))
            out.append(_tagged(item, depth + 1, budget))
        return out
    raise NotData("a %s is not plain data" % _type_name(value))


def _type_name(value: Any) -> str:
    try:
        return str(type(value).__name__)[:100]
    except Exception:
        return "value of an unnamed type"


def encode(value: Any) -> bytes:
    """``value`` as tagged JSON.

    Raises:
        NotData: ``value`` (or something in it) is not of an exact plain type, or is past the bounds.
    """
    try:
        text = json.dumps(_tagged(value, 0, _Budget()), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except RecursionError:
        raise NotData("nested too deeply") from None
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_FRAME:
        raise NotData("%d bytes as data; at most %d cross" % (len(raw), MAX_FRAME))
    return raw


def _no_object(pairs: Any) -> Any:
    raise NotData("a JSON object is not part of the encoding")


def _no_constant(name: str) -> Any:
    raise NotData("%s is not part of the encoding" % name)


def _small_int(text: str) -> int:
    if len(text.lstrip("-")) > 15:
        raise NotData("an int of more than 15 digits must be tagged")
    return int(text)


def _built(node: Any, depth: int, budget: _Budget) -> Any:
    budget.take()
    kind = type(node)
    if node is None or kind is bool or kind is str or kind is int or kind is float:
        return node
    if kind is not list or not node or type(node[0]) is not str:
        raise NotData("a %s is not part of the encoding" % kind.__name__)
    if depth >= MAX_DEPTH:
        raise NotData("nested deeper than %d" % MAX_DEPTH)
    tag, items = node[0], node[1:]
    if tag in ("i", "f", "b"):
        if len(items) != 1 or type(items[0]) is not str:
            raise NotData("a malformed %r value" % tag)
        return _scalar(tag, items[0])
    values = [_built(item, depth + 1, budget) for item in items]
    try:
        if tag == "l":
            return values
        if tag == "t":
            return tuple(values)
        if tag == "s":
            return set(values)
        if tag == "z":
            return frozenset(values)
        if tag == "d":
            if len(values) % 2:
                raise NotData("a dict with a key and no value")
            return {values[i]: values[i + 1] for i in range(0, len(values), 2)}
    except TypeError as exc:  # an unhashable key or set member
        raise NotData(str(exc)) from None
    raise NotData("unknown tag %r" % tag[:20])


def _scalar(tag: str, text: str) -> Any:
    if tag == "i":
        if not _HEX.match(text):
            raise NotData("a malformed big int")
        return int(text, 16)
    if tag == "f":
        if text not in _FLOATS:
            raise NotData("a malformed float")
        return _FLOATS[text]
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, binascii.Error, UnicodeEncodeError):
        raise NotData("malformed bytes") from None


def decode(raw: bytes) -> Any:
    """The value that ``raw`` (from ``encode``, or from anyone) describes, built from builtin types only.

    Raises:
        NotData: ``raw`` is not a valid encoding, or is past the bounds.
    """
    if len(raw) > MAX_FRAME:
        raise NotData("%d bytes; at most %d cross" % (len(raw), MAX_FRAME))
    try:
        node = json.loads(
            raw.decode("utf-8", "surrogatepass"),
            object_pairs_hook=_no_object,
            parse_constant=_no_constant,
            parse_int=_small_int,
        )
    except NotData:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise NotData("not valid JSON: %s" % str(exc)[:200]) from None
    return _built(node, 0, _Budget())


# -- frames on a link


def send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the link")
        data += chunk
    return bytes(data)


def receive(sock: socket.socket) -> bytes:
    """One frame.

    Raises:
        EOFError: the other side closed the link.
        NotData: the frame says it is larger than ``MAX_FRAME``.
    """
    (size,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    if size > MAX_FRAME:
        raise NotData("a frame of %d bytes; at most %d cross" % (size, MAX_FRAME))
    return _exactly(sock, size)


def builtin_exception(name: Any, message: Any, fallback: Callable[[str], BaseException]) -> BaseException:
    """The exception a stub raises for one raised on the other side: the builtin class of that name when it is an
    ``Exception`` (never a class the other side made), else ``fallback`` with the name in its message."""
    text = str(message)[:8192] if type(message) is str else ""
    label = str(name)[:100] if type(name) is str else "an exception"
    candidate = _BUILTIN_EXCEPTIONS.get(label)
    if candidate is not None:
        try:
            return candidate(text)
        except Exception:  # a class whose constructor wants other arguments (UnicodeDecodeError)
            pass
    return fallback("the submission raised %s: %s" % (label, text))


def _builtin_exceptions() -> Dict[str, type]:
    import builtins

    found: Dict[str, type] = {}
    for key, value in vars(builtins).items():
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == "builtins":
            found[key] = value
    return found


_BUILTIN_EXCEPTIONS = _builtin_exceptions()


def builtin_base(exc: BaseException) -> str:
    """The name of the nearest builtin ``Exception`` class of ``exc`` (a subclass of ValueError: "ValueError")."""
    for klass in type(exc).__mro__:
        if _BUILTIN_EXCEPTIONS.get(getattr(klass, "__name__", "")) is klass:
            return klass.__name__
    return type(exc).__name__
