"""A deployment: replicas of one vLLM server behind a router, and what its clients see.

:class:`Deployment` is a :class:`~simsim.gpu.vllm.VllmConfig` times a replica count and a
router: :meth:`Deployment.run` builds the replicas (a :class:`~simsim.Cluster` of them
when there are several) on a new environment, serves a workload's requests to
completion, and returns a :class:`DeploymentRun` whose latencies are the client's:
the engine's plus the frontend's request-level overheads
(:func:`~simsim.gpu.physics.client_latencies`), each inter-token gap plus the per-token
overhead. :func:`client_metrics` reduces a run to the figures a capacity plan compares
with its targets, in milliseconds, under the reference CSV's names (``ttft_p99_ms``,
``itl_mean_ms``, ``e2e_p90_ms``...), with the overload verdict of
:func:`simsim.overload.overload_check`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from simsim.checks import check_positive_int
from simsim.clock import Environment
from simsim.cluster import Cluster
from simsim.cluster.routers import ROUTERS, make_router
from simsim.gpu.physics import client_latencies, client_token_gaps_us
from simsim.gpu.vllm import VllmConfig
from simsim.overload import OverloadCheck, overload_check
from simsim.results import DEFAULT_PERCENTILES, percentile_label
from simsim.workloads import GeneratedWorkload, submit_with_deadlines

if TYPE_CHECKING:
    from simsim.engines.server import Server

__all__ = [
    "LATENCIES",
    "Deployment",
    "DeploymentRun",
    "Workload",
    "client_metrics",
    "metric_names",
]

LATENCIES = ("ttft", "itl", "e2e")
"""The client latencies a deployment is judged by: time to first token, inter-token
latency and end-to-end latency."""

_US_PER_MS = 1000.0


class Workload(Protocol):
    """Anything that makes a seeded list of requests: :class:`~simsim.workloads.
    OpenLoopWorkload`, :class:`~simsim.workloads.ClassMix`..."""

    def generate(self, seed: int) -> GeneratedWorkload:
        """The requests (and client deadlines) this workload makes from *seed*."""
        ...


@dataclass(frozen=True, slots=True)
class Deployment:
    """*replicas* copies of the vLLM server *config* behind the router *router* (a name
    in :data:`~simsim.cluster.routers.ROUTERS`; a seeded one is seeded from the run's
    seed). It takes ``replicas x config.tp`` GPUs."""

    config: VllmConfig
    replicas: int
    router: str = "least_outstanding"

    def __post_init__(self) -> None:
        if not isinstance(self.config, VllmConfig):
            raise TypeError(f"config must be a VllmConfig, got {type(self.config).__name__}")
        check_positive_int(self.replicas, "replicas")
        ROUTERS.check(self.router)

    @property
    def gpus(self) -> int:
        """GPUs the deployment takes: replicas x tensor-parallel degree."""
        return self.replicas * self.config.tp

    def usd_per_hour(self, price_per_gpu_hour: float | None = None) -> float:
        """What the deployment costs per hour: its GPUs x the price of one GPU-hour
        (*price_per_gpu_hour*, by default the GPU's ``price_per_hour``)."""
        price = self.config.gpu.price_per_hour if price_per_gpu_hour is None else price_per_gpu_hour
        return self.gpus * float(price)

    def server(self, env: Environment, seed: int = 0) -> Server:
        """The replicas on *env*: one engine, or a :class:`~simsim.Cluster` of them."""
        engines = [self.config.engine(env=env) for _ in range(self.replicas)]
        if self.replicas == 1:
            return engines[0]
        options: dict[str, Any] = {"seed": seed} if ROUTERS.seeded(self.router) else {}
        return Cluster(engines, make_router(self.router, **options))

    def run(self, workload: Workload, seed: int = 0) -> DeploymentRun:
        """Serve *workload*'s requests (drawn from *seed*) to completion."""
        generated = workload.generate(seed)
        server = self.server(Environment(), seed)
        submit_with_deadlines(server, generated.requests, generated.cancellations)
        server.run()
        requests = server.requests_frame()
        events = server.events_frame()
        overheads = self.config.frontend
        return DeploymentRun(
            self,
            client_latencies(requests, overheads),
            client_token_gaps_us(events, overheads),
            overload_check(requests),
        )


@dataclass(frozen=True)
class DeploymentRun:
    """One run of a :class:`Deployment`: the finished requests with the client's
    ``client_ttft_us`` and ``client_e2e_us`` columns, every inter-token gap as the
    client sees it (microseconds, floats) and the overload verdict."""

    deployment: Deployment
    requests: pd.DataFrame
    token_gaps_us: np.ndarray
    overload: OverloadCheck

    def metrics(self, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
        """:func:`client_metrics` of this run."""
        return client_metrics(self.requests, self.token_gaps_us, self.overload, percentiles)


def metric_names(percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> list[str]:
    """The names :func:`client_metrics` returns with *percentiles*, in its order."""
    names = [f"{latency}_mean_ms" for latency in LATENCIES]
    for latency in LATENCIES:
        names.extend(f"{latency}_{percentile_label(q)}_ms" for q in percentiles)
    return [*names, "requests", "overloaded"]


def client_metrics(
    requests: pd.DataFrame,
    token_gaps: np.ndarray,
    overload: OverloadCheck,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict[str, float]:
    """A run's client latencies in milliseconds, and whether it was overloaded.

    *requests* has :func:`~simsim.gpu.physics.client_latencies`' columns. Returns
    ``ttft_mean_ms``, ``itl_mean_ms``, ``e2e_mean_ms``, then each percentile of each
    latency (``ttft_p99_ms``...), ``requests`` (finished) and ``overloaded`` (1.0 or
    0.0). ``itl_mean_ms`` is the reference CSV's ``(e2e_mean - ttft_mean) / (mean output
    tokens - 1)``; ITL percentiles are over every inter-token gap (*token_gaps*), TTFT and
    E2E percentiles over requests. A figure with nothing to measure is NaN.
    """
    ttft = requests["client_ttft_us"].to_numpy(dtype="float64") / _US_PER_MS
    e2e = requests["client_e2e_us"].to_numpy(dtype="float64") / _US_PER_MS
    gaps = np.asarray(token_gaps, dtype="float64") / _US_PER_MS
    outputs = requests["generated_token_count"].to_numpy(dtype="float64")
    ttft_mean = float(ttft.mean()) if len(ttft) else math.nan
    e2e_mean = float(e2e.mean()) if len(e2e) else math.nan
    mean_output = float(outputs.mean()) if len(outputs) else math.nan
    itl_mean = (e2e_mean - ttft_mean) / (mean_output - 1) if mean_output > 1 else math.nan
    metrics = {"ttft_mean_ms": ttft_mean, "itl_mean_ms": itl_mean, "e2e_mean_ms": e2e_mean}
    for name, values in (("ttft", ttft), ("itl", gaps), ("e2e", e2e)):
        for quantile in percentiles:
            label = percentile_label(quantile)
            figure = float(np.percentile(values, quantile)) if len(values) else math.nan
            metrics[f"{name}_{label}_ms"] = figure
    metrics["requests"] = float(len(requests))
    metrics["overloaded"] = float(overload.overloaded)
    return metrics
