"""Sweep points: a grid of scenario settings crossed with named cases, and their seeds.

A *setting* is a dotted key into a scenario document (the TOML file as a nested dict),
such as ``"workload.rate_per_s"`` or ``"batching.max_active_requests"``, and the value
to put there. A point is one case's settings plus one value of every grid axis. Its
identity (``key``) is a hash of its case name and settings, so a point keeps its key,
and its seeds, however the grid around it is ordered or extended.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "MAX_RUNS",
    "Case",
    "SweepPoint",
    "apply_settings",
    "check_run_count",
    "expand_grid",
    "plain_value",
    "run_seed",
]

MAX_RUNS = 1_000_000
"""The most runs (points x replications) one sweep or capacity search may make.

Every run is a whole simulation, and the sweep holds a record of each: a million runs
of a few milliseconds each already take hours on a laptop. A sweep that asks for more
was not meant, and is refused before any point or run is made."""


def check_run_count(runs: int, what: str) -> None:
    """Refuse *runs* when it is more than :data:`MAX_RUNS`, the message saying where
    they come from (*what*, such as ``"4 points x 10 replications"``); called before
    anything is made."""
    if runs > MAX_RUNS:
        raise ValueError(
            f"{what} is {runs:,} runs, more than a sweep may make ({MAX_RUNS:,}; every run "
            "is a whole simulation): use fewer grid values, cases or replications"
        )


@dataclass(frozen=True)
class Case:
    """A named configuration: settings applied to the base scenario before the grid's."""

    name: str
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: a case (or none), the grid values, and a stable key."""

    index: int
    case: str | None
    params: Mapping[str, Any]
    settings: Mapping[str, Any]
    key: str

    def label(self) -> str:
        """A short human-readable name, e.g. ``batching-16, workload.rate_per_s=2.0``."""
        parts = [] if self.case is None else [self.case]
        parts.extend(f"{name}={value!r}" for name, value in self.params.items())
        return ", ".join(parts) or "base"


def plain_value(value: Any, where: str) -> Any:
    """*value* as a plain JSON-compatible Python value (NumPy scalars unwrapped).

    Allowed: bool, int, finite float, str, and lists and tables of those. Anything else
    raises ``TypeError`` naming *where*.
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        result = float(value)
        if not math.isfinite(result):
            raise ValueError(f"{where}: values must be finite, got {result!r}")
        return result
    if isinstance(value, Mapping):
        return {str(k): plain_value(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"{where}: a sweep value must be a bool, int, float, str, list or table, "
        f"got {type(value).__name__} {value!r}"
    )


def _check_key(key: object, where: str) -> str:
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise ValueError(
            f"{where}: {key!r} is not a dotted scenario key such as 'workload.rate_per_s'"
        )
    return key


def apply_settings(document: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of *document* with every dotted key of *settings* set to its value.

    Missing tables on the way are created. An array of tables whose entries have names
    (``[[workload.classes]]``) is entered by name: ``workload.classes.batch.rate_per_s``
    sets ``rate_per_s`` in the class named ``batch``. A key whose path runs through a
    value that is not a table, or names an entry no table of the array has, raises
    ``ValueError`` naming the key.
    """
    result = copy.deepcopy(dict(document))
    for key, value in settings.items():
        parts = key.split(".")
        table: dict[str, Any] = result
        depth = 0
        while depth < len(parts) - 1:
            part = parts[depth]
            prefix = ".".join(parts[: depth + 1])
            child = table.setdefault(part, {})
            if isinstance(child, list) and child and all(isinstance(t, dict) for t in child):
                # The next part names an entry of the array of tables: step into it.
                if depth + 2 >= len(parts):
                    raise ValueError(
                        f"cannot set {key!r}: it names a whole entry of {prefix!r}; set one "
                        "of the entry's keys instead"
                    )
                table = _named_entry(key, prefix, child, parts[depth + 1])
                depth += 2
                continue
            if not isinstance(child, dict):
                raise ValueError(
                    f"cannot set {key!r}: {prefix!r} is a {type(child).__name__}, not a table"
                )
            table = child
            depth += 1
        table[parts[-1]] = copy.deepcopy(value)
    return result


def _named_entry(key: str, prefix: str, entries: list[Any], name: str) -> dict[str, Any]:
    """The table of *entries* (an array of tables at *prefix*) whose ``name`` is *name*."""
    for entry in entries:
        if entry.get("name") == name:
            return entry  # type: ignore[no-any-return]
    names = [entry.get("name") for entry in entries]
    raise ValueError(
        f"cannot set {key!r}: {prefix!r} has no entry named {name!r} (its names: {names})"
    )


def _point_key(case: str | None, settings: Mapping[str, Any]) -> str:
    identity = json.dumps(
        {"case": case, "settings": settings}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:32]


def expand_grid(
    grid: Mapping[str, Sequence[Any]] | None = None,
    cases: Sequence[Case] | None = None,
) -> list[SweepPoint]:
    """Every case crossed with every combination of grid values, in a stable order.

    Cases vary slowest, then the grid's axes in the order given (the last axis varies
    fastest). No grid and no cases give one point: the base scenario itself. A grid
    axis must have at least one value, and a grid key may not also be set by a case.
    """
    axes: dict[str, list[Any]] = {}
    for key, values in (grid or {}).items():
        _check_key(key, "grid")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
            raise TypeError(
                f"grid.{key}: give a list of values, got {type(values).__name__} {values!r}"
            )
        plain = [plain_value(v, f"grid.{key}[{i}]") for i, v in enumerate(values)]
        if not plain:
            raise ValueError(f"grid.{key}: needs at least one value")
        if len({json.dumps(v, sort_keys=True) for v in plain}) != len(plain):
            raise ValueError(f"grid.{key}: a value appears twice in {plain!r}")
        axes[key] = plain
    case_list: list[Case | None] = list(cases) if cases else [None]
    # Counted before a point is made: a grid of a few long axes multiplies fast.
    factors = [f"{len(values)} values of {key}" for key, values in axes.items()]
    if cases:
        factors.append(f"{len(case_list)} cases")
    check_run_count(
        math.prod(len(values) for values in axes.values()) * len(case_list),
        f"the grid ({' x '.join(factors)}), with one replication,",
    )
    names: set[str] = set()
    checked: list[Case | None] = []
    for case in case_list:
        if case is None:
            checked.append(None)
            continue
        if not isinstance(case.name, str) or not case.name:
            raise ValueError(f"cases: every case needs a non-empty name, got {case.name!r}")
        if case.name in names:
            raise ValueError(f"cases: the name {case.name!r} appears twice")
        names.add(case.name)
        settings = {
            _check_key(k, f"cases.{case.name}"): plain_value(v, f"cases.{case.name}.{k}")
            for k, v in case.settings.items()
        }
        clash = sorted(set(settings) & set(axes))
        if clash:
            raise ValueError(
                f"cases.{case.name}: {clash[0]!r} is also a grid axis; set it in one place"
            )
        checked.append(Case(case.name, settings))
    points: list[SweepPoint] = []
    for case in checked:
        for combination in itertools.product(*axes.values()):
            params = dict(zip(axes, combination, strict=True))
            settings = {**(case.settings if case else {}), **params}
            name = case.name if case else None
            points.append(
                SweepPoint(len(points), name, params, settings, _point_key(name, settings))
            )
    return points


def run_seed(root_seed: int, point_key: str, replication: int) -> int:
    """The scenario seed of one run, from ``SeedSequence`` keyed by point and replication.

    The root seed is the entropy; the point's key (as four 32-bit words) and the
    replication number form the spawn key. The result is a non-negative 63-bit int,
    the same on every machine, process and executor.
    """
    words = tuple(int(point_key[i : i + 8], 16) for i in range(0, 32, 8))
    sequence = np.random.SeedSequence(root_seed, spawn_key=(*words, replication))
    return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1))
