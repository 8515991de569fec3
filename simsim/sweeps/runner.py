"""Running sweep points through an executor, and keeping finished runs on disk.

A *run* is one (point, replication) pair. Its seed comes from :func:`run_seed`, so a
run gives the same metrics in any process, on any worker, in any order. The runner
submits runs to a ``concurrent.futures.Executor`` (or runs them in this process),
writes each finished run to the results folder at once, and, when started again on
the same folder, loads finished runs instead of running them again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simsim.results import (
    DEFAULT_PERCENTILES,
    OVERLOAD_METRICS,
    requests_frame,
    run_summary,
    summarize,
)
from simsim.scenario import ScenarioError, parse_scenario, read_toml, run_scenario
from simsim.sweeps.grid import SweepPoint, apply_settings, run_seed
from simsim.sweeps.pool import WorkerPool
from simsim.sweeps.signals import StopOnSignals
from simsim.workloads import check_seed

__all__ = [
    "Model",
    "RunOptions",
    "RunRecord",
    "Runner",
    "ScenarioSource",
    "SweepFolderError",
    "metric_names",
    "resolve_source",
]

Model = Callable[[dict[str, Any], int], pd.DataFrame]
"""A user's own simulation: ``model(settings, seed)`` returns a ``requests_frame()``.

*settings* holds the point's dotted keys and values: its case's settings and its grid
values (for a capacity search, also the searched parameter's value).
"""

ProgressCallback = Callable[[int, int], None]

MANIFEST = "sweep.json"
RUNS_FOLDER = "runs"
_FORMAT = "simsim-sweep"
RESERVED_KEYS = ("scenario.seed",)
"""Settings a sweep owns: each run's seed comes from the sweep's seed."""
_TERMINATE_WAIT_S = 5.0
"""How long a terminated worker may take to exit before it is killed."""


def metric_names(
    *,
    ttft_slo_us: int | None = None,
    tpot_slo_us: float | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    occupancy: bool = False,
) -> list[str]:
    """The metrics :func:`simsim.summarize` reports with these settings, in order.

    *occupancy*: also the rows a server's slot count adds (``mean_queue_length``,
    ``mean_active_requests``, ``utilization``) and the overload rows
    (:data:`simsim.results.OVERLOAD_METRICS`), which every run of a scenario reports
    (:func:`simsim.results.run_summary`); a model's runs report what its frame gives.
    """
    empty = summarize(
        requests_frame([]),
        ttft_slo_us=ttft_slo_us,
        tpot_slo_us=tpot_slo_us,
        percentiles=percentiles,
        slots=1 if occupancy else None,
    )
    return [str(name) for name in empty.index] + (list(OVERLOAD_METRICS) if occupancy else [])


@dataclass(frozen=True)
class ScenarioSource:
    """Where a sweep's runs come from: a scenario document, or a user's model."""

    document: Mapping[str, Any] | None
    base_dir: str
    source: str
    model: Model | None = None
    #: A scenario read from a file must have a [backend] table, as for `simsim run`.
    from_file: bool = False

    def identity(self) -> Any:
        """What a results folder's fingerprint records of this source."""
        if self.model is not None:
            name = getattr(self.model, "__qualname__", type(self.model).__qualname__)
            return {"model": f"{getattr(self.model, '__module__', '?')}.{name}"}
        return {"scenario": self.document}

    def check(self, point: SweepPoint) -> None:
        """Validate the point's scenario before anything runs (errors name the key)."""
        for key in point.settings:
            if key in RESERVED_KEYS:
                raise ScenarioError(
                    self.source, key, "the sweep sets each run's seed; use the sweep's seed"
                )
        if self.document is None:
            return
        try:
            document = apply_settings(self.document, point.settings)
        except ValueError as error:
            raise ScenarioError(self.source, point.label(), str(error)) from None
        parse_scenario(
            document,
            source=f"{self.source} [{point.label()}]",
            base_dir=Path(self.base_dir),
            require_backend=self.from_file,
        )


def resolve_source(
    scenario: str | os.PathLike[str] | Mapping[str, Any] | Model | ScenarioSource,
) -> ScenarioSource:
    """Turn :func:`simsim.sweep`'s ``scenario`` argument into a :class:`ScenarioSource`.

    A path is read as a TOML scenario file (relative paths inside it are relative to
    the file); a mapping is a scenario document as ``tomllib`` would return it
    (relative paths are relative to the current directory); a callable is a model; a
    :class:`ScenarioSource` (what a sweep file's scenario resolves to) is kept.
    """
    if isinstance(scenario, ScenarioSource):
        return scenario
    if isinstance(scenario, str | os.PathLike):
        path = Path(scenario)
        return ScenarioSource(
            read_toml(path), str(path.parent.resolve()), str(path), from_file=True
        )
    if isinstance(scenario, Mapping):
        return ScenarioSource(dict(scenario), str(Path.cwd()), "<sweep scenario>")
    if callable(scenario):
        return ScenarioSource(
            None, str(Path.cwd()), getattr(scenario, "__name__", "<model>"), scenario
        )
    raise TypeError(
        "scenario must be a TOML file path, a scenario document (dict) or a model "
        f"callable(settings, seed), got {type(scenario).__name__} {scenario!r}"
    )


@dataclass(frozen=True)
class RunTask:
    """Everything a worker needs for one run; small and picklable."""

    source: ScenarioSource
    settings: Mapping[str, Any]
    seed: int
    ttft_slo_us: int | None
    tpot_slo_us: float | None
    percentiles: tuple[float, ...]


def execute(task: RunTask) -> dict[str, float]:
    """Run one replication and return its summary metrics (called in a worker).

    A scenario's run is summarised with its server's slots and replicas
    (:func:`simsim.results.run_summary`: occupancy and load-balance rows included), as
    ``simsim run`` summarises it; a model's frame by :func:`simsim.summarize` alone.
    """
    source = task.source
    if source.model is not None:
        summary = summarize(
            source.model(dict(task.settings), task.seed),
            ttft_slo_us=task.ttft_slo_us,
            tpot_slo_us=task.tpot_slo_us,
            percentiles=task.percentiles,
        )
    else:
        assert source.document is not None
        document = apply_settings(source.document, {**task.settings, "scenario.seed": task.seed})
        scenario = parse_scenario(document, source=source.source, base_dir=Path(source.base_dir))
        server = run_scenario(scenario)
        summary = run_summary(
            server,
            requests=scenario.requests_frame(server),  # a vLLM server's: as clients see it
            ttft_slo_us=task.ttft_slo_us,
            tpot_slo_us=task.tpot_slo_us,
            percentiles=task.percentiles,
        )
    return {str(name): float(value) for name, value in summary["value"].items()}


@dataclass(frozen=True)
class RunRecord:
    """The result of one run: which point and replication, its seed and its metrics."""

    point: SweepPoint
    replication: int
    seed: int
    metrics: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        """The record as written to ``runs/<key>-<replication>.json``.

        Run files are written with sorted keys, so ``metric_order`` keeps the order in
        which the run reported its metrics: the tables of a resumed sweep list them as
        an uninterrupted sweep does.
        """
        return {
            "key": self.point.key,
            "case": self.point.case,
            "params": dict(self.point.params),
            "replication": self.replication,
            "seed": self.seed,
            "metrics": dict(self.metrics),
            "metric_order": list(self.metrics),
        }


class SweepFolderError(ValueError):
    """A results folder that cannot hold this sweep's runs (another sweep's, or damaged)."""


class _Store:
    """A results folder: a manifest, and one JSON file per finished run."""

    def __init__(self, folder: Path, fingerprint: str) -> None:
        self.folder = folder
        self.runs = folder / RUNS_FOLDER
        manifest = folder / MANIFEST
        if manifest.exists():
            try:
                recorded = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise SweepFolderError(
                    f"{manifest}: not a readable sweep manifest ({error})"
                ) from None
            if recorded.get("fingerprint") != fingerprint:
                raise SweepFolderError(
                    f"{folder} holds the results of a different sweep (its base scenario, "
                    "seed, SLO targets or percentiles differ); use another output folder "
                    "or delete it"
                )
        else:
            if folder.exists() and any(folder.iterdir()):
                raise SweepFolderError(
                    f"{folder} is not empty and holds no sweep (no {MANIFEST}); "
                    "use a new or empty output folder"
                )
            folder.mkdir(parents=True, exist_ok=True)
            write_json(manifest, {"format": _FORMAT, "fingerprint": fingerprint})
        self.runs.mkdir(exist_ok=True)

    def path(self, point: SweepPoint, replication: int) -> Path:
        return self.runs / f"{point.key}-{replication}.json"

    def load(
        self, point: SweepPoint, replication: int, seed: int, required: Sequence[str]
    ) -> Mapping[str, float] | None:
        """A finished run's metrics, all of them, in the order the run reported them;
        ``None`` if the run has not finished yet.

        The file must say it is this run: its stored key and replication must be those
        of its name, and its seed the one this sweep derives for the run. A file that
        disagrees (copied or renamed from another run or another folder) is refused,
        not loaded under the wrong name. So is a file that lacks a metric of *required*
        (the metrics every run reports) or whose ``metric_order`` does not list exactly
        its metrics.
        """
        path = self.path(point, replication)
        if not path.exists():
            return None
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            disagreements = [
                f"{field} {stored.get(field)!r} where {expected_from} {expected!r}"
                for field, expected, expected_from in (
                    ("key", point.key, "its name says"),
                    ("replication", replication, "its name says"),
                    ("seed", seed, "this sweep's seed for the run is"),
                )
                if not _same_json_value(stored.get(field), expected)
            ]
            values = stored["metrics"]
            loaded = {name: float(values[name]) for name in _metric_order(stored, required)}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise SweepFolderError(
                f"{path}: not a finished run of this sweep ({type(error).__name__}: {error}); "
                "delete the file to run it again"
            ) from None
        if disagreements:
            raise SweepFolderError(
                f"{path}: the run file does not match its name: it stores "
                f"{'; '.join(disagreements)}; a run file must keep the name the sweep gave "
                "it (delete the file to run that run again)"
            )
        return loaded

    def save(self, record: RunRecord) -> None:
        write_json(self.path(record.point, record.replication), record.to_json())


def _metric_order(stored: Mapping[str, Any], required: Sequence[str]) -> list[str]:
    """The names of a run file's metrics, in the order its run reported them.

    Every name of *required* must be among them (``ValueError`` otherwise). A file written
    before run files kept ``metric_order`` stores its metrics sorted by name: those of
    *required* then come first, in their order, and the others after them, by name.
    """
    metrics = stored["metrics"]
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a table of values, got {type(metrics).__name__}")
    missing = [name for name in required if name not in metrics]
    if missing:
        raise ValueError(f"it lacks the metric {missing[0]!r}, which every run of the sweep has")
    if "metric_order" not in stored:
        return [*required, *(name for name in metrics if name not in required)]
    order = stored["metric_order"]
    if not isinstance(order, list) or len(set(order)) != len(order) or set(order) != set(metrics):
        raise ValueError(
            f"metric_order must name each of the file's {len(metrics)} metrics once, got {order!r}"
        )
    return order


def _same_json_value(stored: object, expected: str | int) -> bool:
    """Whether a value read from JSON is *expected* (``true`` is not the integer 1)."""
    return type(stored) is type(expected) and stored == expected


def write_json(path: Path, data: Any) -> None:
    """Write *data* to *path* atomically: a reader sees the old file or the whole new one."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)


@dataclass(frozen=True)
class RunOptions:
    """How a sweep's runs are made: the arguments :func:`simsim.sweep`,
    :func:`simsim.capacity_search` and sweep files share (see :func:`simsim.sweep`)."""

    seed: int = 0
    executor: concurrent.futures.Executor | None = None
    workers: int | None = None
    ttft_slo_us: int | None = None
    tpot_slo_us: float | None = None
    percentiles: Sequence[float] = DEFAULT_PERCENTILES
    out: str | os.PathLike[str] | None = None
    progress: ProgressCallback | None = None


class Runner:
    """Runs (point, replication) pairs through an executor and collects their records.

    With ``workers == 1`` and no executor, runs happen in this process, one after the
    other. With an *executor*, the caller owns it (the runner never shuts it down);
    otherwise the runner starts a :class:`~simsim.sweeps.pool.WorkerPool` of *workers*
    processes (default: the number of CPUs) on first use, whose workers exit if this
    process dies, and shuts it down in :meth:`close`.
    """

    def __init__(self, source: ScenarioSource, options: RunOptions) -> None:
        seed, executor, workers = options.seed, options.executor, options.workers
        ttft_slo_us, tpot_slo_us = options.ttft_slo_us, options.tpot_slo_us
        percentiles, out, progress = options.percentiles, options.out, options.progress
        if workers is not None:
            if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
                raise ValueError(f"workers must be a positive int, got {workers!r}")
            if executor is not None:
                raise ValueError("give either an executor or a number of workers, not both")
        if executor is not None and not isinstance(executor, concurrent.futures.Executor):
            raise TypeError(
                "executor must be a concurrent.futures.Executor, "
                f"got {type(executor).__name__} {executor!r}"
            )
        self.source = source
        self.seed = check_seed(seed)
        self.ttft_slo_us = ttft_slo_us
        self.tpot_slo_us = tpot_slo_us
        self._executor = executor
        self._owned: WorkerPool | None = None
        self._signals = StopOnSignals()
        self._workers = workers if workers is not None else (os.cpu_count() or 1)
        self._progress = progress
        self.metrics = metric_names(
            ttft_slo_us=ttft_slo_us,
            tpot_slo_us=tpot_slo_us,
            percentiles=percentiles,
            occupancy=source.model is None,
        )
        self.percentiles = tuple(float(q) for q in percentiles)
        self._store = None if out is None else _Store(Path(out), self.fingerprint())
        self.done = 0
        self.total = 0
        self.loaded = 0
        self._open_ended = False

    def fingerprint(self) -> str:
        """A hash of what every run of this sweep shares: source, seed and SLO targets."""
        identity = {
            "source": self.source.identity(),
            "seed": self.seed,
            "ttft_slo_us": self.ttft_slo_us,
            "tpot_slo_us": self.tpot_slo_us,
            "percentiles": list(self.percentiles),
        }
        text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def folder(self) -> Path | None:
        """The results folder, if any."""
        return None if self._store is None else self._store.folder

    def expect(self, count: int, *, open_ended: bool = False) -> None:
        """Add *count* runs to the total that progress reports count towards.

        With *open_ended* (a search, whose run count is only an estimate), progress
        never reports completion until :meth:`finish`.
        """
        self.total += count
        self._open_ended = self._open_ended or open_ended
        self._report()

    def finish(self) -> None:
        """Report completion: every run that was needed is done."""
        self._open_ended = False
        self.total = self.done
        self._report()

    def _report(self) -> None:
        if self._progress is not None:
            total = max(self.total, self.done + 1 if self._open_ended else self.done)
            self._progress(self.done, total)

    def run(self, pairs: Sequence[tuple[SweepPoint, int]]) -> list[RunRecord]:
        """Run every (point, replication) pair not already in the folder; in input order."""
        results: dict[tuple[str, int], RunRecord] = {}
        pending: list[tuple[SweepPoint, int, RunTask]] = []
        for point, replication in pairs:
            seed = run_seed(self.seed, point.key, replication)
            stored = (
                None
                if self._store is None
                else self._store.load(point, replication, seed, self.metrics)
            )
            if stored is not None:
                results[point.key, replication] = RunRecord(point, replication, seed, stored)
                self.loaded += 1
                self.done += 1
                continue
            task = RunTask(
                self.source,
                point.settings,
                seed,
                self.ttft_slo_us,
                self.tpot_slo_us,
                self.percentiles,
            )
            pending.append((point, replication, task))
        self._report()
        for point, replication, task, metrics in self._execute(pending):
            record = RunRecord(point, replication, task.seed, metrics)
            if self._store is not None:
                self._store.save(record)
            results[point.key, replication] = record
            self.done += 1
            self._report()
        return [results[point.key, replication] for point, replication in pairs]

    def _execute(
        self, pending: list[tuple[SweepPoint, int, RunTask]]
    ) -> Iterator[tuple[SweepPoint, int, RunTask, dict[str, float]]]:
        if not pending:
            return
        if self._executor is None and self._workers == 1:
            for point, replication, task in pending:
                with _naming(point, replication):
                    metrics = execute(task)
                yield point, replication, task, metrics
            return
        executor = self._pool()
        futures = {executor.submit(execute, item[2]): item for item in pending}
        try:
            for future in concurrent.futures.as_completed(futures):
                point, replication, task = futures[future]
                with _naming(point, replication):
                    metrics = future.result()
                yield point, replication, task, metrics
        finally:
            for future in futures:
                future.cancel()

    def _pool(self) -> concurrent.futures.Executor:
        if self._executor is not None:
            return self._executor
        if self._owned is None:
            # Its workers exit if this process is killed and cannot stop them.
            self._owned = WorkerPool(self._workers)
        return self._owned

    def close(self, *, stop_workers: bool = False) -> None:
        """Shut down the process pool the runner started, if any.

        Normally the runs in flight finish first (their results are dropped). With
        *stop_workers* (the sweep was interrupted) the worker processes are terminated
        instead; so they are too when an interrupt arrives while waiting for them.
        """
        pool = self._owned
        if pool is None:
            return
        try:
            if stop_workers:
                _terminate_workers(pool)
            pool.shutdown(wait=True, cancel_futures=True)
        except KeyboardInterrupt:
            _terminate_workers(pool)
            raise
        finally:
            self._owned = None

    def __enter__(self) -> Runner:
        self._signals.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            # Ctrl-C, SIGTERM or SIGHUP (SweepStopped): the workers must not outlive us.
            self.close(stop_workers=isinstance(exc_info[1], KeyboardInterrupt))
        finally:
            self._signals.__exit__()


def _terminate_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Cancel *pool*'s pending runs and end its worker processes now, not after their run."""
    # Python 3.14 has ProcessPoolExecutor.terminate_workers(); before, the processes are
    # only reachable through the pool's private table, as that method itself does.
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    for worker in workers:
        worker.join(timeout=_TERMINATE_WAIT_S)
        if worker.is_alive():
            worker.kill()
            worker.join()


@contextlib.contextmanager
def _naming(point: SweepPoint, replication: int) -> Iterator[None]:
    """Add the point and replication to any exception raised by a run."""
    try:
        yield
    except Exception as error:
        error.add_note(f"in sweep point {point.index} ({point.label()}), replication {replication}")
        raise
