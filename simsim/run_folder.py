"""A run's results on disk: the one place that writes and reads a results folder.

``simsim run --out DIR`` writes one file per table (:data:`RUN_TABLES`), all in one
format (CSV or parquet), and ``run.json``, the folder's manifest: the format, the
tables it holds, the scenario, the seed and the simsim version. ``simsim replay``
writes a *measured* folder the same way: the requests a real server answered (the
simulation's columns, then :data:`MEASURED_REQUEST_DTYPES`' columns), a ``tokens``
table (:data:`MEASURED_TABLES`) and a manifest with a ``measured`` key. A cluster's
tables carry replica columns (:data:`CLUSTER_REQUEST_DTYPES`, and ``replica`` in the
events, admissions and iterations tables). :func:`read_run_folder`
reads them back with the dtypes the frames had (CSV keeps none: ``Int64`` times would
come back as floats), so ``simsim plot`` and a user's own notebook see the tables the
run produced. Nothing here draws or runs anything.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import pandas as pd

from simsim._version import __version__
from simsim.records import ITERATION_COLUMNS
from simsim.results import REQUEST_COLUMNS, requests_frame

__all__ = [
    "CLUSTER_REQUEST_DTYPES",
    "FOLDER_TABLES",
    "FORMATS",
    "MANIFEST",
    "MEASURED_REQUEST_DTYPES",
    "MEASURED_TABLES",
    "RUN_TABLES",
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
token received (``request_id``, ``token_index`` from 1, ``time_us``)."""

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

_MANIFEST_KEYS: Final = ("format", "tables", "scenario", "seed", "end_us", "simsim_version")

# The dtypes CSV loses, per table; columns not listed are read as pandas infers them.
_INT64 = "Int64"
_TABLE_DTYPES: Final[Mapping[str, Mapping[str, str]]] = {
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
        "replica": "int64",
    },
    "summary": {"value": "float64"},
    "tokens": {"request_id": "int64", "token_index": "int64", "time_us": _INT64},
}


def _dtypes(name: str) -> Mapping[str, str]:
    if name == "requests":
        simulated = {str(column): str(dtype) for column, dtype in requests_frame([]).dtypes.items()}
        return {**simulated, **MEASURED_REQUEST_DTYPES, **CLUSTER_REQUEST_DTYPES}
    return _TABLE_DTYPES.get(name, {})


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
    session's stop time, with requests still running): plots draw up to it. *extra*
    adds keys to the manifest after the standard ones (JSON values; ``simsim replay``
    adds ``measured``); it may not replace a standard key. Returns the paths written,
    the manifest last. Raises ``ValueError`` for an unknown table or format or an
    *extra* key that clashes, ``TypeError`` for an *extra* value JSON cannot hold, and
    ``OSError`` when a file cannot be written; the manifest is written only after
    every table, so a folder with a manifest is complete.
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
    for name in FOLDER_TABLES:
        if name not in tables:
            continue
        path = folder / f"{name}.{format}"
        if format == "csv":
            tables[name].to_csv(path, index=False)
        else:
            tables[name].to_parquet(path, index=False)
        written.append(path)
    manifest = {
        "format": format,
        "tables": [name for name in FOLDER_TABLES if name in tables],
        "scenario": scenario,
        "seed": seed,
        "end_us": end_us,
        "simsim_version": __version__,
        **json.loads(extra_text),
    }
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    written.append(path)
    return written


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
            self._cache[name] = _read(path, self.format, _dtypes(name))
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

    The format and the tables come from its manifest. A folder written before the
    manifest existed is read if it holds ``requests.csv`` or ``requests.parquet`` but
    not both (with both, which one belongs to the run cannot be told: ``ValueError``).
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


def _read(path: Path, fmt: Format, dtypes: Mapping[str, str]) -> pd.DataFrame:
    if fmt == "csv":
        try:
            frame = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: not a table simsim wrote ({error})") from None
    else:
        try:
            frame = pd.read_parquet(path)
        except ImportError as error:
            raise ImportError(
                f"reading {path} needs pyarrow: pip install 'simsim[parquet]'",
                name=error.name,
            ) from error
    present = {column: dtype for column, dtype in dtypes.items() if column in frame.columns}
    try:
        return frame.astype(present)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: a column has values of the wrong type: {error}") from error


def holds_a_run(folder: str | os.PathLike[str]) -> bool:
    """Whether *folder* holds tables (or the manifest) of an earlier run."""
    path = Path(folder)
    names = [MANIFEST, *(f"{name}.{fmt}" for name in FOLDER_TABLES for fmt in FORMATS)]
    return any((path / name).is_file() for name in names)
