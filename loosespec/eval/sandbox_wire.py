"""The wire between a HumanEval test driver and the sandboxed program it tests (loosespec.eval.sandbox).

Standard library only: both ends are isolated interpreters (``python -I -B``) that must not import loosespec,
so the parent passes this file's text to them ahead of their own. Importing it does nothing but define.

Messages are length-prefixed JSON. Values cross as *data only*, never code: ``None``, bools, ints, floats
(``nan``/``inf`` included), strings and lists as JSON; tuples, dicts, sets, frozensets, bytes, bytearrays and
complex numbers as one-key tagged objects. Instances of the program's own classes (``Node``, ``Pair`` in some
MBPP tests) stay in the program and cross as *handles* (``{"h": n}``): the driver can build them, set and read
their attributes and pass them back, and compares them by identity only, never through the program's ``__eq__``.
Anything else the program returns arrives as an :class:`Opaque` that equals nothing. Decoding (:func:`decode`) builds only those types, bounded in size and depth, so whatever
the program under test writes, the driver reads plain data and its assertions decide.
"""

import json
import os
import select
import struct
import time

MAX_MESSAGE = 64 * 1024 * 1024
MAX_DEPTH = 200
_HEADER = struct.Struct(">I")


class WireError(Exception):
    """A message that could not be read or written: a closed pipe, a timeout, a malformed or oversized one."""


class Opaque:
    """A value of a type the wire does not carry (a generator, a custom class): kept as its type name and
    ``repr`` for messages, equal to nothing, so a test comparing it fails as a wrong answer."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name, text):
        self.type_name, self.text = type_name, text

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = None

    def __repr__(self):
        return "<%s returned by the program: %s>" % (self.type_name, self.text)


def to_data(value, depth=0, handle=None):
    """``value`` as the JSON-able tagged tree :func:`from_data` reads back (numpy-like values through their
    ``tolist()``, int/float/str subclasses as the base type; ``handle(value)``, when given, names an object
    that crosses as a handle (an int) or returns None; other types as an Opaque)."""
    if depth > MAX_DEPTH:
        raise WireError("value nested deeper than %d" % MAX_DEPTH)
    d = depth + 1
    if handle is not None:
        h = handle(value)
        if h is not None:
            return {"h": int(h)}
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return [to_data(v, d, handle) for v in value]
    if isinstance(value, tuple):
        return {"t": [to_data(v, d, handle) for v in value]}
    if isinstance(value, dict):
        return {"d": [[to_data(k, d, handle), to_data(v, d, handle)] for k, v in value.items()]}
    if isinstance(value, frozenset):
        return {"f": [to_data(v, d, handle) for v in value]}
    if isinstance(value, set):
        return {"s": [to_data(v, d, handle) for v in value]}
    if isinstance(value, bytearray):
        return {"ba": bytes(value).hex()}
    if isinstance(value, bytes):
        return {"b": value.hex()}
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    if isinstance(value, Opaque):
        return {"x": [value.type_name, value.text]}
    tolist = getattr(type(value), "tolist", None)
    if callable(tolist):
        try:
            return to_data(tolist(value), d, handle)
        except WireError:
            raise
        except Exception:
            pass
    try:
        text = repr(value)[:200]
    except Exception:
        text = "?"
    return {"x": [type(value).__name__, text]}


def from_data(data, depth=0, handle=None):
    """The value :func:`to_data` encoded; ``handle(n)`` gives the object a handle names (without it, a handle
    is malformed); anything malformed raises :class:`WireError`."""
    if depth > MAX_DEPTH:
        raise WireError("value nested deeper than %d" % MAX_DEPTH)
    d = depth + 1
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [from_data(v, d, handle) for v in data]
    if not isinstance(data, dict) or len(data) != 1:
        raise WireError("malformed value")
    ((tag, body),) = data.items()
    try:
        if tag == "t":
            return tuple(from_data(v, d, handle) for v in body)
        if tag == "d":
            return {from_data(k, d, handle): from_data(v, d, handle) for k, v in body}
        if tag == "f":
            return frozenset(from_data(v, d, handle) for v in body)
        if tag == "s":
            return {from_data(v, d, handle) for v in body}
        if tag == "ba":
            return bytearray.fromhex(body)
        if tag == "b":
            return bytes.fromhex(body)
        if tag == "c":
            re_, im = body
            return complex(float(re_), float(im))
        if tag == "h" and handle is not None and isinstance(body, int) and not isinstance(body, bool):
            return handle(body)
        if tag == "x":
            name, text = body
            return Opaque(str(name)[:100], str(text)[:200])
    except WireError:
        raise
    except (TypeError, ValueError) as e:  # unhashable keys, bad hex, wrong shapes
        raise WireError("malformed %r value: %s" % (tag, e))
    raise WireError("unknown tag %r" % (tag,))


def encode(message):
    """``message`` (a dict of JSON-able values) as one frame."""
    body = json.dumps(message, allow_nan=True, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(body) > MAX_MESSAGE:
        raise WireError("message of %d bytes is over the %d-byte limit" % (len(body), MAX_MESSAGE))
    return _HEADER.pack(len(body)) + body


def send(fd, message):
    data = encode(message)
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as e:
            raise WireError("the other end is gone: %s" % e)
        view = view[n:]


def _read_exact(fd, n, deadline):
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise WireError("timed out waiting for the other end")
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise WireError("timed out waiting for the other end")
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except OSError as e:
            raise WireError("the other end is gone: %s" % e)
        if not chunk:
            raise WireError("the other end closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(fd, deadline=None):
    """One message from ``fd``: a dict; ``deadline`` is a ``time.monotonic()`` value or None (wait)."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if size > MAX_MESSAGE:
        raise WireError("message of %d bytes is over the %d-byte limit" % (size, MAX_MESSAGE))
    try:
        message = json.loads(_read_exact(fd, size, deadline).decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as e:
        raise WireError("malformed message: %s" % e)
    if not isinstance(message, dict):
        raise WireError("malformed message: not an object")
    return message
