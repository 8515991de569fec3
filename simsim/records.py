"""What an engine writes down: event and admission records, kept in columns.

Engines append four integers per event to typed arrays (8 bytes for the timestamp, the
sequence and the request id, 1 byte for the event type) instead of creating a Python
object per event; :class:`EventRecord` and :class:`AdmissionRecord`
objects are made only when a reader asks for them. A log handed to a reader is a
snapshot: it keeps the length it had when it was taken.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Generic, NamedTuple, TypeVar, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "ITERATION_COLUMNS",
    "AdmissionLog",
    "AdmissionRecord",
    "EventLog",
    "EventRecord",
    "EventType",
    "IterationLog",
    "IterationRecord",
    "IterationRow",
    "RecordView",
]


class EventType(enum.IntEnum):
    """The kinds of lifecycle events an engine logs."""

    REQUEST_ARRIVAL = 0
    """The request reached the server and joined the admission queue."""
    PREFILL_COMPLETE = 1
    """The request's prompt (or its last prefill chunk) was processed."""
    DECODE_STEP_COMPLETE = 2
    """One output token was generated."""
    REQUEST_COMPLETE = 3
    """The request finished and left the server."""
    REQUEST_PREEMPTED = 4
    """The batching server evicted the request to free KV-cache blocks."""


_EVENT_TYPES = tuple(EventType)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One processed lifecycle event: when, in which order, what, and for whom."""

    timestamp_us: int
    sequence: int
    event_type: EventType
    request_id: int


@dataclass(frozen=True, slots=True)
class AdmissionRecord:
    """One admission: the time, the request admitted and the scheduler epoch decided on."""

    timestamp_us: int
    request_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One launched iteration, written when it ends or is abandoned.

    ``end_us`` is the planned end, also for an abandoned iteration; the counts are as
    launched. ``batch_size`` is how many requests held a slot at launch and
    ``kv_blocks_in_use`` how many KV blocks they held (0 without a KV cache; a block
    shared through the prefix cache counts once), ``kv_blocks_cached`` how many blocks
    nobody held that kept a cached prefix (0 without a prefix cache).
    """

    start_us: int
    end_us: int
    prefill_tokens: int
    prefilling_count: int
    decoding_count: int
    abandoned: bool
    batch_size: int
    kv_blocks_in_use: int
    kv_blocks_cached: int = 0


class IterationRow(NamedTuple):
    """:class:`IterationRecord`'s fields as a plain tuple: what an engine keeps of an
    iteration while it runs (cheaper to make than the record, once per iteration)."""

    start_us: int
    end_us: int
    prefill_tokens: int
    prefilling_count: int
    decoding_count: int
    abandoned: bool
    batch_size: int
    kv_blocks_in_use: int
    kv_blocks_cached: int


ITERATION_COLUMNS = tuple(
    spec.name for spec in fields(IterationRecord) if spec.name != "kv_blocks_cached"
)
"""The columns of an iterations frame; a server with a prefix cache appends
``kv_blocks_cached``."""


R = TypeVar("R")


class RecordView(Sequence[R], Generic[R]):
    """A read-only, fixed-length view of the first *length* rows of a columnar log.

    Compares equal to any sequence with equal records in the same order.
    """

    __slots__ = ("_columns", "_length", "_make")

    def __init__(self, columns: tuple[array[int], ...], length: int, make: type[R]) -> None:
        self._columns = columns
        self._length = length
        self._make = make

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> R: ...
    @overload
    def __getitem__(self, index: slice) -> list[R]: ...
    def __getitem__(self, index: int | slice) -> R | list[R]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"record index {index} out of range for a log of {self._length}")
        return self._row(index)

    def _row(self, index: int) -> R:
        return self._make(*(column[index] for column in self._columns))

    def __iter__(self) -> Iterator[R]:
        make = self._make
        columns = [column[: self._length] for column in self._columns]
        for row in zip(*columns, strict=True):
            yield make(*row)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._length and all(a == b for a, b in zip(self, other, strict=False))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class _EventRecordView(RecordView[EventRecord]):
    __slots__ = ()

    def _row(self, index: int) -> EventRecord:
        t, s, k, r = self._columns
        return EventRecord(t[index], s[index], _EVENT_TYPES[k[index]], r[index])

    def __iter__(self) -> Iterator[EventRecord]:
        n = self._length
        t, s, k, r = (column[:n] for column in self._columns)
        types = _EVENT_TYPES
        for ti, si, ki, ri in zip(t, s, k, r, strict=True):
            yield EventRecord(ti, si, types[ki], ri)


class EventLog:
    """The columnar event log: timestamps, sequences, event types and request ids.

    The columns are ``array('q')`` (8 bytes a value), except the event type's
    ``array('b')`` (1 byte). Engines add a row with :meth:`append`; the single slot's
    decode step, the one measured hot path, appends to the four columns itself.

    Decode tokens of a stretch, or of iterations that served the same requests, may
    come in bulk instead, kept as *inserts* at the row where they belong: a *run*
    (:meth:`add_token_run`: steps that end every so many microseconds and number their
    records evenly, 56 bytes whatever its length) or a *grid* (:meth:`add_tokens`,
    :meth:`extend_tokens`: one end and one first sequence number per iteration, 16
    bytes an iteration). The first reader of :attr:`columns` writes every row out, in
    order, into the columns.
    """

    __slots__ = (
        "_grid",
        "_grids",
        "_inserts",
        "_last",
        "request_ids",
        "sequences",
        "timestamps",
        "types",
    )

    def __init__(self) -> None:
        self.timestamps: array[int] = array("q")
        self.sequences: array[int] = array("q")
        self.types: array[int] = array("b")
        self.request_ids: array[int] = array("q")
        # Inserts, in order, as columns: the row they go before, then (a run) first
        # time, time step, first sequence, sequence step, iterations and the request
        # id, or (a grid) -1 and its index in _grids. None until the first insert.
        self._inserts: tuple[array[int], ...] | None = None
        self._grids: list[_TokenGrid] = []
        # The grid that the next iteration's tokens may extend (the last insert).
        self._grid: _TokenGrid | None = None
        # The last tokens written as rows by extend_tokens: their first row, time, first
        # sequence and request ids (the caller's list, which it does not change again).
        self._last: tuple[int, int, int, list[int]] | None = None

    @property
    def columns(self) -> tuple[array[int], array[int], array[int], array[int]]:
        """The four columns in :class:`EventRecord`'s field order (every row)."""
        if self._inserts is not None:
            self._write_out()
        return (self.timestamps, self.sequences, self.types, self.request_ids)

    def append(self, timestamp_us: int, sequence: int, event_type: int, request_id: int) -> None:
        """Add one processed event."""
        self.timestamps.append(timestamp_us)
        self.sequences.append(sequence)
        self.types.append(event_type)
        self.request_ids.append(request_id)

    def extend_tokens(self, timestamp_us: int, first_sequence: int, request_ids: list[int]) -> None:
        """Add a ``DECODE_STEP_COMPLETE`` at *timestamp_us* for each of *request_ids*,
        numbered from *first_sequence* on: one more iteration of the last grid when it
        has the same requests and nothing was logged since; a new grid of two iterations
        when the rows just written were for the same requests (a batch of
        :data:`_GRID_MIN` or more); else rows. *request_ids* is kept: the caller must not
        change it afterwards."""
        grid = self._grid
        rows = len(self.timestamps)
        if grid is not None and grid.row == rows and grid.ids == request_ids:
            grid.times.append(timestamp_us)
            grid.firsts.append(first_sequence)
            return
        count = len(request_ids)
        last = self._last
        if (
            last is not None
            and last[0] == rows - count
            and last[3] == request_ids
            and count >= _GRID_MIN
        ):
            # The same requests twice in a row: the last iteration's rows become a grid.
            for column in self.columns_open():
                del column[rows - count :]
            self.add_tokens(
                array("q", (last[1], timestamp_us)),
                array("q", (last[2], first_sequence)),
                request_ids,
            )
            self._last = None
            return
        self._last = (rows, timestamp_us, first_sequence, request_ids)
        self.timestamps.extend(array("q", (timestamp_us,)) * count)
        self.sequences.extend(array("q", range(first_sequence, first_sequence + count)))
        self.types.extend(array("b", (EventType.DECODE_STEP_COMPLETE,)) * count)
        self.request_ids.extend(array("q", request_ids))

    def add_tokens(
        self, times: array[int], first_sequences: array[int], request_ids: list[int]
    ) -> None:
        """Add a grid: for each iteration (its end in *times*), a
        ``DECODE_STEP_COMPLETE`` for each of *request_ids* in order, numbered from that
        iteration's entry of *first_sequences* on. The arrays and the list are kept, not
        copied: the caller must not change them afterwards."""
        grid = _TokenGrid(len(self.timestamps), times, first_sequences, request_ids)
        self._insert((len(self.timestamps), -1, len(self._grids), 0, 0, 0, 0))
        self._grids.append(grid)
        self._grid = grid

    def add_token_run(
        self,
        first_time_us: int,
        time_step_us: int,
        first_sequence: int,
        sequence_step: int,
        iterations: int,
        request_id: int,
    ) -> None:
        """Add a run of *iterations* ``DECODE_STEP_COMPLETE`` records of *request_id*,
        the first at *first_time_us* numbered *first_sequence*, each next one
        *time_step_us* later and *sequence_step* numbers higher."""
        row = len(self.timestamps)
        self._insert(
            (
                row,
                first_time_us,
                time_step_us,
                first_sequence,
                sequence_step,
                iterations,
                request_id,
            )
        )
        self._grid = None

    def _insert(self, values: tuple[int, ...]) -> None:
        self._last = None  # rows before an insert never join a grid after it
        inserts = self._inserts
        if inserts is None:
            inserts = self._inserts = tuple(array("q") for _ in range(7))
        for column, value in zip(inserts, values, strict=True):
            column.append(value)

    def _write_out(self) -> None:
        assert self._inserts is not None
        rows, times, time_steps, firsts, sequence_steps, counts, ids = self._inserts
        eager = self.columns_open()
        parts: list[tuple[npt.NDArray[np.int64], ...]] = []
        done = 0
        for index, row in enumerate(rows):
            if row > done:
                parts.append(tuple(_numpy(column, done, row) for column in eager))
                done = row
            if times[index] == -1:  # a grid
                parts.append(self._grids[time_steps[index]].expand())
            else:
                steps = np.arange(counts[index], dtype=np.int64)
                parts.append(
                    _grid_columns(
                        times[index] + time_steps[index] * steps,
                        firsts[index] + sequence_steps[index] * steps,
                        [ids[index]],
                    )
                )
        if len(self.timestamps) > done:
            parts.append(tuple(_numpy(column, done, len(column)) for column in eager))
        columns = tuple(array(kind) for kind in "qqbq")
        for position, column in enumerate(columns):
            values = np.concatenate([part[position] for part in parts])
            column.frombytes(
                values.astype(np.int8 if column.typecode == "b" else np.int64).tobytes()
            )
        self.timestamps, self.sequences, self.types, self.request_ids = columns
        self._inserts = None
        self._grids = []
        self._grid = None
        self._last = None

    def columns_open(self) -> tuple[array[int], array[int], array[int], array[int]]:
        """The columns' rows as written so far, without the inserts."""
        return (self.timestamps, self.sequences, self.types, self.request_ids)

    def __len__(self) -> int:
        total = len(self.timestamps)
        if self._inserts is not None:
            for first, step, count in zip(
                self._inserts[1], self._inserts[2], self._inserts[5], strict=True
            ):
                total += len(self._grids[step]) if first == -1 else count
        return total

    def view(self) -> RecordView[EventRecord]:
        """A snapshot of the log as a sequence of :class:`EventRecord`."""
        columns = self.columns
        return _EventRecordView(columns, len(columns[0]), EventRecord)

    @property
    def nbytes(self) -> int:
        """Bytes held by the log's used part: 8 + 8 + 1 + 8 per row, 56 per insert, and
        16 per iteration of a grid and 8 per request of its batch."""
        total = sum(column.itemsize * len(column) for column in self.columns_open())
        if self._inserts is not None:
            total += 56 * len(self._inserts[0])
        for grid in self._grids:
            total += 16 * len(grid.times) + 8 * len(grid.ids)
        return total


_GRID_MIN = 4
"""The smallest batch whose tokens :meth:`EventLog.extend_tokens` keeps as a grid."""


def _numpy(column: array[int], start: int, stop: int) -> npt.NDArray[np.int64]:
    if column.typecode == "b":
        return np.frombuffer(column, dtype=np.int8)[start:stop].astype(np.int64)
    return np.frombuffer(column, dtype=np.int64)[start:stop]


class _TokenGrid:
    """Decode tokens of iterations that served the same requests in the same order."""

    __slots__ = ("firsts", "ids", "row", "times")

    def __init__(self, row: int, times: array[int], firsts: array[int], ids: list[int]) -> None:
        self.row = row  # the log's row it goes before
        self.times = times  # each iteration's end
        self.firsts = firsts  # each iteration's first record's sequence number
        self.ids = ids

    def __len__(self) -> int:
        return len(self.times) * len(self.ids)

    def expand(self) -> tuple[npt.NDArray[np.int64], ...]:
        """The grid's rows as the log's four columns (NumPy arrays of their types)."""
        times = np.frombuffer(self.times, dtype=np.int64)
        firsts = np.frombuffer(self.firsts, dtype=np.int64)
        return _grid_columns(times, firsts, self.ids)


def _grid_columns(
    times: npt.NDArray[np.int64], firsts: npt.NDArray[np.int64], ids: list[int]
) -> tuple[npt.NDArray[np.int64], ...]:
    count = len(ids)
    iterations = len(times)
    return (
        np.repeat(times, count),
        (firsts[:, None] + np.arange(count, dtype=np.int64)).ravel(),
        np.full(iterations * count, EventType.DECODE_STEP_COMPLETE, dtype=np.int8),
        np.tile(np.asarray(ids, dtype=np.int64), iterations),
    )


class AdmissionLog:
    """The columnar admission log: timestamps, request ids and scheduler epochs."""

    __slots__ = ("epochs", "request_ids", "timestamps")

    def __init__(self) -> None:
        self.timestamps: array[int] = array("q")
        self.request_ids: array[int] = array("q")
        self.epochs: array[int] = array("q")

    def append(self, timestamp_us: int, request_id: int, epoch: int) -> None:
        """Add one admission."""
        self.timestamps.append(timestamp_us)
        self.request_ids.append(request_id)
        self.epochs.append(epoch)

    def __len__(self) -> int:
        return len(self.timestamps)

    def view(self) -> RecordView[AdmissionRecord]:
        """A snapshot of the log as a sequence of :class:`AdmissionRecord`."""
        columns = (self.timestamps, self.request_ids, self.epochs)
        return RecordView(columns, len(self.timestamps), AdmissionRecord)


class IterationLog:
    """The columnar iteration log: one row per launched iteration, in the order they
    ended or were abandoned, with :class:`IterationRecord`'s fields as columns.

    Rows come one at a time (:meth:`append`) or, for a stretch of iterations priced at
    once, as whole columns (:meth:`extend`); :class:`IterationRecord` objects are made
    only when a reader asks for them (:meth:`records`).
    """

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: tuple[array[int], ...] = tuple(
            array("b") if name == "abandoned" else array("q") for name in _ITERATION_FIELDS
        )

    def append(self, row: Sequence[int]) -> None:
        """Add one iteration: its values in :class:`IterationRecord`'s field order (an
        :class:`IterationRow`)."""
        for column, value in zip(self.columns, row, strict=True):
            column.append(value)

    def extend(self, rows: Sequence[npt.NDArray[np.integer]]) -> None:
        """Add several rows given as one NumPy array per field, in
        :class:`IterationRecord`'s field order (all of one length)."""
        for column, values in zip(self.columns, rows, strict=True):
            column.frombytes(np.asarray(values, dtype=column.typecode).tobytes())

    def __len__(self) -> int:
        return len(self.columns[0])

    def column(self, name: str) -> array[int]:
        """The values of the field *name*, one per row."""
        return self.columns[_ITERATION_FIELDS.index(name)]

    def records(self) -> tuple[IterationRecord, ...]:
        """Every row as an :class:`IterationRecord`."""
        abandoned = _ITERATION_FIELDS.index("abandoned")
        rows = []
        for values in zip(*self.columns, strict=True):
            row = list(values)
            row[abandoned] = bool(row[abandoned])
            rows.append(IterationRecord(*row))
        return tuple(rows)


_ITERATION_FIELDS = tuple(spec.name for spec in fields(IterationRecord))
