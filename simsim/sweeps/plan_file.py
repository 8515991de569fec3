"""A capacity plan from a scenario file: ``simsim plan SCENARIO.toml``.

The scenario (``engine = "vllm"``, valid as it stands: its ``[vllm]`` gpu and tp must
fit) gives what stays fixed: the model and vLLM's settings of its ``[vllm]`` table (and
the physics coefficients of a ``[backend] kind = "physics"``), its requests
(``[workload]``, ``[[requests]]``, ``[trace]``, with its seed), the router of its
``[cluster]`` and its own GPUs (``[gpus.<name>]``). An optional
``[plan]`` table gives what is searched and the targets; every key of it is optional:

.. code-block:: toml

    [plan]
    gpus = ["H100", "A100-80GB", "L40S"]    # GPU types to try (the file's own GPUs too)
    tp = [1, 2, 4, 8]                       # tensor-parallel degrees
    max_replicas = 16
    targets = { ttft_p99_ms = 2000, itl_p99_ms = 100 }
    prices = { H100 = 2.49 }                # USD per GPU-hour, instead of the presets'
    router = "least_outstanding"            # default: [cluster]'s router, else this one

:func:`plan_from_file` runs :func:`~simsim.sweeps.plan.plan_capacity` with them; its
keyword arguments (the command's flags) replace the table's keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simsim.gpu.gpus import GpuSpec
from simsim.gpu.vllm import VllmConfig
from simsim.scenario import ScenarioError, parse_scenario, read_toml
from simsim.scenario.checker import TomlChecker
from simsim.scenario.gpu_tables import parse_gpus
from simsim.sweeps.plan import CapacityPlan, plan_capacity
from simsim.workloads import ClosedLoopWorkload, GeneratedWorkload, PatienceDeadline

__all__ = ["PLAN_KEYS", "PlanFile", "ScenarioRequests", "load_plan_file", "plan_from_file"]

PLAN_KEYS = ("gpus", "tp", "max_replicas", "targets", "prices", "router")
"""The keys of a scenario's ``[plan]`` table."""


@dataclass(frozen=True)
class ScenarioRequests:
    """A scenario's requests and client deadlines, drawn once from its seed: a workload
    whose ``generate`` gives them whatever the seed (the scenario's seed made them)."""

    generated: GeneratedWorkload

    def generate(self, seed: int) -> GeneratedWorkload:
        """The scenario's requests and deadlines (*seed* is not used)."""
        return self.generated


@dataclass(frozen=True)
class PlanFile:
    """What a scenario file fixes for a capacity plan (see the module docs).

    ``template`` is its ``[vllm]`` server (its GPU and tp are replaced per
    configuration), ``requests`` its requests, ``seed`` its seed, ``router`` its
    ``[cluster]``'s router (``None`` without one), ``gpus`` its own GPUs by name and
    ``plan`` its ``[plan]`` table's keys (type-checked; the values are checked by
    :func:`~simsim.sweeps.plan.plan_capacity`).
    """

    source: str
    template: VllmConfig
    requests: ScenarioRequests
    seed: int
    router: str | None
    gpus: Mapping[str, GpuSpec]
    plan: Mapping[str, Any]


def load_plan_file(path: str | os.PathLike[str], *, seed: int | None = None) -> PlanFile:
    """Read a scenario file for a plan; *seed* overrides its seed. Errors are
    :class:`~simsim.scenario.ScenarioError` s naming the key."""
    path = Path(path)
    source = str(path)
    document = dict(read_toml(path))
    check = TomlChecker(source)
    table = dict(check.table(document, "plan", "plan"))
    document.pop("plan", None)
    check.keys(table, PLAN_KEYS, "plan")
    try:
        scenario = parse_scenario(document, source=source, base_dir=path.parent)
    except ScenarioError as error:
        if error.key not in ("vllm.tp", "vllm.gpu"):
            raise
        raise ScenarioError(
            source,
            error.key,
            f"{error.rule} (the scenario must run as it stands: give [vllm] a gpu and tp "
            "that fit; each configuration of the plan replaces them)",
        ) from None
    if seed is not None:
        scenario = scenario.with_seed(seed)
    if scenario.vllm is None:
        raise check.fail(
            "scenario.engine",
            'simsim plan needs engine = "vllm" with a [vllm] table (the model and its '
            "server's settings)",
        )
    if isinstance(scenario.workload, ClosedLoopWorkload):
        raise check.fail(
            "workload",
            "simsim plan needs requests made before the run (open-loop, listed or traced); "
            "a closed-loop workload's depend on the server",
        )
    deadlines = [PatienceDeadline(c.time_us, c.request_id) for c in scenario.cancellations]
    generated = scenario.generated()
    if generated is not None:
        deadlines.extend(generated.cancellations)
    requests = GeneratedWorkload(tuple(scenario.all_requests()), tuple(sorted(deadlines)))
    pool = None if scenario.cluster is None else scenario.cluster.pool
    return PlanFile(
        source,
        scenario.vllm,
        ScenarioRequests(requests),
        scenario.seed,
        None if pool is None else pool.router,
        parse_gpus(check, document),
        _checked_plan(check, table),
    )


def _checked_plan(check: TomlChecker, table: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[plan]`` table's keys, each of the right kind."""
    kinds: dict[str, tuple[type, str]] = {
        "gpus": (list, "a list of GPU names"),
        "tp": (list, "a list of tensor-parallel degrees"),
        "max_replicas": (int, "a whole number"),
        "targets": (dict, "a table of metric = limit in ms, e.g. { ttft_p99_ms = 2000 }"),
        "prices": (dict, "a table of GPU = USD per GPU-hour, e.g. { H100 = 2.49 }"),
        "router": (str, "a router's name"),
    }
    for key, value in table.items():
        kind, what = kinds[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise check.fail(f"plan.{key}", f"must be {what}, got {value!r}")
    return dict(table)


def plan_from_file(
    path: str | os.PathLike[str], *, seed: int | None = None, **overrides: Any
) -> CapacityPlan:
    """:func:`~simsim.sweeps.plan.plan_capacity` of a scenario file's server and requests.

    *overrides* are ``plan_capacity``'s keyword arguments (``gpus``, ``tp``,
    ``max_replicas``, ``targets``, ``prices``, ``router``, ``workers``, ``executor``,
    ``progress``...); they replace the ``[plan]`` table's keys. GPU names may be the
    file's own ``[gpus.<name>]``. A ``[plan]`` value of the wrong kind is a
    :class:`~simsim.scenario.ScenarioError` naming its key; a bad value of the right kind
    is ``plan_capacity``'s ``ValueError``.
    """
    found = load_plan_file(path, seed=seed)
    settings: dict[str, Any] = {**found.plan, **overrides}
    if "router" not in settings and found.router is not None:
        settings["router"] = found.router
    own = {name.lower(): spec for name, spec in found.gpus.items()}
    if "gpus" in settings:
        settings["gpus"] = [
            own.get(gpu.lower(), gpu) if isinstance(gpu, str) else gpu for gpu in settings["gpus"]
        ]
    if "targets" not in settings:
        raise ScenarioError(
            found.source,
            "plan.targets",
            "give at least one target, e.g. targets = { ttft_p99_ms = 2000 } (simsim plan: "
            "or --ttft-p99 2s)",
        )
    return plan_capacity(found.template, found.requests, seed=found.seed, **settings)
