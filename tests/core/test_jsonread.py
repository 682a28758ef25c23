"""jobgen.record.jsonread.loads reads every text as json.loads does: the same value, or the same error
(type, message, line), whichever parser answered."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobgen.record import jsonread

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too: orjson alone would make those floats
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()  # lone surrogates included: json.dumps escapes them, orjson refuses them
)
DOCS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


def _outcome(parse, raw: bytes):
    """What a parser makes of the bytes: ('value', a comparable form) or ('error', type, message)."""
    try:
        return ("value", _comparable(parse(raw)))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return ("error", type(exc).__name__, str(exc))


def _comparable(value):
    """The value with its types spelled out (1 and 1.0 and True differ) and NaN equal to itself."""
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value.hex())
    if isinstance(value, dict):
        return ("dict", [(k, _comparable(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_comparable(v) for v in value])
    return (type(value).__name__, value)


def test_orjson_answers_here() -> None:
    """The fast parser is installed with jobgen's dependencies on this machine, so the tests below
    compare it with the standard library rather than the standard library with itself."""
    assert jsonread.loads is not jsonread._stdlib
    assert jsonread.loads(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}


@settings(max_examples=400, deadline=None)
@given(DOCS, st.booleans())
def test_every_document_reads_as_the_standard_library_reads_it(doc, ascii_only: bool) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert _outcome(jsonread.loads, raw) == _outcome(json.loads, raw)


@settings(max_examples=300, deadline=None)
@given(DOCS, st.booleans())
def test_a_text_read_exactly_holds_no_nan_and_writes_back_the_same(doc, ascii_only: bool) -> None:
    """loads_exact reads what loads reads; when it says orjson read the text, no float in the value is a
    NaN or an infinity, and dumps_exact writes a text that reads back as the same value (or declines)."""
    from jobgen.record.store import finite

    raw = json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        value, exact = jsonread.loads_exact(raw)
    except ValueError:
        return  # lone surrogates: loads raises the same (the test above)
    assert _comparable(value) == _comparable(json.loads(raw))
    assert finite(value) or not exact  # a NaN or an infinity is only ever read by the standard library
    if exact:
        written = jsonread.dumps_exact(value)
        assert written is None or _comparable(json.loads(written)) == _comparable(value)


@settings(max_examples=400, deadline=None)
@given(DOCS, st.data())
def test_damaged_text_fails_or_reads_as_the_standard_library_says(doc, data) -> None:
    """Truncated, overwritten, re-encoded or prefixed text: the same value, or the same error."""
    raw = json.dumps({"schema": 1, "x": doc}).encode("utf-8", "surrogatepass")
    how = data.draw(st.sampled_from(["cut", "byte", "bom", "utf16", "insert"]))
    at = data.draw(st.integers(0, len(raw)))
    if how == "cut":
        raw = raw[:at]
    elif how == "byte":
        raw = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1 :]
    elif how == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif how == "utf16":
        raw = json.dumps(doc).encode("utf-16-le")
    else:
        raw = (
            raw[:at] + data.draw(st.sampled_from([b"NaN", b"-Infinity", b"1e400", b"9" * 25, b" ", b"\x00"])) + raw[at:]
        )
    assert _outcome(jsonread.loads, raw) == _outcome(json.loads, raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"18446744073709551616",  # 2**64: orjson alone gives a float
        b"-9223372036854775809",
        b'{"id": 123456789012345678901234567890}',
        b"NaN",
        b"[1e400, -1e400]",
        b'"\\ud800"',
        b"\xef\xbb\xbf{}",
        b"",
        b"   ",
        b'{"a": 1',
        b"[" * 100_000,  # deeper than either parser goes
        b'{"a": 1, "a": 2}',
        b"\xff\xfe",
    ],
)
def test_the_texts_where_the_two_parsers_part(raw: bytes) -> None:
    assert _outcome(jsonread.loads, raw) == _outcome(json.loads, raw)


def test_the_standard_library_alone_when_asked() -> None:
    code = "from jobgen.record import jsonread; print(jsonread.loads is jsonread._stdlib)"
    env_run = subprocess.run(
        [sys.executable, "-c", code], env={"JOBGEN_STDLIB_JSON": "1", "PATH": ""}, capture_output=True, text=True
    )
    assert env_run.stdout.strip() == "True", env_run.stderr


FINITE_DOCS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),  # lone surrogates included: orjson refuses them, the standard library escapes them
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


def test_a_stat_stamp_in_nanoseconds_is_read_by_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caches' 19-digit stamps take the fast parser (as does every integer of up to 19 digits, and
    of up to 18 with a minus sign)."""
    calls = []
    monkeypatch.setattr(jsonread.json, "loads", lambda raw: calls.append(raw))
    stamps = [1764856800123456789, 10**19 - 1, -(10**18) + 1, 0]
    assert jsonread.loads(json.dumps(stamps).encode()) == stamps and not calls


def test_a_long_fraction_is_read_by_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float's long run of digits (a sweep value as 1e-05 * 12 writes it) is no integer: the fast
    parser reads the text, and the standard library only the one holding an integer beyond 64 bits."""
    calls = []
    real = jsonread.json.loads
    monkeypatch.setattr(jsonread.json, "loads", lambda raw: calls.append(raw) or real(raw))
    fractions = b'{"lr": 0.00012000000000000002, "big": 1.2345678901234567890123e-5}'
    assert jsonread.loads(fractions) == real(fractions) and not calls
    big = b'{"lr": 0.00012000000000000002, "n": [18446744073709551616]}'
    assert jsonread.loads(big) == real(big) and calls == [big]


@settings(max_examples=400, deadline=None)
@given(FINITE_DOCS)
def test_a_cache_written_reads_back_as_the_standard_library_writes_it(doc) -> None:
    """jsonread.dumps (what the run's index keeps) gives back, read by either parser, what
    json.dumps gives back: every value a cache can hold (no NaN, no infinity), integers beyond 64 bits
    and lone surrogates included."""
    written = jsonread.dumps(doc)
    assert isinstance(written, bytes)
    wanted = _outcome(json.loads, json.dumps(doc, separators=(",", ":")).encode("utf-8"))
    assert _outcome(json.loads, written) == wanted
    assert _outcome(jsonread.loads, written) == wanted


def test_a_cache_is_written_by_the_standard_library_when_asked() -> None:
    code = "from jobgen.record import jsonread; print(jsonread.dumps is jsonread._dumps_stdlib)"
    env_run = subprocess.run(
        [sys.executable, "-c", code], env={"JOBGEN_STDLIB_JSON": "1", "PATH": ""}, capture_output=True, text=True
    )
    assert env_run.stdout.strip() == "True", env_run.stderr


NUMBER_TEXT = st.from_regex(r"\A-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][-+]?[0-9]{1,3})?\Z") | st.sampled_from(
    [
        str(n)
        for edge in (2**63, 2**64, 10**18, 10**19, 10**20)
        for n in (edge - 1, edge, edge + 1, -edge + 1, -edge, -edge - 1)
    ]
)


@settings(max_examples=1000, deadline=None)
@given(st.lists(NUMBER_TEXT, min_size=1, max_size=4))
def test_numbers_with_long_runs_of_digits_read_as_the_standard_library_reads_them(numbers: list[str]) -> None:
    """Numbers of every length, fractions and exponents, at the edges of what orjson reads exactly (19
    and 20 digits, with and without a minus sign): the same value, an integer beyond 64 bits an integer."""
    raw = ("[" + ", ".join(numbers) + "]").encode()
    assert _outcome(jsonread.loads, raw) == _outcome(json.loads, raw)
