"""A run's results on disk: the one place that writes and reads a results folder.

``simsim run --out DIR`` writes one file per table (:data:`RUN_TABLES`), all in one
format (CSV or parquet), and ``run.json``, the folder's manifest: the format, the
tables it holds, the scenario, the seed, the simsim version, and each table's column
dtypes. ``simsim replay`` writes a *measured* folder the same way: the requests a real
server answered (the simulation's columns, then :data:`MEASURED_REQUEST_DTYPES`'
columns), a ``tokens`` table (:data:`MEASURED_TABLES`) and a manifest with a
``measured`` key. A cluster's tables carry replica columns
(:data:`CLUSTER_REQUEST_DTYPES`, and ``replica`` in the events, admissions and
iterations tables). :func:`read_run_folder` reads them back as the frames were, dtypes
included (CSV keeps none: ``Int64`` times would come back as floats), so ``simsim
plot`` and a user's own notebook see the tables the run produced. Nothing here draws or
runs anything.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import pandas as pd

from simsim._version import __version__
from simsim.admission import append_rejection
from simsim.records import ITERATION_COLUMNS
from simsim.request import Request
from simsim.results import REQUEST_COLUMNS, TOKEN_COLUMNS, requests_frame

__all__ = [
    "CLUSTER_REQUEST_DTYPES",
    "FOLDER_TABLES",
    "FORMATS",
    "MANIFEST",
    "MEASURED_REQUEST_DTYPES",
    "MEASURED_TABLES",
    "RUN_TABLES",
    "VALUE_TYPES",
    "Format",
    "RunFolder",
    "holds_a_run",
    "read_run_folder",
    "write_run_folder",
]

Format = Literal["csv", "parquet"]

FORMATS: Final = ("csv", "parquet")
"""The file formats a results folder can be written in."""

MANIFEST: Final = "run.json"
"""The results folder's manifest: format, tables, scenario, seed, end time, simsim version."""

RUN_TABLES: Final = ("requests", "events", "admissions", "iterations", "summary")
"""The tables a run writes, in this order (``iterations`` only for the batching server)."""

MEASURED_TABLES: Final = ("tokens",)
"""The tables only a measured folder (``simsim replay``) holds: ``tokens``, one row per
token received (:data:`~simsim.results.TOKEN_COLUMNS`)."""

FOLDER_TABLES: Final = (*RUN_TABLES, *MEASURED_TABLES)
"""Every table a results folder may hold, in the order they are written."""

MEASURED_REQUEST_DTYPES: Final[Mapping[str, str]] = {
    "scheduled_time_us": "Int64",
    "send_lag_us": "Int64",
    "cancel_time_us": "Int64",
    "chunk_token_count": "int64",
    "usage_prompt_tokens": "Int64",
    "usage_completion_tokens": "Int64",
    "http_status": "Int64",
    "response_id": "str",
    "error": "str",
}
"""The columns a measured requests table appends to the simulation's, with their dtypes
(``docs/fidelity.md`` says what each holds)."""

CLUSTER_REQUEST_DTYPES: Final[Mapping[str, str]] = {
    "replica": "Int64",
    "prefill_replica": "Int64",
    "decode_replica": "Int64",
    "handoff_time_us": "Int64",
    "decode_admit_time_us": "Int64",
    "transfer_start_us": "Int64",
    "transfer_end_us": "Int64",
    "transfer_us": "Int64",
    "decode_queue_delay_us": "Int64",
}
"""The columns a cluster's requests table appends (``simsim.Cluster.requests_frame``,
``simsim.DisaggregatedCluster.requests_frame``), with their dtypes: ``<NA>`` where a
request never reached a replica or its KV transfer never completed."""

VALUE_TYPES: Final = ("str", "int", "float", "bool", "json")
"""What the manifest's ``value_types`` may say a column of Python objects (a request's
``tag_<key>``) holds: all ``str``, ``int`` (64-bit), ``float`` or ``bool`` values, or
``json``, anything else (mixed types, say), each value stored as its JSON text."""

_MANIFEST_KEYS: Final = (
    "format",
    "tables",
    "scenario",
    "seed",
    "end_us",
    "simsim_version",
    "dtypes",
    "value_types",
)

_INT64 = "Int64"


def _request_dtypes() -> dict[str, str]:
    """Every column a requests table can have, with the dtype its frame gives it."""
    # requests_frame and append_rejection type their own columns: asked, not copied.
    sample = Request(0, 0, 0, 0, request_class="c")
    frame = requests_frame([sample])
    append_rejection(frame, {0: sample})
    return {
        **{str(column): str(dtype) for column, dtype in frame.dtypes.items()},
        "cached_prompt_tokens": "int64",  # BatchingEngine and Cluster with a prefix cache
        **CLUSTER_REQUEST_DTYPES,
        **MEASURED_REQUEST_DTYPES,
    }


# The one rule for the dtypes of a folder whose manifest does not record them (written
# by simsim before it did): the dtype each frame gives each column a table can have. A
# column not listed (a tag) is read as pandas infers it.
_TABLE_DTYPES: Final[Mapping[str, Mapping[str, str]]] = {
    "requests": _request_dtypes(),
    # A cluster's events, admissions and iterations add the replica's index.
    "events": {
        "timestamp_us": _INT64,
        "sequence": "int64",
        "request_id": "int64",
        "replica": "int64",
    },
    "admissions": {
        "timestamp_us": _INT64,
        "request_id": "int64",
        "epoch": "int64",
        "replica": "int64",
    },
    "iterations": {
        **{name: _INT64 for name in ("start_us", "end_us")},
        **{
            name: "int64"
            for name in ITERATION_COLUMNS
            if name not in ("start_us", "end_us", "abandoned")
        },
        "abandoned": "bool",
        "kv_blocks_cached": "int64",
        "replica": "int64",
    },
    "summary": {"value": "float64"},
    "tokens": {**{name: "int64" for name in TOKEN_COLUMNS}, "time_us": _INT64},
}

_INT64_RANGE: Final = (-(2**63), 2**63 - 1)


def write_run_folder(
    folder: str | os.PathLike[str],
    tables: Mapping[str, pd.DataFrame],
    *,
    format: Format = "csv",
    scenario: str | None = None,
    seed: int | None = None,
    end_us: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write *tables* (name -> frame, names from :data:`FOLDER_TABLES`) and the manifest.

    *folder* must exist. Tables an earlier run left there (any of :data:`FOLDER_TABLES`,
    in either format) that this run does not write are removed, so the folder holds
    one run. *end_us*, when given, is the simulated time the run ended at (a served
    session's stop time, with requests still running): plots draw up to it. The
    manifest records each table's column dtypes (``dtypes``) and, for a column of
    Python objects (a request's ``tag_<key>``), what its values are (``value_types``,
    one of :data:`VALUE_TYPES`), so that :func:`read_run_folder` gives the frames back
    as they were. *extra* adds keys to the manifest after the standard ones (JSON
    values; ``simsim replay`` adds ``measured``); it may not replace a standard key.
    Returns the paths written, the manifest last. Raises ``ValueError`` for an unknown
    table or format or an *extra* key that clashes, ``TypeError`` for an *extra* value
    JSON cannot hold, and ``OSError`` when a file cannot be written; the manifest is
    written only after every table, so a folder with a manifest is complete.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    unknown = [name for name in tables if name not in FOLDER_TABLES]
    if unknown:
        raise ValueError(f"unknown run tables {unknown}; a run folder holds {FOLDER_TABLES}")
    clashing = sorted(set(extra or {}) & set(_MANIFEST_KEYS))
    if clashing:
        raise ValueError(
            f"extra manifest keys {clashing} would replace standard ones {_MANIFEST_KEYS}"
        )
    extra_text = json.dumps(dict(extra or {}))  # a TypeError before anything is touched
    names = [name for name in FOLDER_TABLES if name in tables]
    dtypes = {name: {str(c): str(d) for c, d in tables[name].dtypes.items()} for name in names}
    value_types = {name: _value_types(tables[name]) for name in names}
    folder = Path(folder)
    # An earlier run's manifest goes first: until the new one is written, the folder
    # has none, so a write that fails half-way never passes for a complete run.
    (folder / MANIFEST).unlink(missing_ok=True)
    # Tables of an earlier run that this one does not write would be read as its own.
    for name in FOLDER_TABLES:
        for other in FORMATS:
            stale = folder / f"{name}.{other}"
            if (name not in tables or other != format) and stale.is_file():
                stale.unlink()
    written = []
    for name in names:
        path = folder / f"{name}.{format}"
        frame = _encoded(tables[name], value_types[name])
        if format == "csv":
            frame.to_csv(path, index=False, quoting=_csv_quoting(frame))
        else:
            frame.to_parquet(path, index=False)
        written.append(path)
    manifest: dict[str, Any] = {
        "format": format,
        "tables": names,
        "scenario": scenario,
        "seed": seed,
        "end_us": end_us,
        "simsim_version": __version__,
        "dtypes": dtypes,
    }
    if any(value_types.values()):
        manifest["value_types"] = {name: kinds for name, kinds in value_types.items() if kinds}
    manifest.update(json.loads(extra_text))
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    written.append(path)
    return written


def _value_types(frame: pd.DataFrame) -> dict[str, str]:
    """What each column of Python objects in *frame* holds (one of :data:`VALUE_TYPES`)."""
    return {
        str(column): _value_type(frame[column].tolist())
        for column, dtype in frame.dtypes.items()
        if dtype == np.dtype(object)
    }


def _value_type(values: list[Any]) -> str:
    """The narrowest of :data:`VALUE_TYPES` that holds *values* exactly in either format.

    ``None`` is a missing value. A file leaves a missing value empty, so an empty
    string or a NaN is ``json`` (its JSON text is not empty); an ``int`` past 64 bits
    too (parquet has no column for it).
    """
    present = [value for value in values if value is not None]
    types = {type(value) for value in present}
    if types <= {str} and "" not in present:
        return "str"  # also a column of missing values only
    if types == {bool}:
        return "bool"
    low, high = _INT64_RANGE
    if types == {int} and all(low <= value <= high for value in present):
        return "int"
    if types == {float} and not any(math.isnan(value) for value in present):
        return "float"
    return "json"


def _encoded(frame: pd.DataFrame, value_types: Mapping[str, str]) -> pd.DataFrame:
    """*frame* as its file holds it: a ``json`` column's values as their JSON text."""
    columns = [column for column, kind in value_types.items() if kind == "json"]
    if not columns:
        return frame
    encoded = frame.copy()
    for column in columns:
        encoded[column] = pd.Series(
            [None if value is None else _json_text(value) for value in frame[column]],
            index=frame.index,
            dtype=object,
        )
    return encoded


def _csv_quoting(frame: pd.DataFrame) -> Literal[0, 2]:
    """As few quotes as CSV needs, unless a name or a text cell holds a carriage return.

    Python's csv quotes a field that holds a line feed but not one that holds a lone
    carriage return, which a reader then takes for the end of a line: such a table has
    every text field quoted.
    """
    if any("\r" in str(column) for column in frame.columns) or any(
        _holds_carriage_return(frame[column])
        for column, dtype in frame.dtypes.items()
        if dtype == np.dtype(object) or isinstance(dtype, pd.StringDtype)
    ):
        return csv.QUOTE_NONNUMERIC
    return csv.QUOTE_MINIMAL


def _holds_carriage_return(column: pd.Series) -> bool:
    text = column if isinstance(column.dtype, pd.StringDtype) else column.astype("string")
    return bool(text.str.contains("\r", regex=False).any())


def _json_text(value: Any) -> str:
    # A value JSON has no form for (an object of the user's own) is kept as its str().
    return json.dumps(value, default=_plain)


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else str(value)


@dataclass
class RunFolder:
    """A results folder, its tables read on demand (and cached) with their dtypes."""

    folder: Path
    format: Format
    tables: tuple[str, ...]
    manifest: Mapping[str, Any]
    _cache: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def path(self, name: str) -> Path:
        """Where table *name* lives in this folder (it may not exist)."""
        return self.folder / f"{name}.{self.format}"

    def has(self, name: str) -> bool:
        """Whether the folder holds table *name*."""
        return name in self.tables and self.path(name).is_file()

    def table(self, name: str) -> pd.DataFrame:
        """Table *name*; ``FileNotFoundError`` naming the folder and the file if absent."""
        if name not in self._cache:
            path = self.path(name)
            if not self.has(name):
                raise FileNotFoundError(
                    f"results folder {self.folder} has no {path.name} "
                    f"(it holds {', '.join(self.tables) or 'no tables'})"
                )
            recorded = self.manifest.get("dtypes", {}).get(name)
            self._cache[name] = _read(
                path,
                self.format,
                _TABLE_DTYPES.get(name, {}) if recorded is None else recorded,
                self.manifest.get("value_types", {}).get(name, {}),
                exact=recorded is not None,
            )
        return self._cache[name]

    @property
    def measured(self) -> bool:
        """Whether ``simsim replay`` wrote the folder (its times are measured, not simulated)."""
        return "measured" in self.manifest

    def requests(self) -> pd.DataFrame:
        """The requests table, typed as :func:`simsim.results.requests_frame` types it."""
        frame = self.table("requests")
        missing = [column for column in REQUEST_COLUMNS if column not in frame.columns]
        if missing:
            raise ValueError(f"{self.path('requests')} lacks the columns {missing}")
        return frame


def read_run_folder(folder: str | os.PathLike[str]) -> RunFolder:
    """The results folder *folder*, as ``simsim run --out`` wrote it.

    The format, the tables and their dtypes come from its manifest. A folder written
    before the manifest recorded dtypes is read with the dtypes simsim's frames give
    each column (an integer column with gaps then comes back ``Int64``, and a
    ``tag_<key>`` column as pandas infers it). A folder written before the manifest
    existed is read if it holds ``requests.csv`` or ``requests.parquet`` but not both
    (with both, which one belongs to the run cannot be told: ``ValueError``).
    """
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(
            f"results folder {path} does not exist or is not a folder "
            "(write one with 'simsim run --out DIR')"
        )
    manifest_path = path / MANIFEST
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            fmt = manifest["format"]
            tables = tuple(str(name) for name in manifest["tables"])
            _check_columns(manifest, "dtypes", "a dtype")
            _check_columns(manifest, "value_types", f"one of {VALUE_TYPES}", VALUE_TYPES)
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{manifest_path} is not a simsim run manifest ({error})") from None
        if fmt not in FORMATS:
            raise ValueError(f"{manifest_path}: unknown format {fmt!r}")
        return RunFolder(path, fmt, tables, manifest)
    found = [fmt for fmt in FORMATS if (path / f"requests.{fmt}").is_file()]
    if not found:
        raise FileNotFoundError(
            f"results folder {path} has no {MANIFEST}, requests.csv or requests.parquet "
            "(write one with 'simsim run --out DIR')"
        )
    if len(found) > 1:
        raise ValueError(
            f"results folder {path} has no {MANIFEST} and holds both requests.csv and "
            "requests.parquet, so which is the run's cannot be told; run 'simsim run' "
            "into an empty folder"
        )
    only: Format = "csv" if found == ["csv"] else "parquet"
    tables = tuple(name for name in FOLDER_TABLES if (path / f"{name}.{only}").is_file())
    return RunFolder(path, only, tables, {})


def _check_columns(
    manifest: Mapping[str, Any], key: str, what: str, allowed: tuple[str, ...] | None = None
) -> None:
    """Refuse a manifest whose *key* is not ``{table: {column: what}}``, naming the entry."""
    tables = manifest.get(key, {})
    if not isinstance(tables, dict):
        raise ValueError(f"{key} must map each table to its columns, got {type(tables).__name__}")
    for table, columns in tables.items():
        if not isinstance(columns, dict):
            raise ValueError(f"{key}.{table} must map each column to {what}, got {columns!r}")
        for column, value in columns.items():
            if not isinstance(value, str) or (allowed is not None and value not in allowed):
                raise ValueError(f"{key}.{table}.{column} must be {what}, got {value!r}")


def _read(
    path: Path,
    fmt: Format,
    dtypes: Mapping[str, str],
    value_types: Mapping[str, str],
    *,
    exact: bool,
) -> pd.DataFrame:
    """Table *path* with the column *dtypes* and the Python values *value_types* says.

    *exact*: the dtypes are the manifest's record; otherwise they are simsim's guess
    for an older folder, and an ``int64`` column with gaps is read as ``Int64``.
    """
    objects = {
        **{column: "str" for column, dtype in dtypes.items() if dtype == "object"},
        **value_types,
    }
    typed = {column: dtype for column, dtype in dtypes.items() if column not in objects}
    try:
        if fmt == "csv":
            frame = _read_csv(path, typed, objects, exact=exact)
        else:
            frame = pd.read_parquet(path)
        # An older folder's guess yields to gaps: they were there in the frame too.
        widened = {
            column: _INT64 if dtype == "int64" and not exact and frame[column].hasnans else dtype
            for column, dtype in typed.items()
            if column in frame.columns
        }
        frame = frame.astype(widened)
    except ImportError as error:
        raise ImportError(
            f"reading {path} needs pyarrow: pip install 'simsim[parquet]'", name=error.name
        ) from error
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a table simsim wrote ({error})") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: a column has values of the wrong type: {error}") from error
    present = {column: kind for column, kind in objects.items() if column in frame.columns}
    if present:
        stored = _stored_values(path, fmt, frame, list(present))
        for column, kind in present.items():
            values = [_value(path, column, kind, fmt, value) for value in stored[column]]
            frame[column] = pd.Series(values, index=frame.index, dtype=object)
    return frame


def _read_csv(
    path: Path, typed: Mapping[str, str], objects: Iterable[str], *, exact: bool
) -> pd.DataFrame:
    # Each column is parsed straight into its dtype: through float64, as pandas would
    # infer it, an Int64 time past 2**53 would lose its last digits. Only an empty cell
    # is missing: a class, tenant or tag named "NA" or "null" is a name.
    parse: dict[str, Any] = {
        column: _INT64 if dtype == "int64" and not exact else dtype
        for column, dtype in typed.items()
    }
    parse.update(dict.fromkeys(objects, object))
    return pd.read_csv(path, dtype=parse, keep_default_na=False, na_values=[""])


def _stored_values(
    path: Path, fmt: Format, frame: pd.DataFrame, columns: list[str]
) -> Mapping[str, list[Any]]:
    """The values of *columns* as the file holds them, ``None`` where a cell is empty:
    text (CSV) or Python values (parquet)."""
    if fmt == "csv":
        return {
            column: [value if isinstance(value, str) else None for value in frame[column]]
            for column in columns
        }
    # pandas would turn an int column with gaps into floats: pyarrow's types keep the ints.
    stored = pd.read_parquet(path, columns=columns, dtype_backend="pyarrow")
    return {
        column: [None if value is pd.NA else value for value in stored[column].tolist()]
        for column in columns
    }


_PARSERS: Final[Mapping[str, Callable[[str], Any]]] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": lambda text: {"True": True, "False": False}[text],
    "json": json.loads,
}


def _value(path: Path, column: str, kind: str, fmt: Format, stored: Any) -> Any:
    """The Python value a cell of a column of *kind* values stored (``None`` if empty)."""
    if stored is None or (fmt == "parquet" and kind != "json"):
        return stored  # nothing there, or a value parquet kept with its type
    try:
        return _PARSERS[kind](stored)
    except (KeyError, ValueError, TypeError):
        raise ValueError(
            f"{path}: column {column} holds {stored!r}, which is not of the type {kind} "
            f"that {MANIFEST}'s value_types gives it"
        ) from None


def holds_a_run(folder: str | os.PathLike[str]) -> bool:
    """Whether *folder* holds tables (or the manifest) of an earlier run."""
    path = Path(folder)
    names = [MANIFEST, *(f"{name}.{fmt}" for name in FOLDER_TABLES for fmt in FORMATS)]
    return any((path / name).is_file() for name in names)
