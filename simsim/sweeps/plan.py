"""How many GPUs: the cheapest GPU type x tensor parallelism x replicas within SLO targets.

:func:`plan_capacity` tries every (GPU, tp) pair. A pair whose tp does not split the
model, or whose GPUs cannot hold the model (or one request's KV cache), is reported as
such and never run. For the others it finds the fewest replicas that meet every target:
one replica first, then ``max_replicas`` if one missed, then bisection between them,
assuming that more replicas never make a target worse (the same requests spread over
more servers). Each probed count is one seeded run of
:class:`~simsim.gpu.deployment.Deployment` serving the workload; every configuration
serves the same requests (the same seed), so they compare on equal terms. A run *meets*
the targets when it is not overloaded (:func:`simsim.overload.overload_check`) and
every target metric is at or below its limit. The answer is the passing configuration
with the lowest $/hour (GPUs x the GPU's price per GPU-hour); ties go to fewer GPUs,
then to the earlier GPU and tp in the lists given.

The probes of all pairs run round by round on one executor (a process pool, Dask...),
so a round's runs go in parallel.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import pandas as pd

from simsim.checks import check_positive_int, check_real, did_you_mean
from simsim.cluster.routers import ROUTERS
from simsim.gpu.deployment import LATENCIES, Deployment, Workload, metric_names
from simsim.gpu.gpus import GpuSpec, load_gpu
from simsim.gpu.memory import DoesNotFitError, check_tensor_parallel
from simsim.gpu.models import ModelSpec, load_model
from simsim.gpu.vllm import VllmConfig
from simsim.results import DEFAULT_PERCENTILES, percentile_label
from simsim.sweeps.capacity import is_percentile
from simsim.sweeps.pool import WorkerPool
from simsim.sweeps.signals import StopOnSignals
from simsim.wording import counted
from simsim.workloads import check_seed

__all__ = [
    "PLAN_COLUMNS",
    "VERDICTS",
    "CapacityPlan",
    "PlannedDeployment",
    "check_plan_targets",
    "plan_capacity",
]

VERDICTS = ("meets", "misses", "overloaded", "does not fit", "invalid tp")
"""What the plan's table says of each row: the run met every target, missed one (the
reason says which and by how much), was overloaded; or the configuration was never
run because the model (or a request's KV cache) does not fit, or the tp cannot split it."""

PLAN_COLUMNS = ("gpu", "tp", "replicas", "gpus", "usd_per_hour")
"""The first columns of :attr:`CapacityPlan.table`; the metrics, ``overloaded``,
``verdict``, ``reason`` and ``best`` follow."""

MAX_PLAN_REPLICAS = 1024
"""The largest ``max_replicas`` a plan takes (every probe builds that many servers)."""

_TARGET_HELP = (
    "use <latency>_<statistic>_ms with latency ttft, itl or e2e and statistic 'mean' or "
    "a percentile such as 'p99' (e.g. ttft_p99_ms), a limit in milliseconds"
)


def check_plan_targets(targets: object) -> tuple[dict[str, float], list[float]]:
    """Check *targets* (metric -> upper limit in ms) and list the percentiles they need.

    A metric is ``<latency>_<statistic>_ms``: latency ``ttft``, ``itl`` or ``e2e``,
    statistic ``mean`` or a percentile (``p50``, ``p90``, ``p99``, ``p99.9``...), as in
    ``{"ttft_p99_ms": 2000, "itl_p99_ms": 100}``. Limits are positive finite numbers.
    """
    if not isinstance(targets, Mapping) or not targets:
        raise ValueError(
            "targets must be a non-empty mapping of metric to limit in ms, e.g. "
            f"{{'ttft_p99_ms': 2000}}, got {targets!r}"
        )
    examples = [f"{n}_{s}_ms" for n in LATENCIES for s in ("mean", "p50", "p90", "p99")]
    percentiles = list(DEFAULT_PERCENTILES)
    checked: dict[str, float] = {}
    for name, limit in targets.items():
        text = str(name)
        latency, _, rest = text.partition("_")
        statistic, _, unit = rest.rpartition("_")
        known = statistic == "mean" or is_percentile(statistic)
        if latency not in LATENCIES or unit != "ms" or not known:
            raise ValueError(
                f"targets: unknown metric {text!r}{did_you_mean(text, examples)}; {_TARGET_HELP}"
            )
        if statistic != "mean":
            quantile = float(statistic[1:])
            if percentile_label(quantile) != statistic:
                raise ValueError(
                    f"targets: write {text!r} as {latency}_{percentile_label(quantile)}_ms"
                )
            if quantile not in percentiles:
                percentiles.append(quantile)
        checked[text] = float(check_real(limit, f"targets[{text!r}]", positive=True))
    return checked, percentiles


@dataclass(frozen=True)
class PlannedDeployment:
    """The plan's answer: the cheapest configuration that met every target.

    ``config`` is the vLLM server (its model, GPU and tp), ``replicas`` how many run behind
    the router named ``router``; ``gpus`` = replicas x tp and ``usd_per_hour`` = gpus x the
    GPU-hour price used. ``metrics`` are its run's client latencies (ms) and overload flag.
    """

    config: VllmConfig
    replicas: int
    router: str
    gpus: int
    usd_per_hour: float
    metrics: Mapping[str, float]

    @property
    def gpu(self) -> str:
        """The GPU's name."""
        return self.config.gpu.name

    @property
    def tp(self) -> int:
        """GPUs per replica."""
        return self.config.tp

    def deployment(self) -> Deployment:
        """This configuration as a :class:`~simsim.gpu.deployment.Deployment` to run."""
        return Deployment(self.config, self.replicas, self.router)

    def __str__(self) -> str:
        gpus = counted(self.gpus, f"{self.gpu} GPU")
        replicas = counted(self.replicas, "replica")
        return f"{gpus} ({replicas} at tp={self.tp}), ${self.usd_per_hour:,.2f}/hour"


@dataclass(frozen=True)
class CapacityPlan:
    """What :func:`plan_capacity` tried and found.

    ``best`` is the cheapest configuration that met every target, or ``None``.
    ``table`` has one row per run (each probed replica count of each (GPU, tp) pair) and
    one per pair that was never run: ``gpu, tp, replicas, gpus, usd_per_hour``, the client
    metrics in ms (``ttft_p99_ms``...), ``requests``, ``overloaded``, ``verdict`` (one of
    :data:`VERDICTS`), ``reason`` (which target was missed by how much, why it was
    overloaded or does not fit) and ``best`` (the answer's row). ``configurations`` has one
    row per (GPU, tp) pair: the fewest replicas that met the targets (``<NA>`` if none),
    their GPUs and $/hour, ``status`` (``meets``, ``misses``, ``does not fit``, ``invalid
    tp``) and ``reason``. ``targets``, ``max_replicas``, ``prices`` (USD per GPU-hour, by
    GPU), ``router`` and ``seed`` are what the plan was made with.
    """

    best: PlannedDeployment | None
    table: pd.DataFrame
    configurations: pd.DataFrame
    targets: Mapping[str, float]
    max_replicas: int
    prices: Mapping[str, float]
    router: str
    seed: int


@dataclass(frozen=True)
class _Found:
    """What the searches found: the answer and the two tables."""

    best: PlannedDeployment | None
    table: pd.DataFrame
    configurations: pd.DataFrame


@dataclass(frozen=True)
class _Probe:
    """One run to make: picklable, for a worker process."""

    deployment: Deployment
    workload: Workload
    seed: int
    percentiles: tuple[float, ...]


def _evaluate(probe: _Probe) -> tuple[dict[str, float], str]:
    """Run one probe (in a worker): its metrics, and in words how it was overloaded."""
    run = probe.deployment.run(probe.workload, probe.seed)
    check = run.overload
    how = (
        f"{check.arrival_rate_per_s:,.1f} requests/s arrived, "
        f"{check.completion_rate_per_s:,.1f}/s completed, "
        f"the queue grew by {check.queue_growth:,.0f}"
    )
    return run.metrics(probe.percentiles), how


class _Search:
    """The bisection of one (GPU, tp) pair: the fewest replicas that meet the targets."""

    def __init__(self, config: VllmConfig, price: float, max_replicas: int) -> None:
        self.config = config
        self.price = price
        self.max_replicas = max_replicas
        self.failing = 0  # the most replicas known to fail (0: none tried)
        self.meeting: int | None = None  # the fewest replicas known to meet the targets
        self.rows: dict[int, dict[str, Any]] = {}

    def next_counts(self) -> list[int]:
        """The replica counts to try next; empty when the search is over."""
        if not self.rows:
            return [1]  # the cheapest first: many plans end here
        if self.meeting is None:
            # One replica missed: does the most we may use meet the targets at all?
            return [] if self.max_replicas in self.rows else [self.max_replicas]
        if self.meeting - self.failing <= 1:
            return []
        return [(self.failing + self.meeting) // 2]

    def record(self, replicas: int, row: dict[str, Any]) -> None:
        self.rows[replicas] = row
        if row["verdict"] == "meets":
            self.meeting = replicas if self.meeting is None else min(self.meeting, replicas)
        else:
            self.failing = max(self.failing, replicas)


def plan_capacity(
    model: ModelSpec | VllmConfig | str,
    workload: Workload,
    *,
    targets: Mapping[str, float],
    gpus: Sequence[str | GpuSpec] = ("H100", "A100-80GB", "L40S"),
    tp: Sequence[int] = (1, 2, 4, 8),
    max_replicas: int = 16,
    prices: Mapping[str, float] | None = None,
    router: str = "least_outstanding",
    vllm: Mapping[str, Any] | None = None,
    seed: int = 0,
    executor: concurrent.futures.Executor | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CapacityPlan:
    """The cheapest GPU type x tp x replicas that serves *workload* within *targets*.

    *model* is a :class:`~simsim.gpu.models.ModelSpec` or what
    :func:`~simsim.gpu.models.load_model` takes, or a :class:`~simsim.gpu.vllm.VllmConfig`
    whose model and settings (all but its GPU and tp) every configuration keeps.
    *workload* is anything with ``generate(seed)``
    (:class:`~simsim.workloads.OpenLoopWorkload`...), served whole in every run.
    *targets* maps client metrics to limits in ms (:func:`check_plan_targets`:
    ``ttft_p99_ms``, ``itl_p99_ms``, ``e2e_p90_ms``...). *gpus* are preset names or
    :class:`~simsim.gpu.gpus.GpuSpec` s, *tp* the tensor-parallel degrees to try,
    *max_replicas* the most replicas of one pair. *prices* overrides a GPU's
    ``price_per_hour`` (USD per GPU-hour) by name. *router* names the router in front of
    the replicas; *vllm* holds :class:`~simsim.gpu.vllm.VllmConfig`'s keyword settings
    (``max_num_seqs``, ``gpu_mem_util``, ``coefficients``...). *seed* draws the workload
    (and seeds a random router). *executor*, *workers* and *progress* work as in
    :func:`simsim.sweep` (default: a process pool of one worker per CPU; ``workers=1``
    runs here). See the module docs for the search and the verdicts.
    """
    spec, settings = _model_and_settings(model, vllm)
    checked_targets, percentiles = check_plan_targets(targets)
    chips = _check_gpus(gpus)
    degrees = _check_tp(tp)
    max_replicas = check_positive_int(max_replicas, "max_replicas")
    if max_replicas > MAX_PLAN_REPLICAS:
        raise ValueError(f"max_replicas must be at most {MAX_PLAN_REPLICAS}, got {max_replicas}")
    price_of = _prices(chips, prices)
    ROUTERS.check(router)
    seed = check_seed(seed)
    if not callable(getattr(workload, "generate", None)):
        raise TypeError(
            "workload must have a generate(seed) method (an OpenLoopWorkload, say), "
            f"got {type(workload).__name__}"
        )
    requests = workload.generate(seed).requests
    longest = max((r.prompt_token_count + r.max_output_tokens for r in requests), default=0)

    fixed_rows: list[tuple[int, dict[str, Any]]] = []
    searches: list[tuple[int, _Search]] = []
    for order, (chip, degree) in enumerate((c, t) for c in chips for t in degrees):
        price = price_of[chip.name]
        try:
            check_tensor_parallel(spec, degree)
        except ValueError as error:
            fixed_rows.append((order, _unrun(chip, degree, "invalid tp", str(error))))
            continue
        try:
            config = VllmConfig(spec, chip, degree, **settings)
        except DoesNotFitError as error:
            fixed_rows.append((order, _unrun(chip, degree, "does not fit", str(error))))
            continue
        too_long = _request_does_not_fit(config, longest)
        if too_long:
            fixed_rows.append((order, _unrun(chip, degree, "does not fit", too_long)))
            continue
        searches.append((order, _Search(config, price, max_replicas)))

    probes = tuple(float(q) for q in percentiles)
    report = progress or (lambda done, total: None)
    with _Executor(executor, workers) as run_all:
        done = 0
        while True:
            wanted = [(search, count) for _, search in searches for count in search.next_counts()]
            if not wanted:
                break
            # Open-ended: a round's runs are known, the rounds after it are not.
            total = done + len(wanted) + 1
            report(done, total)
            tasks = [
                _Probe(Deployment(search.config, count, router), workload, seed, probes)
                for search, count in wanted
            ]
            for (search, count), (metrics, why) in zip(wanted, run_all(tasks), strict=True):
                search.record(count, _judged(search, count, metrics, why, checked_targets))
                done += 1
                report(done, total)
        report(done, done)
    plan = _plan(fixed_rows, searches, router, probes)
    return CapacityPlan(
        plan.best,
        plan.table,
        plan.configurations,
        checked_targets,
        max_replicas,
        price_of,
        router,
        seed,
    )


def _model_and_settings(
    model: ModelSpec | VllmConfig | str, vllm: Mapping[str, Any] | None
) -> tuple[ModelSpec, dict[str, Any]]:
    """The model, and the keyword settings every configuration's VllmConfig gets: a
    template config's (all but model, GPU and tp), then *vllm*'s."""
    settings = _check_vllm_settings(vllm)
    if isinstance(model, VllmConfig):
        kept = {f.name: getattr(model, f.name) for f in fields(model)}
        for name in _SEARCHED:
            del kept[name]
        return model.model, {**kept, **settings}
    return (model if isinstance(model, ModelSpec) else load_model(model)), settings


# VllmConfig's fields the plan sets itself: the model once, the GPU and tp per configuration.
_SEARCHED = ("model", "gpu", "tp")


def _check_vllm_settings(vllm: Mapping[str, Any] | None) -> dict[str, Any]:
    """*vllm* as keyword settings of VllmConfig: a name the plan searches, or none of
    VllmConfig's, is one ``ValueError`` naming it (before any configuration is built)."""
    settings = dict(vllm or {})
    allowed = [f.name for f in fields(VllmConfig) if f.name not in _SEARCHED]
    for name in settings:
        if name in _SEARCHED:
            raise ValueError(
                f"vllm[{name!r}]: the plan sets it (the model is its first argument, "
                "the GPUs and tp are gpus= and tp=); leave it out of vllm"
            )
        if name not in allowed:
            raise ValueError(
                f"vllm[{name!r}]: not a VllmConfig setting{did_you_mean(name, allowed)}; "
                f"known: {', '.join(allowed)}"
            )
    return settings


def _check_gpus(gpus: object) -> list[GpuSpec]:
    if isinstance(gpus, str | GpuSpec) or not isinstance(gpus, Iterable):
        raise TypeError(f"gpus must be a list of GPU names or GpuSpecs, got {gpus!r}")
    chips = [load_gpu(gpu) for gpu in gpus]  # an unknown name: did-you-mean
    if not chips:
        raise ValueError("gpus must name at least one GPU, got an empty list")
    names = [chip.name for chip in chips]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"gpus names {repeated[0]!r} more than once")
    return chips


def _check_tp(tp: object) -> list[int]:
    if isinstance(tp, int) or not isinstance(tp, Iterable):
        raise TypeError(f"tp must be a list of tensor-parallel degrees, got {tp!r}")
    degrees = [check_positive_int(t, "tp") for t in tp]
    if not degrees:
        raise ValueError("tp must list at least one tensor-parallel degree, got an empty list")
    if len(set(degrees)) != len(degrees):
        raise ValueError(f"tp lists a degree more than once: {degrees}")
    return degrees


def _prices(chips: Sequence[GpuSpec], prices: Mapping[str, float] | None) -> dict[str, float]:
    """Each GPU's price per GPU-hour: its preset's, or *prices*' by (case-blind) name."""
    given: dict[str, float] = {}
    names = {chip.name.lower(): chip.name for chip in chips}
    for name, value in (prices or {}).items():
        found = names.get(str(name).lower())
        if found is None:
            try:
                found = names.get(load_gpu(str(name)).name.lower())  # an alias: "H100"
            except ValueError:
                found = None
        if found is None:
            planned = list(names.values())
            raise ValueError(
                f"prices names {name!r}, which is not among the GPUs planned for "
                f"({', '.join(planned)}){did_you_mean(str(name), planned)}"
            )
        given[found] = float(check_real(value, f"prices[{name!r}]", positive=True))
    out: dict[str, float] = {}
    for chip in chips:
        price = given.get(chip.name, chip.price_per_hour)
        if not price > 0:
            raise ValueError(
                f"GPU {chip.name!r} has no price per GPU-hour (price_per_hour is {price}); "
                f"give one, e.g. prices={{{chip.name!r}: 2.5}}"
            )
        out[chip.name] = float(price)
    return out


def _request_does_not_fit(config: VllmConfig, tokens: int) -> str:
    """Why the longest request cannot fit in one replica's KV cache, or ``""``."""
    blocks = config.memory().kv_blocks
    needed = math.ceil(tokens / config.block_size)
    if needed <= blocks:
        return ""
    return (
        f"the longest request ({tokens:,} tokens) needs {needed:,} KV blocks; a replica of "
        f"{config.model.name} on {config.gpu.name} at tp={config.tp} holds {blocks:,}"
    )


def _unrun(chip: GpuSpec, degree: int, verdict: str, reason: str) -> dict[str, Any]:
    return {
        "gpu": chip.name,
        "tp": degree,
        "replicas": None,
        "gpus": None,
        "usd_per_hour": None,
        "verdict": verdict,
        "reason": reason,
    }


def _judged(
    search: _Search,
    replicas: int,
    metrics: Mapping[str, float],
    overload_reason: str,
    targets: Mapping[str, float],
) -> dict[str, Any]:
    """One run's row: its configuration, metrics, verdict and reason."""
    missed = []
    for name, limit in targets.items():
        value = metrics[name]
        if math.isnan(value):
            missed.append(f"{name} could not be measured")
        elif value > limit:
            missed.append(
                f"{name.removesuffix('_ms')} {_ms(value)} > {_ms(limit)} ({_over(value, limit)})"
            )
    overloaded = bool(metrics["overloaded"])
    if overloaded:
        verdict, reasons = "overloaded", [f"overloaded: {overload_reason}", *missed]
    elif missed:
        verdict, reasons = "misses", missed
    else:
        verdict, reasons = "meets", []
    gpus = replicas * search.config.tp
    return {
        "gpu": search.config.gpu.name,
        "tp": search.config.tp,
        "replicas": replicas,
        "gpus": gpus,
        "usd_per_hour": gpus * search.price,
        **metrics,
        "verdict": verdict,
        "reason": "; ".join(reasons),
    }


def _ms(value: float) -> str:
    """Milliseconds for a reason: whole ones from 100 up, else one decimal."""
    return f"{value:,.0f} ms" if value >= 100 else f"{value:,.1f} ms"


def _over(value: float, limit: float) -> str:
    """How far *value* passes *limit*: ``53% over``; from twice it, ``2.4x the limit``."""
    ratio = value / limit
    if ratio < 2:
        return f"{100 * (ratio - 1):.0f}% over"
    return f"{ratio:.1f}x the limit" if ratio < 10 else f"{ratio:,.0f}x the limit"


def _plan(
    fixed_rows: list[tuple[int, dict[str, Any]]],
    searches: list[tuple[int, _Search]],
    router: str,
    percentiles: Sequence[float],
) -> _Found:
    """Gather the rows, pick the cheapest passing configuration, build the tables."""
    best: tuple[float, int, int, _Search] | None = None
    per_pair: list[tuple[int, dict[str, Any]]] = []
    for order, search in searches:
        fewest = search.meeting
        summary: dict[str, Any]
        if fewest is None:
            top = search.rows[max(search.rows)]
            most = counted(search.max_replicas, "replica")
            summary = {
                "replicas": None,
                "gpus": None,
                "usd_per_hour": None,
                "status": "misses",
                "reason": f"at {most} (the most tried): {top['reason']}",
            }
        else:
            row = search.rows[fewest]
            summary = {
                "replicas": fewest,
                "gpus": row["gpus"],
                "usd_per_hour": row["usd_per_hour"],
                "status": "meets",
                "reason": "",
            }
            key = (row["usd_per_hour"], row["gpus"], order, search)
            if best is None or key[:3] < best[:3]:
                best = key
        pair: dict[str, Any] = {"gpu": search.config.gpu.name, "tp": search.config.tp}
        per_pair.append((order, {**pair, **summary}))
    for order, row in fixed_rows:
        per_pair.append((order, {**row, "status": row["verdict"]}))

    rows: list[tuple[int, int, dict[str, Any]]] = []
    for order, search in searches:
        for replicas, row in search.rows.items():
            chosen = best is not None and best[3] is search and best[3].meeting == replicas
            rows.append((order, replicas, {**row, "best": chosen}))
    for order, row in fixed_rows:
        rows.append((order, 0, {**row, "best": False}))
    rows.sort(key=lambda item: (item[0], item[1]))
    table = _table([row for _, _, row in rows], metric_names(percentiles))
    pair_columns = ["gpu", "tp", "replicas", "gpus", "usd_per_hour", "status", "reason"]
    configurations = pd.DataFrame(
        [{name: row.get(name) for name in pair_columns} for _, row in sorted(per_pair, key=_first)],
        columns=pair_columns,
    )
    for column in ("replicas", "gpus"):
        configurations[column] = configurations[column].astype("Int64")
    configurations["usd_per_hour"] = configurations["usd_per_hour"].astype("float64")
    planned = None
    if best is not None:
        search = best[3]
        assert search.meeting is not None
        row = search.rows[search.meeting]
        planned = PlannedDeployment(
            search.config,
            search.meeting,
            router,
            row["gpus"],
            row["usd_per_hour"],
            {name: row[name] for name in metric_names(percentiles)},
        )
    return _Found(planned, table, configurations)


def _first(item: tuple[int, dict[str, Any]]) -> int:
    return item[0]


def _table(records: Sequence[dict[str, Any]], metrics: Sequence[str]) -> pd.DataFrame:
    """The plan's table: the configuration columns, the metrics, then the verdict."""
    columns = [*PLAN_COLUMNS, *metrics, "verdict", "reason", "best"]
    table = pd.DataFrame([{c: row.get(c) for c in columns} for row in records], columns=columns)
    for column in ("tp", "replicas", "gpus"):
        table[column] = table[column].astype("Int64")
    for column in ("usd_per_hour", *metrics):
        table[column] = table[column].astype("float64")
    table["overloaded"] = (
        table["overloaded"].map(lambda v: pd.NA if pd.isna(v) else bool(v)).astype("boolean")
    )
    table["best"] = table["best"].astype(bool)
    return table


class _Executor:
    """Runs a round of probes: here, on a process pool of *workers*, or on *executor*
    (the caller's, never shut down here); the pool's workers stop with the plan."""

    def __init__(self, executor: concurrent.futures.Executor | None, workers: int | None) -> None:
        if workers is not None:
            workers = check_positive_int(workers, "workers")
            if executor is not None:
                raise ValueError("give either an executor or a number of workers, not both")
        if executor is not None and not isinstance(executor, concurrent.futures.Executor):
            raise TypeError(
                f"executor must be a concurrent.futures.Executor, got {type(executor).__name__}"
            )
        self._executor = executor
        self._workers = workers if workers is not None else (os.cpu_count() or 1)
        self._pool: WorkerPool | None = None
        self._signals = StopOnSignals()

    def __enter__(self) -> Callable[[Sequence[_Probe]], Iterator[tuple[dict[str, float], str]]]:
        self._signals.__enter__()
        return self._run

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._pool is not None:
                # Interrupted: do not wait for the runs in flight.
                self._pool.shutdown(wait=exc_info[1] is None, cancel_futures=True)
        finally:
            self._signals.__exit__()

    def _run(self, probes: Sequence[_Probe]) -> Iterator[tuple[dict[str, float], str]]:
        if self._executor is None and (self._workers == 1 or len(probes) == 1):
            for probe in probes:
                yield _evaluate(probe)
            return
        executor = self._executor
        if executor is None:
            if self._pool is None:
                self._pool = WorkerPool(self._workers)
            executor = self._pool
        futures = [executor.submit(_evaluate, probe) for probe in probes]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()
