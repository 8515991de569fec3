"""Reading TOML and checking its values: the typed look-ups every scenario table uses.

:class:`TomlChecker` answers "the integer at ``backend.decode_base_us``" and raises a
:class:`ScenarioError` naming the file, the key and the rule when the value is missing,
of the wrong type or out of range; an unknown key gets a did-you-mean. It knows no
scenario: the sweep files use it too.
"""

from __future__ import annotations

import contextlib
import math
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from simsim.checks import did_you_mean
from simsim.clock import MAX_TIME_US
from simsim.traces import TraceError

__all__ = [
    "ScenarioError",
    "ScenarioMemoryError",
    "TomlChecker",
    "from_trace_error",
    "limited",
    "lost_allocation",
    "make",
    "out_of_memory_while",
    "read_toml",
]


class ScenarioError(ValueError):
    """A scenario file (or trace) broke a rule; the message names the file and key."""

    def __init__(self, source: str, key: str, rule: str) -> None:
        self.source = source
        self.key = key
        self.rule = rule
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {rule}")


class ScenarioMemoryError(MemoryError):
    """The machine ran out of memory while a scenario was being built or run.

    The message names the file and what was being made, and how big it was ("while
    generating the workload's 60 requests"), so that the user knows what to make smaller.
    """

    def __init__(self, source: str, doing: str) -> None:
        self.source = source
        self.doing = doing
        super().__init__(
            f"{source}: out of memory while {doing}; make that smaller, or give simsim more memory"
        )


# What CPython says when C code returns failure without an exception: under a memory
# cap, an allocation whose MemoryError was lost on the way (seen as "internal error:
# SystemError" from SimulationEngine.__init__ and BatchingEngine(...) calls).
_LOST_ALLOCATION = (
    "error return without exception set",
    "returned NULL without setting an exception",
)
# What it says when C code returns a result with an exception pending: the pending one is
# chained to it, and only a MemoryError there is an allocation (anything else is a bug).
_PENDING_EXCEPTION = "returned a result with an exception set"


def lost_allocation(error: BaseException) -> bool:
    """Whether *error* is a failed allocation: a ``MemoryError``, or the ``SystemError``
    CPython raises when the ``MemoryError`` of a failed allocation got lost (or was left
    pending: then it is chained to the ``SystemError``)."""
    if isinstance(error, MemoryError):
        return True
    if not isinstance(error, SystemError):
        return False
    text = str(error)
    if _PENDING_EXCEPTION in text:
        return isinstance(error.__cause__ or error.__context__, MemoryError)
    return any(lost in text for lost in _LOST_ALLOCATION)


@contextlib.contextmanager
def out_of_memory_while(source: str, doing: Callable[[], str]) -> Iterator[None]:
    """Turn running out of memory inside the block into a :class:`ScenarioMemoryError`
    that says what was being made: ``doing()`` (called only then) describes it."""
    try:
        yield
    except ScenarioMemoryError:
        raise
    except (MemoryError, SystemError) as error:
        if not lost_allocation(error):
            raise
        # Unwinding the block has freed what it was building: there is room to report.
        raise ScenarioMemoryError(source, doing()) from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a missing file or bad TOML is a :class:`ScenarioError`."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise ScenarioError(source, "", f"cannot read the file ({error.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise ScenarioError(
            source,
            f"line {line}",
            f"not UTF-8 text (byte 0x{raw[error.start]:02x} at offset {error.start}); "
            "TOML files must be UTF-8",
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ScenarioError(source, "", f"not valid TOML: {error}") from None


_T = TypeVar("_T")


def from_trace_error(error: TraceError) -> ScenarioError:
    """The same problem as a :class:`ScenarioError`: the trace file, ``line N, column C``."""
    place = ", ".join(
        part
        for part in (
            None if error.line is None else f"line {error.line}",
            None if error.column is None else f"column {error.column}",
        )
        if part is not None
    )
    return ScenarioError(error.source, place, error.rule)


def make(check: TomlChecker, at: str, factory: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``factory(*args, **kwargs)``; its argument errors become a :class:`ScenarioError`.

    A message about one of the keyword arguments ("rate_per_s must be ...", perhaps
    after the factory's name) is reported at that key (``<at>.rate_per_s: must be ...``),
    as the file's own checks report theirs.
    """
    try:
        return factory(*args, **kwargs)
    except TraceError as error:
        raise from_trace_error(error) from None
    except (TypeError, ValueError, OverflowError) as error:
        raise check.fail(*_keyed(at, str(error), factory, kwargs)) from None
    except Exception as error:
        if getattr(factory, "__module__", "").partition(".")[0] == "simsim":
            raise  # simsim's own factory: a bug in simsim, reported as one
        # A user's plug-in (simsim.register_*) failed: say whose code raised what.
        name = getattr(factory, "__qualname__", repr(factory))
        raise check.fail(
            at, f"the plug-in factory {name} raised {type(error).__name__}: {error}"
        ) from None


def _keyed(
    at: str, rule: str, factory: Callable[..., Any], kwargs: Mapping[str, Any]
) -> tuple[str, str]:
    """Where a factory's error *rule* belongs, and the rule without the key's name."""
    rule = rule.removeprefix(f"{getattr(factory, '__name__', '')}: ")
    for name in (at.rpartition(".")[2], *kwargs):
        if rule.startswith(f"{name} "):
            where = at if at.endswith(f".{name}") or at == name else f"{at}.{name}"
            return where, rule.removeprefix(f"{name} ")
    return at, rule


def limited(check: TomlChecker, at: str, name: str, limit: Callable[[int], int], value: int) -> int:
    """``limit(value)``, a Python-side rule (such as a cap on a count), whose
    ``ValueError`` ("*name* must be at most ...") is reported at *at* without its name."""
    try:
        return limit(value)
    except ValueError as error:
        raise check.fail(at, str(error).removeprefix(f"{name} ")) from None


class TomlChecker:
    """Typed look-ups into parsed TOML that raise :class:`ScenarioError` on bad input."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, rule: str) -> ScenarioError:
        return ScenarioError(self.source, key, rule)

    def keys(self, table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for key in table:
            if key not in allowed:
                raise self.fail(
                    _join(where, key),
                    f"unknown key{did_you_mean(key, allowed)}; allowed keys: {', '.join(allowed)}",
                )

    def table(self, data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table, got {_kind(value)}")
        return value

    def array_of_tables(
        self, data: Mapping[str, Any], key: str, where: str | None = None
    ) -> Iterator[Mapping[str, Any]]:
        """The tables of ``[[where]]`` (*where* defaults to *key*: a top-level array)."""
        where = key if where is None else where
        rows = data.get(key, [])
        if not isinstance(rows, list):
            raise self.fail(where, f"must be an array of tables ([[{where}]]), got {_kind(rows)}")
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise self.fail(f"{where}[{index}]", f"must be a table, got {_kind(row)}")
            yield row

    def _get(self, table: Mapping[str, Any], key: str, where: str, default: Any) -> Any:
        if key in table:
            return table[key]
        if default is _REQUIRED:
            raise self.fail(_join(where, key), "missing required key")
        return default

    def integer(
        self,
        table: Mapping[str, Any],
        key: str,
        where: str,
        default: Any = None,
        *,
        minimum: int = 0,
    ) -> int:
        """A whole number from *minimum* to ``2**63 - 1``: a count, a size, an id."""
        value = self._get(table, key, where, _REQUIRED if default is None else default)
        at = _join(where, key)
        if type(value) is not int:
            raise self.fail(
                at, f"must be an integer, got {_kind(value)} {value!r}{_spelling(value)}"
            )
        if value < minimum:
            raise self.fail(at, f"must be >= {minimum}, got {value}")
        if value > MAX_TIME_US:
            raise self.fail(at, f"must be at most 2**63 - 1, got {value}")
        return value

    def integers(self, values: Sequence[Any], at: str) -> list[int]:
        """Every item of the array at *at* as an integer (a whole float is refused with
        its integer spelling, as a single integer key's is)."""
        for index, value in enumerate(values):
            if type(value) is not int:
                raise self.fail(
                    f"{at}[{index}]",
                    f"must be an integer, got {_kind(value)} {value!r}{_spelling(value)}",
                )
        return list(values)

    def boolean(self, table: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        value = self._get(table, key, where, default)
        if type(value) is not bool:
            raise self.fail(
                _join(where, key), f"must be true or false, got {_kind(value)} {value!r}"
            )
        return value

    def hashes(
        self, table: Mapping[str, Any], key: str, where: str
    ) -> tuple[int | str, ...] | None:
        """An optional array of integers or strings (a request's block hashes)."""
        if key not in table:
            return None
        value = table[key]
        if not isinstance(value, list) or not all(type(item) in (int, str) for item in value):
            raise self.fail(
                _join(where, key),
                f"must be an array of integers or strings (one hash per full KV block, "
                f"chained), got {_kind(value)} {value!r}",
            )
        return tuple(value)

    def signed_integer(self, table: Mapping[str, Any], key: str, where: str, default: int) -> int:
        """An integer that may be negative (a priority), within the signed 64-bit range."""
        value = self._get(table, key, where, default)
        if type(value) is not int:
            raise self.fail(
                _join(where, key),
                f"must be an integer, got {_kind(value)} {value!r}{_spelling(value)}",
            )
        if not -MAX_TIME_US - 1 <= value <= MAX_TIME_US:
            raise self.fail(_join(where, key), f"must fit in 64 bits, got {value}")
        return value

    def tags(self, table: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
        """An optional table of free-form tags: strings, integers, floats or booleans."""
        if key not in table:
            return None
        at = _join(where, key)
        value = self.table(table, key, at)
        for name, item in value.items():
            if type(item) not in (str, int, float, bool):
                raise self.fail(
                    _join(at, name),
                    f"a tag must be a string, integer, float or boolean, got {_kind(item)} "
                    f"{item!r}",
                )
        return dict(value)

    def time(self, table: Mapping[str, Any], key: str, where: str, default: Any = None) -> int:
        value = self._get(table, key, where, _REQUIRED if default is None else default)
        if type(value) is not int:
            raise self.fail(
                _join(where, key),
                f"must be an integer number of microseconds, got {_kind(value)} {value!r}"
                f"{_spelling(value)}",
            )
        if value < 0:
            raise self.fail(_join(where, key), f"must be >= 0 microseconds, got {value}")
        if value > MAX_TIME_US:
            raise self.fail(_join(where, key), f"must be at most 2**63 - 1, got {value}")
        return value

    def number(self, table: Mapping[str, Any], key: str, where: str, default: Any = None) -> float:
        value = self._get(table, key, where, _REQUIRED if default is None else default)
        if type(value) not in (int, float):
            raise self.fail(_join(where, key), f"must be a number, got {_kind(value)} {value!r}")
        if not math.isfinite(value):
            raise self.fail(_join(where, key), f"must be a finite number, got {value!r}")
        return float(value)

    def optional_number(self, table: Mapping[str, Any], key: str, where: str) -> float | None:
        return None if key not in table else self.number(table, key, where)

    def optional_integer(
        self, table: Mapping[str, Any], key: str, where: str, *, minimum: int = 0
    ) -> int | None:
        return None if key not in table else self.integer(table, key, where, minimum=minimum)

    def optional_time(self, table: Mapping[str, Any], key: str, where: str) -> int | None:
        return None if key not in table else self.time(table, key, where)

    def string(self, table: Mapping[str, Any], key: str, where: str, default: Any = None) -> str:
        value = self._get(table, key, where, _REQUIRED if default is None else default)
        if not isinstance(value, str):
            raise self.fail(_join(where, key), f"must be a string, got {_kind(value)} {value!r}")
        return value

    def choice(
        self,
        table: Mapping[str, Any],
        key: str,
        where: str,
        choices: tuple[str, ...],
        default: str,
    ) -> str:
        value = self.string(table, key, where, default=default or _REQUIRED)
        if value not in choices:
            raise self.fail(
                _join(where, key),
                f"unknown value {value!r}{did_you_mean(value, choices)}; choose one of {choices}",
            )
        return value

    def int_range(self, table: Mapping[str, Any], key: str, where: str) -> tuple[int, int]:
        value = self._get(table, key, where, _REQUIRED)
        if not (isinstance(value, list) and len(value) == 2):
            raise self.fail(
                _join(where, key), f"must be a [min, max] pair of integers, got {value!r}"
            )
        low, high = (self.integer({key: v}, key, where) for v in value)
        if low > high:
            raise self.fail(_join(where, key), f"min {low} is greater than max {high}")
        return (low, high)


_REQUIRED: Any = object()


def _spelling(value: object) -> str:
    """How to write a whole float (``25e9``) as the TOML integer it means, for a message.

    TOML keeps integers and floats apart, and so does simsim: a count or a time written
    as a float is refused, with its integer spelling shown (past ``2**53`` a float no
    longer holds every whole number exactly, so no spelling is guessed there).
    """
    if type(value) is float and value.is_integer() and abs(value) <= 2**53:
        return f" (write {int(value):_}: whole numbers are TOML integers)"
    return ""


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(value: object) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        dict: "table",
    }.get(type(value), type(value).__name__)
