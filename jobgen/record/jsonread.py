"""JSON records read as the standard library reads them, in a fraction of its time where orjson is
installed.

A reading command parses every job's small records and the run's manifest; orjson (a C-speed parser, a dependency of jobgen on x86_64 and aarch64,
where it ships wheels) parses the same text to the same values, with three exceptions the standard
library accepts: NaN and Infinity, numbers beyond a double (1e400), and text that is not UTF-8 (a
byte order mark, UTF-16, lone surrogates). It refuses those, and such text is parsed again by the
standard library. One difference it does not refuse: an integer beyond 64 bits becomes a float. Text
with a run of digits that long (in a number or a string alike) is therefore read by the standard
library from the start (see _TOKENS). So `loads` returns what `json.loads` returns and raises what it raises
(JSONDecodeError with its message and line, UnicodeDecodeError, RecursionError), whichever parser
answered; `JOBGEN_STDLIB_JSON=1` uses the standard library alone (tests/core/test_jsonread.py checks
the two agree).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

# Every digit made "0", a minus sign kept, what may come before a number ("[", ",", ":", white space)
# made " " and every other byte "x": an integer orjson would turn into a float is then a plain substring
# search, a few instructions a byte (a regular expression took longer than the parse it guards). orjson
# reads integers from -2**63 to 2**64 - 1 exactly: every one of up to 19 digits, and of 19 digits with a
# minus sign only from -2**63. So 20 digits after " ", or 19 after " -", send the text to the standard
# library; a stat stamp in nanoseconds (19 digits) does not, nor a float's long fraction or exponent
# (after "." or "e": 0.00012000000000000002). A string's such run of digits sends it there too.
_TOKENS = bytes(
    48 if 48 <= byte <= 57 else 45 if byte == 45 else 32 if byte in b"[,: \t\r\n" else 120 for byte in range(256)
)
_LONG_RUN, _LONG_NEGATIVE = b"0" * 20, b"-" + b"0" * 19


def _stdlib(raw: bytes | str) -> Any:
    return json.loads(raw)


def _pick() -> tuple[Callable[[bytes | str], Any], Callable[[bytes | str], tuple[Any, bool]]]:
    if os.environ.get("JOBGEN_STDLIB_JSON") == "1":
        return _stdlib, _stdlib_exact
    try:
        from orjson import loads as fast
    except ImportError:  # a platform without its wheel: the standard library alone
        return _stdlib, _stdlib_exact

    def loads(raw: bytes | str) -> Any:
        data = _for_orjson(raw)
        if data is not None:
            try:
                return fast(data)
            except ValueError:  # orjson.JSONDecodeError: refused, so the standard library decides
                pass
        return json.loads(raw)

    def loads_exact(raw: bytes | str) -> tuple[Any, bool]:
        data = _for_orjson(raw)
        if data is not None:
            try:
                return fast(data), True
            except ValueError:
                pass
        return json.loads(raw), False

    return loads, loads_exact


def _for_orjson(raw: bytes | str) -> bytes | None:
    """The text as bytes for orjson, None where it would read an integer otherwise than the standard
    library (an integer too long: see _TOKENS)."""
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    tokens = data.translate(_TOKENS)
    if tokens.startswith((_LONG_RUN, _LONG_NEGATIVE)) or b" " + _LONG_RUN in tokens or b" " + _LONG_NEGATIVE in tokens:
        return None
    return data


def _stdlib_exact(raw: bytes | str) -> tuple[Any, bool]:
    return json.loads(raw), False


# loads_exact: loads, and whether orjson read the text. Then nothing in the value is a float NaN or
# infinity (orjson refuses NaN, Infinity and numbers beyond a double): what jobgen.record.store needs to
# know to write a manifest it read back with orjson (dumps_exact).
loads, loads_exact = _pick()


def _dumps_stdlib(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _pick_dumps() -> Callable[[Any], bytes]:
    if os.environ.get("JOBGEN_STDLIB_JSON") == "1":
        return _dumps_stdlib
    try:
        from orjson import dumps as fast
    except ImportError:
        return _dumps_stdlib

    def dumps(value: Any) -> bytes:
        try:
            return fast(value)
        except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits, a key that is not a string
            return _dumps_stdlib(value)

    return dumps


# The compact UTF-8 JSON of what the run's index keeps, by orjson where installed. orjson writes what `json.dumps(value, separators=(",",
# ":"))` writes, read back as the same values, but for one thing the index never holds: a NaN or an
# infinity, which it writes as null (their floats are a result's numbers, each finite or None:
# jobgen.results.collect._num). The manifest's entries only through dumps_exact, below.
dumps = _pick_dumps()


def _pick_dumps_exact() -> Callable[[Any], bytes | None]:
    if os.environ.get("JOBGEN_STDLIB_JSON") == "1":
        return lambda value: None
    try:
        import orjson
    except ImportError:
        return lambda value: None
    # What the standard library refuses to write, orjson is told to refuse too (the default below):
    # dataclasses and datetimes, which it would otherwise write.
    option = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME

    def refuse(value: Any) -> Any:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    def dumps_exact(value: Any) -> bytes | None:
        try:
            return orjson.dumps(value, default=refuse, option=option)
        except TypeError:  # a key that is not a string, an integer beyond 64 bits, text with a lone surrogate
            return None

    return dumps_exact


# dumps_exact: compact UTF-8 JSON by orjson, read back as the same value, or None where orjson cannot
# write the value or is not installed: then the standard library writes it. The caller makes sure no
# float in it is a NaN or an infinity: orjson writes those as null.
dumps_exact = _pick_dumps_exact()
