"""Sweep files: a TOML description of a sweep or capacity search, for ``simsim sweep``.

The format is documented in ``docs/sweeps.md``. Every error is a
:class:`~simsim.scenario.ScenarioError` naming the file, the key and the rule.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from simsim.results import DEFAULT_PERCENTILES
from simsim.scenario import ScenarioError, TomlChecker, read_toml
from simsim.sweeps.capacity import (
    check_tolerance,
    target_metrics,
)
from simsim.sweeps.grid import Case, check_run_count, expand_grid
from simsim.sweeps.runner import RESERVED_KEYS, ScenarioSource, resolve_source
from simsim.sweeps.sweep import check_replications
from simsim.wording import counted

__all__ = ["CapacitySpec", "SweepSpec", "load_sweep"]

_TOP_KEYS = ("sweep", "base", "grid", "cases", "capacity")
_SWEEP_KEYS = (
    "scenario",
    "replications",
    "seed",
    "confidence",
    "ttft_slo_us",
    "tpot_slo_us",
    "percentiles",
    "load",
)
_CAPACITY_KEYS = (
    "parameter",
    "low",
    "high",
    "find",
    "tolerance",
    "max_replications",
    "targets",
)


@dataclass(frozen=True)
class CapacitySpec:
    """The ``[capacity]`` table: what to search for, in each configuration of the sweep."""

    parameter: str
    low: int | float
    high: int | float
    integer: bool
    find: Literal["max", "min"]
    tolerance: int | float
    max_replications: int
    targets: Mapping[str, float]


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file."""

    path: Path
    source: ScenarioSource
    grid: Mapping[str, list[Any]]
    cases: list[Case] | None
    replications: int
    seed: int
    confidence: float
    ttft_slo_us: int | None
    tpot_slo_us: float | None
    percentiles: tuple[float, ...]
    load: str | None
    capacity: CapacitySpec | None


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables to dotted keys: ``{workload = {rate_per_s = [..]}}`` -> one key."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def load_sweep(path: str | os.PathLike[str]) -> SweepSpec:
    """Read and validate a sweep file, including every point's scenario."""
    path = Path(path)
    source = str(path)
    data = read_toml(path)
    check = TomlChecker(source)
    check.keys(data, _TOP_KEYS, "")
    head = check.table(data, "sweep", "sweep")
    check.keys(head, _SWEEP_KEYS, "sweep")

    if ("scenario" in head) == ("base" in data):
        raise check.fail(
            "sweep.scenario",
            "give either sweep.scenario (a scenario file) or an inline [base] scenario table",
        )
    if "scenario" in head:
        scenario_path = Path(check.string(head, "scenario", "sweep"))
        if not scenario_path.is_absolute():
            scenario_path = path.parent / scenario_path
        try:
            scenario_source = resolve_source(scenario_path)
        except ScenarioError as error:
            raise check.fail("sweep.scenario", str(error)) from None
    else:
        base = check.table(data, "base", "base")
        scenario_source = ScenarioSource(
            base, str(path.parent.resolve()), f"{source} [base]", from_file=True
        )

    replications = _replications(check, head, "replications", "sweep", 3)
    seed = check.integer(head, "seed", "sweep", default=0)
    confidence = check.number(head, "confidence", "sweep", default=0.95)
    if not 0 < confidence < 1:
        raise check.fail("sweep.confidence", f"must be strictly between 0 and 1, got {confidence}")
    ttft_slo_us = check.optional_time(head, "ttft_slo_us", "sweep")
    tpot_slo_us = check.optional_number(head, "tpot_slo_us", "sweep")
    percentiles = _percentiles(check, head)

    grid_table = check.table(data, "grid", "grid")
    grid = _flatten(grid_table)
    for key, values in grid.items():
        if not isinstance(values, list):
            raise check.fail(f"grid.{key}", f"must be an array of values, got {values!r}")
    cases = None
    if "cases" in data:
        cases_table = check.table(data, "cases", "cases")
        cases = []
        for name, settings in cases_table.items():
            if not isinstance(settings, dict):
                raise check.fail(f"cases.{name}", "must be a table of scenario settings")
            cases.append(Case(name, _flatten(settings)))
        if not cases:
            raise check.fail("cases", "needs at least one case")

    settings = [(f"grid.{key}", key) for key in grid] + [
        (f"cases.{case.name}.{key}", key) for case in cases or () for key in case.settings
    ]
    for where, key in settings:
        if key in RESERVED_KEYS:
            raise check.fail(where, "the sweep sets each run's seed; use sweep.seed instead")

    capacity = None
    if "capacity" in data:
        capacity = _capacity(check, check.table(data, "capacity", "capacity"), grid, replications)
        percentiles = tuple(dict.fromkeys([*percentiles, *target_metrics(capacity.targets)[1]]))

    try:
        points = expand_grid(grid, cases)
        check_run_count(
            len(points) * replications,
            f"{counted(len(points), 'point')} x {counted(replications, 'replication')}",
        )
    except (TypeError, ValueError) as error:
        raise check.fail("grid" if cases is None else "cases", str(error)) from None
    load = head.get("load")
    if load is not None and (not isinstance(load, str) or load not in grid):
        raise check.fail(
            "sweep.load", f"must name one of the grid's keys {list(grid)}, got {load!r}"
        )
    for point in points:
        if capacity is not None:
            # Check the searched parameter's bounds too, not only the grid's values.
            for value in (capacity.low, capacity.high):
                scenario_source.check(
                    expand_grid(
                        {capacity.parameter: [value]},
                        [Case(point.case or "base", point.settings)],
                    )[0]
                )
        else:
            scenario_source.check(point)
    return SweepSpec(
        path=path,
        source=scenario_source,
        grid=grid,
        cases=cases,
        replications=replications,
        seed=seed,
        confidence=confidence,
        ttft_slo_us=ttft_slo_us,
        tpot_slo_us=tpot_slo_us,
        percentiles=percentiles,
        load=load,
        capacity=capacity,
    )


def _replications(
    check: TomlChecker, table: Mapping[str, Any], key: str, where: str, default: int
) -> int:
    """A count of replications: at least 1, at most what a sweep may run."""
    value = check.integer(table, key, where, default=default, minimum=1)
    try:
        return check_replications(value, f"{where}.{key}")
    except ValueError as error:
        rule = str(error).removeprefix(f"{where}.{key} ")
        raise check.fail(f"{where}.{key}", rule) from None


def _percentiles(check: TomlChecker, head: Mapping[str, Any]) -> tuple[float, ...]:
    values = head.get("percentiles", list(DEFAULT_PERCENTILES))
    if not isinstance(values, list) or not values:
        raise check.fail("sweep.percentiles", f"must be a non-empty array, got {values!r}")
    for value in values:
        if type(value) not in (int, float) or not 0 < value < 100:
            raise check.fail(
                "sweep.percentiles", f"values must be numbers in (0, 100), got {value!r}"
            )
    return tuple(float(v) for v in values)


def _capacity(
    check: TomlChecker, table: Mapping[str, Any], grid: Mapping[str, Any], replications: int
) -> CapacitySpec:
    check.keys(table, _CAPACITY_KEYS, "capacity")
    parameter = check.string(table, "parameter", "capacity")
    if parameter in grid:
        raise check.fail(
            "capacity.parameter", f"{parameter!r} is searched, so it cannot also be a grid key"
        )
    low = check.number(table, "low", "capacity")
    high = check.number(table, "high", "capacity")
    if not low < high:
        raise check.fail("capacity.high", f"must be above low ({low}), got {high}")
    integer = type(table["low"]) is int and type(table["high"]) is int
    if integer:
        low, high = int(table["low"]), int(table["high"])
    find: Literal["max", "min"] = (
        "min"
        if check.choice(table, "find", "capacity", ("max", "min"), default="max") == "min"
        else "max"
    )
    try:
        tolerance = check_tolerance(table.get("tolerance"), low, high, integer)
    except ValueError as error:
        raise check.fail("capacity.tolerance", str(error)) from None
    if replications < 2:
        raise check.fail("sweep.replications", "a capacity search needs at least 2")
    max_replications = _replications(check, table, "max_replications", "capacity", 4 * replications)
    if max_replications < replications:
        raise check.fail(
            "capacity.max_replications",
            f"must be at least sweep.replications ({replications}), got {max_replications}",
        )
    targets = check.table(table, "targets", "capacity.targets")
    try:
        checked, _ = target_metrics(targets)
    except ValueError as error:
        raise check.fail("capacity.targets", str(error)) from None
    return CapacitySpec(parameter, low, high, integer, find, tolerance, max_replications, checked)
