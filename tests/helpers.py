"""Helpers shared by test files (import them with ``from helpers import ...``).

pytest puts this folder on ``sys.path`` while it imports the test files (the folder has
no ``__init__.py``), so a test file imports this module by its bare name.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import simsim

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: ``benchmarks/``, ``examples/`` and ``docs/`` are below it."""

EXHAUSTIVE = os.environ.get("SIMSIM_EXHAUSTIVE", "0") not in ("", "0")
"""True when ``SIMSIM_EXHAUSTIVE=1``: the long runs, not the suite's quick sizes.

The suite's default sizes are chosen to reach every rule's code paths in a few seconds;
an exhaustive run (``SIMSIM_EXHAUSTIVE=1 python -m pytest``) draws ten times as many
property-test examples and runs the M/G/1 validation at the budget documented in
``docs/validation.md``. Use it after changing an engine, before a release.
"""

EXHAUSTIVE_FACTOR = 10
"""How many times more property-test examples an exhaustive run draws."""


def examples(quick: int) -> int:
    """A property test's ``max_examples``: *quick* normally, ten times more if exhaustive."""
    return quick * EXHAUSTIVE_FACTOR if EXHAUSTIVE else quick


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """Import the script at *path* (not on ``sys.path``) as a fresh module and return it.

    The module is registered in ``sys.modules`` under *name* (by default the file's stem
    prefixed with ``script_``) before it runs, because ``dataclasses`` looks a class's
    module up there while decorating it. Each call runs the script's top level again.
    """
    module_name = name if name is not None else f"script_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file that can be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def request_row(request: simsim.Request) -> tuple[Any, ...]:
    """Every field of *request* that ``requests_frame`` reads, as one comparable tuple.

    The frame's other columns (latencies) are computed from these, so two engines whose
    rows are equal have equal request tables; comparing rows is much cheaper than
    building and comparing two DataFrames, which matters in a loop over timestamps.
    """
    return (
        request.request_id,
        request.state,
        request.arrival_time_us,
        request.prompt_token_count,
        request.max_output_tokens,
        request.generated_token_count,
        request.admit_time_us,
        request.prefill_end_time_us,
        request.first_token_time_us,
        request.finish_time_us,
    )


def request_table(engine: simsim.SimulationEngine | simsim.BatchingEngine) -> list[tuple[Any, ...]]:
    """:func:`request_row` of every request of *engine*, in request id order."""
    requests = engine.requests  # read once: the fast engine catches up on every read
    return [request_row(requests[rid]) for rid in sorted(requests)]
