"""Trace replay: requests read from CSV files, with time scaling and windows.

Two formats are read, each a CSV file with a header row (column order is free, names are
case-sensitive, other columns are ignored, blank lines and rows of empty cells are
skipped, a UTF-8 byte-order mark is allowed):

* **Azure LLM inference traces** (:func:`read_azure_trace`): ``TIMESTAMP`` as a date-time
  such as ``2023-11-16 18:15:46.6805900``, ``ContextTokens`` (the prompt length) and
  ``GeneratedTokens`` (the output limit).
* **Plain traces** (:func:`read_plain_trace`): ``arrival_time_us, prompt_token_count,
  max_output_tokens`` and an optional ``request_id``.

The rules every reader follows:

* **One rounding rule.** Times are computed exactly (integer and rational arithmetic on
  the digits as written, never binary floats) and rounded once, at the end, to the
  nearest microsecond, ties to even: the rule of :func:`simsim.seconds_to_us`.
* **Unsorted rows are sorted**, stably, by time: rows with equal times keep their file
  order. Generated request ids follow that sorted order.
* **Time scaling.** ``time_scale=k`` replays the trace k times as fast: every time
  offset (so every inter-arrival gap) is divided by k before the single rounding.
* **Windows** select rows by their original, unscaled trace time:
  ``window_start <= t < window_start + window_duration``; kept arrivals are measured from
  the window's start (``t - window_start``), then scaled.
* **Errors name the place.** A bad row raises :class:`TraceError` with the file, the line
  number and the column; a missing column that looks like one of the header's gets a
  did-you-mean (``prompt_tokens`` for ``prompt_token_count``). A file with no header,
  or a header and no rows, is an error (a trace that holds no request is almost always a
  truncated or wrong file), and so is a window that selects no row.
"""

from __future__ import annotations

import csv
import datetime
import functools
import io
import json
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from importlib.resources import files
from importlib.resources.abc import Traversable
from os import PathLike
from pathlib import Path
from typing import Final, TextIO

from simsim.checks import closest
from simsim.clock import MAX_TIME_US, check_count, check_time_us
from simsim.request import RequestSpec

__all__ = [
    "AZURE_COLUMNS",
    "MOONCAKE_BLOCK_SIZE",
    "PLAIN_COLUMNS",
    "SAMPLE_AZURE_TRACE",
    "SAMPLE_MOONCAKE_TRACE",
    "TraceError",
    "TraceOverflowError",
    "TracePath",
    "parse_count",
    "parse_timestamp",
    "parse_weight",
    "read_azure_trace",
    "read_mooncake_trace",
    "read_plain_trace",
    "read_table",
]

AZURE_COLUMNS: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The columns of an Azure LLM inference trace, all required."""

PLAIN_COLUMNS: Final = ("arrival_time_us", "prompt_token_count", "max_output_tokens")
"""The required columns of a plain trace (``request_id`` is optional)."""

SAMPLE_AZURE_TRACE: Final[Traversable] = (
    files("simsim").joinpath("data").joinpath("sample_azure_trace.csv")
)
"""A small synthetic trace in the Azure format shipped with simsim (made by
``benchmarks/make_sample_trace.py``, not real data): 200 bursty requests over about
220 seconds. For an installed package this is a ``pathlib.Path``."""

TracePath = str | PathLike[str] | Traversable
"""Where a trace can be read from: a path or an ``importlib.resources`` resource."""


SAMPLE_MOONCAKE_TRACE: Final[Traversable] = (
    files("simsim").joinpath("data").joinpath("sample_mooncake_trace.jsonl")
)
"""A small synthetic trace in the Mooncake format shipped with simsim (made by
``benchmarks/make_sample_trace.py``, not real data): conversations whose turns share
their prefixes, and a few shared system prompts."""

MOONCAKE_BLOCK_SIZE: Final = 512
"""Tokens per ``hash_ids`` entry in the Mooncake traces."""


class TraceError(ValueError):
    """A trace or table file broke a rule; the message names the file, line and column.

    ``source``, ``line`` (1-based, the header is line 1; ``None`` for whole-file
    problems), ``column`` (``None`` when no single column is at fault) and ``rule`` are
    kept as attributes. The message reads ``FILE: line N, column C: RULE``.
    """

    def __init__(
        self, source: str, rule: str, *, line: int | None = None, column: str | None = None
    ) -> None:
        self.source = source
        self.rule = rule
        self.line = line
        self.column = column
        place = ", ".join(
            part
            for part in (
                None if line is None else f"line {line}",
                None if column is None else f"column {column}",
            )
            if part is not None
        )
        super().__init__(f"{source}: {place}: {rule}" if place else f"{source}: {rule}")


class TraceOverflowError(TraceError, OverflowError):
    """A replay that would pass the 64-bit limit because of one of the reader's arguments.

    Also an ``OverflowError``. ``argument`` names the argument that pushed it there
    (``"time_scale"`` for a scaled arrival time, ``"first_request_id"`` for a
    generated id), so a caller can point at its own setting of that name.
    """

    def __init__(self, source: str, rule: str, *, argument: str, line: int | None = None) -> None:
        super().__init__(source, rule, line=line)
        self.argument = argument


# ---------------------------------------------------------------------- cells

_DIGITS = re.compile(r"[0-9]+")
_NEGATIVE = re.compile(r"-[0-9]+")
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(Z|[+-][0-9]{2}:?[0-9]{2})?"
)


def parse_count(text: str, source: str, line: int, column: str) -> int:
    """A cell holding a non-negative integer (digits only), or :class:`TraceError`.

    ``-3`` is refused as negative, ``1.5``, ``1.0``, ``1e3`` and ``x`` as not integers,
    an empty cell as missing; values past ``2**63 - 1`` are refused too.
    """
    cell = text.strip()
    if _DIGITS.fullmatch(cell):
        value = int(cell)
        if value > MAX_TIME_US:
            raise TraceError(
                source, f"{value} is past the 64-bit limit 2**63 - 1", line=line, column=column
            )
        return value
    if not cell:
        rule = "the value is missing; expected a non-negative integer"
    elif _NEGATIVE.fullmatch(cell):
        rule = f"must be a non-negative integer, got negative {cell!r}"
    else:
        rule = f"must be a non-negative integer, got {cell!r} (not an integer)"
    raise TraceError(source, rule, line=line, column=column)


def parse_weight(text: str, source: str, line: int, column: str) -> float:
    """A cell holding a finite non-negative number (a weight), or :class:`TraceError`."""
    cell = text.strip()
    try:
        value = float(cell)
    except ValueError:
        raise TraceError(
            source, f"must be a non-negative number, got {cell!r}", line=line, column=column
        ) from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(
            source,
            f"must be a finite non-negative number, got {cell!r}",
            line=line,
            column=column,
        )
    return value


def parse_timestamp(text: str, source: str, line: int, column: str) -> tuple[int, str]:
    """Read ``YYYY-MM-DD HH:MM:SS[.fraction][offset]`` exactly (``T`` may replace the space).

    Returns ``(whole_seconds, fraction_digits)``: whole seconds since 0001-01-01 and the
    fractional digits as written (any number of them, possibly none). An optional UTC
    offset (``Z``, ``+01:00``, ``-0530``) is subtracted, giving UTC; a timestamp without
    one is taken as written (as UTC), so a trace's timestamps share one clock.
    """
    cell = text.strip()
    match = _TIMESTAMP.fullmatch(cell)
    if match is None:
        raise TraceError(
            source,
            f"cannot read the date-time {cell!r}; expected YYYY-MM-DD HH:MM:SS[.fraction], "
            "e.g. 2023-11-16 18:15:46.6805900",
            line=line,
            column=column,
        )
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        days = _day_number(year, month, day)
        hours, minutes, seconds = int(hour), int(minute), int(second)
        if hours > 23 or minutes > 59 or seconds > 59:
            raise ValueError("hour, minute or second out of range")
        offset = 0 if zone is None or zone == "Z" else _offset_seconds(zone)
    except ValueError as error:
        raise TraceError(
            source, f"not a valid date-time {cell!r} ({error})", line=line, column=column
        ) from None
    return days * 86_400 + hours * 3_600 + minutes * 60 + seconds - offset, fraction or ""


def _offset_seconds(zone: str) -> int:
    digits = zone[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours > 23 or minutes > 59:
        raise ValueError(f"UTC offset {zone} out of range")
    return (-1 if zone[0] == "-" else 1) * (hours * 3_600 + minutes * 60)


@functools.lru_cache(maxsize=4_096)
def _day_number(year: str, month: str, day: str) -> int:
    # Traces hold many rows per day: validate and convert each date once.
    return datetime.date(int(year), int(month), int(day)).toordinal()


# ---------------------------------------------------------------------- numbers


def _exact(value: object, name: str, *, positive: bool) -> Fraction:
    """A real number as an exact fraction; a float is read as its shortest decimal repr."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | Fraction):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
        value = Decimal(repr(value))
    if isinstance(value, Decimal) and not value.is_finite():
        raise ValueError(f"{name} must be finite, got {value!r}")
    exact = Fraction(value)
    if positive and exact <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if exact < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return exact


def _round_half_even(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` (denominator > 0) to the nearest integer, ties to even."""
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def _replay_times_us(
    offsets: Sequence[int],
    tick_us: Fraction,
    window_start_us: Fraction,
    window_end_us: Fraction | None,
    time_scale: Fraction,
) -> list[int | None]:
    """Arrival time of each offset (in ticks of *tick_us*), or ``None`` outside the window.

    ``arrival = round((offset * tick_us - window_start_us) / time_scale)``, ties to even,
    for ``window_start_us <= offset * tick_us < window_end_us``. Integer arithmetic only.
    """
    p, q = tick_us.numerator, tick_us.denominator
    a, b = window_start_us.numerator, window_start_us.denominator
    c, d = time_scale.numerator, time_scale.denominator
    # With offset * tick_us = offset * p / q, window_start_us = a / b, time_scale = c / d:
    # kept when offset * p * b >= a * q (and offset * p * f < e * q for an end e / f),
    # arrival = round((offset * p * b - a * q) * d / (q * b * c)).
    low = a * q
    pb = p * b
    if window_end_us is None:
        pf, high = 0, 1
    else:
        pf, high = p * window_end_us.denominator, window_end_us.numerator * q
    denominator = q * b * c
    times: list[int | None] = []
    for offset in offsets:
        scaled = offset * pb
        if scaled < low or (window_end_us is not None and offset * pf >= high):
            times.append(None)
        else:
            times.append(_round_half_even((scaled - low) * d, denominator))
    return times


# ---------------------------------------------------------------------- files


def _open(path: TracePath) -> tuple[str, TextIO]:
    source = str(path)
    try:
        if isinstance(path, str | PathLike):
            return source, Path(path).open("r", newline="", encoding="utf-8-sig")
        # A resource inside a package archive: read it whole (sample traces are small).
        return source, io.StringIO(path.read_bytes().decode("utf-8-sig"), newline="")
    except OSError as error:
        raise TraceError(source, f"cannot read the file ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise TraceError(source, f"not UTF-8 text ({error.reason})") from None


def read_table(
    path: TracePath,
    required: tuple[str, ...],
    optional: tuple[str, ...] = (),
    *,
    other_columns: bool = False,
) -> tuple[str, dict[str, int], list[tuple[int, list[str]]]]:
    """Read a CSV file with a header row, checking its shape but not its cells.

    Returns the file's name (for messages), the position of every column by name, and
    the non-blank rows as ``(line number, cells)``. Raises :class:`TraceError` for an
    unreadable or empty file, a header without a *required* column, a repeated column,
    a column that is neither required nor *optional* (unless *other_columns*), a row
    with the wrong number of fields, and a header with no rows after it.
    """
    source, handle = _open(path)
    try:
        with handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise TraceError(
                    source,
                    f"the file is empty; expected a header row with {', '.join(required)}",
                    line=1,
                )
            names = [name.strip() for name in header]
            for name in names:
                # A repeated column that is read is ambiguous; repeated ignored ones are not.
                if names.count(name) > 1 and (name in required + optional or not other_columns):
                    raise TraceError(source, f"column {name!r} appears twice", line=1)
            unknown = [name for name in names if name not in required + optional]
            missing = [name for name in required if name not in names]
            if missing:
                raise TraceError(
                    source,
                    f"missing columns {missing}{_did_you_mean(missing, unknown)}; "
                    f"the header has {names}",
                    line=1,
                )
            if unknown and not other_columns:
                raise TraceError(
                    source,
                    f"unknown columns {unknown}; allowed columns: {', '.join(required + optional)}",
                    line=1,
                )
            rows: list[tuple[int, list[str]]] = []
            for cells in reader:
                # csv counts physical lines: a row with a quoted line break is reported
                # on the line where it ends.
                line = reader.line_num
                if not "".join(cells).strip():
                    continue
                if len(cells) != len(names):
                    raise TraceError(
                        source, f"expected {len(names)} fields, got {len(cells)}", line=line
                    )
                rows.append((line, cells))
    except UnicodeDecodeError as error:
        raise TraceError(source, f"not UTF-8 text ({error.reason})") from None
    except csv.Error as error:
        raise TraceError(source, f"not valid CSV ({error})") from None
    if not rows:
        raise TraceError(source, "the file has a header but no rows (at least one is needed)")
    return source, {name: names.index(name) for name in names}, rows


def _did_you_mean(missing: list[str], present: list[str]) -> str:
    """`` (did you mean 'prompt_tokens' for 'prompt_token_count'?)``, or ``""``."""
    guesses = []
    for name in missing:
        guess = closest(name, present)
        if guess is not None:
            guesses.append(f"{guess!r} for {name!r}")
    return f" (did you mean {', '.join(guesses)}?)" if guesses else ""


def _window(
    window_start: object, window_duration: object, unit: str, scale_to_us: int
) -> tuple[Fraction, Fraction | None]:
    start = (
        Fraction(0)
        if window_start is None
        else _exact(window_start, f"window_start_{unit}", positive=False)
    )
    if window_duration is None:
        return start * scale_to_us, None
    duration = _exact(window_duration, f"window_duration_{unit}", positive=True)
    return start * scale_to_us, (start + duration) * scale_to_us


def _requests(
    source: str,
    times: list[int | None],
    order: list[int],
    lines: list[int],
    prompts: list[int],
    outputs: list[int],
    ids: list[int] | None,
    first_request_id: int,
    window: str,
) -> list[RequestSpec]:
    requests: list[RequestSpec] = []
    kept = sum(1 for arrival in times if arrival is not None)
    if ids is None and kept and first_request_id + kept - 1 > MAX_TIME_US:
        raise TraceOverflowError(
            source,
            f"first_request_id = {first_request_id} numbers the {kept} replayed rows up to "
            f"{first_request_id + kept - 1}, past the 64-bit limit 2**63 - 1",
            argument="first_request_id",
        )
    for index in order:
        arrival = times[index]
        if arrival is None:
            continue
        if arrival > MAX_TIME_US:
            raise TraceOverflowError(
                source,
                f"the scaled arrival time {arrival} us (after time_scale) is past the 64-bit "
                "limit 2**63 - 1",
                argument="time_scale",
                line=lines[index],
            )
        request_id = first_request_id + len(requests) if ids is None else ids[index]
        requests.append(RequestSpec(request_id, arrival, prompts[index], outputs[index]))
    if not requests:
        raise TraceError(source, f"the window {window} selects none of the {len(order)} rows")
    return requests


def _describe_window(start: object, duration: object, unit: str) -> str:
    begin = 0 if start is None else start
    end = "end" if duration is None else f"{begin} + {duration}"
    return f"[{begin}, {end}) {unit}"


def read_azure_trace(
    path: TracePath,
    *,
    time_scale: float | int | Decimal | Fraction = 1.0,
    window_start_s: float | int | Decimal | Fraction | None = None,
    window_duration_s: float | int | Decimal | Fraction | None = None,
    first_request_id: int = 0,
) -> list[RequestSpec]:
    """Read an Azure LLM inference trace into request specs, sorted by arrival.

    Columns: ``TIMESTAMP`` (``YYYY-MM-DD HH:MM:SS[.fraction]``, any number of fractional
    digits, read exactly; an optional UTC offset such as ``+00:00`` is honoured, see
    :func:`parse_timestamp`), ``ContextTokens`` -> ``prompt_token_count`` and
    ``GeneratedTokens`` -> ``max_output_tokens`` (non-negative integers).

    Let t0 be the earliest timestamp in the file. The window keeps the rows with
    ``window_start_s <= t - t0 < window_start_s + window_duration_s`` (seconds of trace
    time; no start means 0, no duration means to the end), and each kept row arrives at
    ``(t - t0 - window_start_s) * 1e6 / time_scale`` microseconds, rounded once to the
    nearest microsecond, ties to even. Without a window the earliest request arrives at
    0. ``time_scale=2`` replays at twice the rate (gaps halved).

    Rows are sorted stably by timestamp; ids count up from *first_request_id* in that
    order, over the kept rows. Raises :class:`TraceError` for a bad file, row or empty
    window, ``TypeError``/``ValueError`` for bad arguments.
    """
    scale = _exact(time_scale, "time_scale", positive=True)
    window_start_us, window_end_us = _window(window_start_s, window_duration_s, "s", 10**6)
    first_request_id = check_count(first_request_id, "first_request_id")
    source, columns, rows = read_table(path, AZURE_COLUMNS, other_columns=True)
    at_time, at_prompt, at_output = (columns[name] for name in AZURE_COLUMNS)
    seconds: list[int] = []
    fractions: list[str] = []
    prompts: list[int] = []
    outputs: list[int] = []
    lines: list[int] = []
    for line, cells in rows:
        whole, fraction = parse_timestamp(cells[at_time], source, line, "TIMESTAMP")
        seconds.append(whole)
        fractions.append(fraction)
        prompts.append(parse_count(cells[at_prompt], source, line, "ContextTokens"))
        outputs.append(parse_count(cells[at_output], source, line, "GeneratedTokens"))
        lines.append(line)
    # Exact ticks of 10**-digits seconds, with digits the longest fraction in the file.
    digits = max(len(fraction) for fraction in fractions)
    unit = 10**digits
    ticks = [
        whole * unit + (int(fraction.ljust(digits, "0")) if digits else 0)
        for whole, fraction in zip(seconds, fractions, strict=True)
    ]
    order = sorted(range(len(ticks)), key=ticks.__getitem__)
    origin = ticks[order[0]]
    offsets = [tick - origin for tick in ticks]
    times = _replay_times_us(offsets, Fraction(10**6, unit), window_start_us, window_end_us, scale)
    window = _describe_window(window_start_s, window_duration_s, "s after the first timestamp")
    return _requests(source, times, order, lines, prompts, outputs, None, first_request_id, window)


def read_plain_trace(
    path: TracePath,
    *,
    time_scale: float | int | Decimal | Fraction = 1.0,
    window_start_us: int | None = None,
    window_duration_us: int | None = None,
    first_request_id: int = 0,
) -> list[RequestSpec]:
    """Read a plain trace into request specs, sorted by arrival.

    Columns: ``arrival_time_us``, ``prompt_token_count``, ``max_output_tokens`` and an
    optional ``request_id``, all non-negative integers. Arrival times are absolute
    simulator times (not measured from the first row).

    The window keeps rows with ``window_start_us <= arrival < window_start_us +
    window_duration_us`` (no start means 0, no duration means to the end); each kept row
    arrives at ``(arrival - window_start_us) / time_scale`` microseconds, rounded to the
    nearest microsecond, ties to even. With neither a window nor a scale every arrival
    is kept as written.

    Rows are sorted stably by arrival time. With a ``request_id`` column the ids are
    taken from it (they must be unique); without, they count up from
    *first_request_id* in sorted order over the kept rows. Raises :class:`TraceError`
    for a bad file, row, duplicate id or empty window.
    """
    scale = _exact(time_scale, "time_scale", positive=True)
    if window_start_us is not None:
        window_start_us = check_time_us(window_start_us, "window_start_us")
    if window_duration_us is not None:
        window_duration_us = check_time_us(window_duration_us, "window_duration_us")
    window_start, window_end = _window(window_start_us, window_duration_us, "us", 1)
    first_request_id = check_count(first_request_id, "first_request_id")
    source, columns, rows = read_table(path, PLAIN_COLUMNS, ("request_id",), other_columns=True)
    at_time, at_prompt, at_output = (columns[name] for name in PLAIN_COLUMNS)
    at_id = columns.get("request_id")
    arrivals: list[int] = []
    prompts: list[int] = []
    outputs: list[int] = []
    lines: list[int] = []
    ids: list[int] | None = None if at_id is None else []
    first_line_of: dict[int, int] = {}
    for line, cells in rows:
        arrivals.append(parse_count(cells[at_time], source, line, "arrival_time_us"))
        prompts.append(parse_count(cells[at_prompt], source, line, "prompt_token_count"))
        outputs.append(parse_count(cells[at_output], source, line, "max_output_tokens"))
        lines.append(line)
        if ids is not None and at_id is not None:
            request_id = parse_count(cells[at_id], source, line, "request_id")
            if request_id in first_line_of:
                raise TraceError(
                    source,
                    f"request id {request_id} appears twice (first on line "
                    f"{first_line_of[request_id]}); ids must be unique",
                    line=line,
                    column="request_id",
                )
            first_line_of[request_id] = line
            ids.append(request_id)
    order = sorted(range(len(arrivals)), key=arrivals.__getitem__)
    times = _replay_times_us(arrivals, Fraction(1), window_start, window_end, scale)
    window = _describe_window(window_start_us, window_duration_us, "us")
    return _requests(source, times, order, lines, prompts, outputs, ids, first_request_id, window)


def read_mooncake_trace(
    path: TracePath,
    *,
    block_size_tokens: int = MOONCAKE_BLOCK_SIZE,
    time_scale: float | int | Decimal | Fraction = 1.0,
    first_request_id: int = 0,
    block_hashes: bool = True,
) -> list[RequestSpec]:
    """Read a Mooncake trace (JSON lines) into request specs with block hashes.

    Each line is an object with ``timestamp`` (milliseconds, an integer or a decimal
    number, read exactly), ``input_length`` (the prompt), ``output_length`` (the output
    limit) and ``hash_ids`` (one id per *block_size_tokens* tokens of the prompt, chained
    as in the public traces: equal ids at position *i* mean equal prompts up to that
    block; there must be ``ceil(input_length / block_size_tokens)`` of them, all
    different); other keys are ignored, blank lines skipped. A request's ``block_hashes``
    are the ids of its prompt's *full* blocks (``input_length // block_size_tokens`` of
    them; a partial last block is never shared). Each request arrives at ``timestamp *
    1000 / time_scale`` microseconds, rounded once to the nearest, ties to even; rows are
    sorted stably by time and numbered from *first_request_id* in that order. Raises
    :class:`TraceError` naming the file, the line and the key.

    With ``block_hashes=False`` the ids are still read and checked, but the requests
    carry none: for a server without a prefix cache, which refuses requests that name
    blocks it would ignore.
    """
    if type(block_hashes) is not bool:
        raise TypeError(f"block_hashes must be True or False, got {block_hashes!r}")
    block = check_count(block_size_tokens, "block_size_tokens", minimum=1)
    scale = _exact(time_scale, "time_scale", positive=True)
    first_request_id = check_count(first_request_id, "first_request_id")
    source, stream = _open(path)
    offsets: list[Fraction] = []
    prompts: list[int] = []
    outputs: list[int] = []
    hashes: list[tuple[int, ...]] = []
    lines: list[int] = []
    with stream:
        for line, text in enumerate(stream, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text, parse_float=Decimal)
            except ValueError as error:
                raise TraceError(source, f"not a JSON object ({error})", line=line) from None
            if not isinstance(row, dict):
                raise TraceError(source, "each line must be a JSON object", line=line)
            missing = [
                k
                for k in ("timestamp", "input_length", "output_length", "hash_ids")
                if k not in row
            ]
            if missing:
                raise TraceError(source, f"missing keys {missing}", line=line)
            stamp = row["timestamp"]
            if isinstance(stamp, bool) or not isinstance(stamp, int | Decimal) or stamp < 0:
                raise TraceError(
                    source,
                    f"must be a number of milliseconds >= 0, got {stamp!r}",
                    line=line,
                    column="timestamp",
                )
            counts = []
            for key in ("input_length", "output_length"):
                value = row[key]
                if type(value) is not int or value < 0:
                    raise TraceError(
                        source, f"must be an integer >= 0, got {value!r}", line=line, column=key
                    )
                counts.append(value)
            ids = row["hash_ids"]
            if not isinstance(ids, list) or not all(type(item) is int for item in ids):
                raise TraceError(
                    source, f"must be a list of integers, got {ids!r}", line=line, column="hash_ids"
                )
            blocks = -(-counts[0] // block)
            if len(ids) != blocks:
                raise TraceError(
                    source,
                    f"{len(ids)} hash_ids for {counts[0]} input tokens, which fill {blocks} "
                    f"blocks of {block} tokens: is block_size_tokens the trace's own (512 in "
                    "the public Mooncake traces)?",
                    line=line,
                    column="hash_ids",
                )
            if len(set(ids)) != len(ids):
                raise TraceError(
                    source,
                    "repeats a hash id (chained ids are all different)",
                    line=line,
                    column="hash_ids",
                )
            offsets.append(Fraction(stamp))
            prompts.append(counts[0])
            outputs.append(counts[1])
            hashes.append(tuple(ids[: counts[0] // block]))
            lines.append(line)
    if not offsets:
        raise TraceError(source, "the trace holds no request")
    order = sorted(range(len(offsets)), key=offsets.__getitem__)
    requests: list[RequestSpec] = []
    for index in order:
        exact = offsets[index] * 1000 / scale
        arrival = _round_half_even(exact.numerator, exact.denominator)
        if arrival > MAX_TIME_US:
            raise TraceOverflowError(
                source,
                f"the scaled arrival time {arrival} us is past the 64-bit limit 2**63 - 1",
                argument="time_scale",
                line=lines[index],
            )
        request_id = first_request_id + len(requests)
        if request_id > MAX_TIME_US:
            raise TraceOverflowError(
                source,
                f"request id {request_id} is past the 64-bit limit 2**63 - 1",
                argument="first_request_id",
            )
        keys = hashes[index] if block_hashes else None
        requests.append(
            RequestSpec(request_id, arrival, prompts[index], outputs[index], block_hashes=keys)
        )
    return requests
