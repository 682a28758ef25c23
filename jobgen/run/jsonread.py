"""JSON records read as the standard library reads them, in a fraction of its time where orjson is
installed.

At 10,000 jobs a first `status` parses 20,000 small records and a 4 MB manifest; Python's `json`
spends about 80 instructions a byte on them, most of that command's work after the damage checks'
other steps were made lean. orjson (a C-speed parser, a dependency of jobgen on x86_64 and aarch64,
where it ships wheels) parses the same text to the same values, with three exceptions the standard
library accepts: NaN and Infinity, numbers beyond a double (1e400), and text that is not UTF-8 (a
byte order mark, UTF-16, lone surrogates). It refuses those, and such text is parsed again by the
standard library. One difference it does not refuse: an integer beyond 64 bits becomes a float. Text
with a run of 19 or more digits that may be an integer (in a number or a string alike; not the digits
of a fraction) is therefore read by the standard library from the start. So `loads` returns what `json.loads` returns and raises what it raises
(JSONDecodeError with its message and line, UnicodeDecodeError, RecursionError), whichever parser
answered; `JOBGEN_STDLIB_JSON=1` uses the standard library alone (tests/core/test_jsonread.py checks
the two agree).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

# Every digit made "0", a decimal point and an exponent's letter kept, every other byte " ": a run of 19
# digits is then a plain substring search, a few instructions a byte (a regular expression over the
# whole text took longer than the parse it guards).
_DIGITS_ONLY = bytes(byte if byte in b".eE" else 48 if 48 <= byte <= 57 else 32 for byte in range(256))
_LONG_RUN = b"0" * 19  # an integer orjson would turn into a float (beyond 64 bits)
# Of the texts with such a run (a float's repr can have one: 0.00012345678901234567, as a random search's
# learning rates are written), those where a run may be an integer: one not after a decimal point and
# not before a point or an exponent. A run in a string is taken for one too (the standard library then
# reads that text, as before).
_LONG_INTEGER = re.compile(rb"(?<![.0])0{19,}(?![0.eE])")


def _stdlib(raw: bytes | str) -> Any:
    return json.loads(raw)


def _pick() -> Callable[[bytes | str], Any]:
    if os.environ.get("JOBGEN_STDLIB_JSON") == "1":
        return _stdlib
    try:
        from orjson import loads as fast
    except ImportError:  # a platform without its wheel: the standard library alone
        return _stdlib

    def loads(raw: bytes | str) -> Any:
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
        digits = data.translate(_DIGITS_ONLY)
        if _LONG_RUN not in digits or _LONG_INTEGER.search(digits) is None:
            try:
                return fast(data)
            except ValueError:  # orjson.JSONDecodeError: refused, so the standard library decides
                pass
        return json.loads(raw)

    return loads


loads = _pick()


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


# The compact UTF-8 JSON of a cache (the run's verdicts, a command's kept rows), several MB at 10,000
# jobs, in a tenth of the standard library's time. orjson writes what `json.dumps(value, separators=(",",
# ":"))` writes, read back as the same values, but for one thing the caches never hold: a NaN or an
# infinity, which it writes as null (their floats are a result's numbers, each finite or None:
# jobgen.results.collect._num). Not for the manifest: a record's bytes are what the standard library writes.
dumps = _pick_dumps()
