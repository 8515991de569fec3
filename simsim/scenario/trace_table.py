"""The ``[trace]`` table: requests replayed from a trace file (CSV, or Mooncake JSON lines)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simsim.scenario.checker import TomlChecker, from_trace_error, out_of_memory_while
from simsim.scenario.model import RequestSpec
from simsim.traces import (
    MOONCAKE_BLOCK_SIZE,
    TraceError,
    TraceOverflowError,
    read_azure_trace,
    read_mooncake_trace,
    read_plain_trace,
)

__all__ = ["parse_trace", "read_trace_csv"]

_TRACE_KEYS = (
    "path",
    "format",
    "time_scale",
    "window_start_us",
    "window_duration_us",
    "window_start_s",
    "window_duration_s",
    "first_request_id",
    "block_size_tokens",
)


def parse_trace(
    check: TomlChecker,
    table: Mapping[str, Any],
    base_dir: Path | None,
    prefix_cache: bool = False,
) -> list[RequestSpec]:
    """The requests of a ``[trace]`` table; *base_dir* anchors a relative path.

    A Mooncake trace's ``hash_ids`` become block hashes only with a *prefix_cache* (the
    scenario's server has one); otherwise they are checked and left out, as other
    columns the server does not use are.
    """
    check.keys(table, _TRACE_KEYS, "trace")
    path = Path(check.string(table, "path", "trace"))
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        where = " (a relative path is read from the scenario file's folder)"
        raise check.fail("trace.path", f"{path} {what}{where if base_dir else ''}")
    fmt = check.choice(table, "format", "trace", ("plain", "azure", "mooncake"), default="plain")
    time_scale = check.number(table, "time_scale", "trace", default=1.0)
    first = check.integer(table, "first_request_id", "trace", default=0)
    window_keys = {
        "plain": ("window_start_us", "window_duration_us"),
        "azure": ("window_start_s", "window_duration_s"),
        "mooncake": (),
    }[fmt]
    if "block_size_tokens" in table and fmt != "mooncake":
        raise check.fail("trace.block_size_tokens", 'only for format "mooncake"')
    for key in _TRACE_KEYS:
        if key.startswith("window_") and key in table and key not in window_keys:
            instead = f"use {' and '.join(window_keys)}" if window_keys else "it has no window"
            raise check.fail(f"trace.{key}", f"not for format {fmt!r}; {instead}")
    try:
        with out_of_memory_while(check.source, lambda: f"reading the trace {path}"):
            requests = _read(check, table, path, fmt, time_scale, first, prefix_cache)
    except TraceOverflowError as error:
        # The trace is fine; this file's time_scale or first_request_id pushed it too far.
        raise check.fail(f"trace.{error.argument}", str(error)) from None
    except TraceError as error:
        raise from_trace_error(error) from None
    except (TypeError, ValueError, OverflowError) as error:
        raise check.fail("trace", str(error)) from None
    return requests


def _read(
    check: TomlChecker,
    table: Mapping[str, Any],
    path: Path,
    fmt: str,
    time_scale: float,
    first: int,
    prefix_cache: bool,
) -> list[RequestSpec]:
    """The trace's requests, read in its format with the table's options."""
    if fmt == "plain":
        return read_plain_trace(
            path,
            time_scale=time_scale,
            window_start_us=check.optional_time(table, "window_start_us", "trace"),
            window_duration_us=check.optional_time(table, "window_duration_us", "trace"),
            first_request_id=first,
        )
    if fmt == "mooncake":
        return read_mooncake_trace(
            path,
            block_size_tokens=check.integer(
                table, "block_size_tokens", "trace", default=MOONCAKE_BLOCK_SIZE, minimum=1
            ),
            time_scale=time_scale,
            first_request_id=first,
            block_hashes=prefix_cache,
        )
    return read_azure_trace(
        path,
        time_scale=time_scale,
        window_start_s=check.optional_number(table, "window_start_s", "trace"),
        window_duration_s=check.optional_number(table, "window_duration_s", "trace"),
        first_request_id=first,
    )


def read_trace_csv(path: str | Path, *, first_request_id: int = 0) -> list[RequestSpec]:
    """Read a plain CSV trace (see :func:`simsim.traces.read_plain_trace`) as specs.

    Errors are :class:`ScenarioError` naming the file, the line and the column.
    """
    try:
        requests = read_plain_trace(path, first_request_id=first_request_id)
    except TraceError as error:
        raise from_trace_error(error) from None
    return requests
