"""The scenario model: a validated simulation, what to build and what to feed it."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from simsim.admission import AdmissionControl
from simsim.backend import (
    BACKENDS,
    Backend,
    FittedBackend,
    FittedBackendConfig,
    SimulatedBackend,
    SimulatedBackendConfig,
)
from simsim.clock import Environment, check_count
from simsim.cluster import (
    ROUTERS,
    Cluster,
    DisaggregatedCluster,
    KvTransferConfig,
    Router,
    make_router,
)
from simsim.engines import BatchingEngine, KvCacheConfig
from simsim.engines.base import EngineBase
from simsim.engines.server import Server as ServerProtocol
from simsim.gpu.gpus import GpuSpec
from simsim.gpu.models import ModelSpec
from simsim.gpu.physics import (
    DEFAULT_COEFFICIENTS,
    FrontendOverheads,
    PhysicsBackend,
    PhysicsCoefficients,
    client_latencies,
)
from simsim.gpu.vllm import VllmConfig
from simsim.registry import Registry
from simsim.request import RequestSpec
from simsim.results import CLIENT_COLUMNS
from simsim.scenario.checker import ScenarioError, out_of_memory_while
from simsim.scenario.engine_kinds import ENGINE_KINDS, EngineBuilder, EngineKind
from simsim.scheduler import Scheduler
from simsim.schedulers import SCHEDULERS as SCHEDULER_FACTORIES
from simsim.wording import counted
from simsim.workloads import (
    ClassMix,
    ClosedLoopWorkload,
    GeneratedWorkload,
    OpenLoopWorkload,
    check_seed,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ENGINES",
    "ENGINE_BUILDERS",
    "MAX_REPLICAS",
    "SCHEDULERS",
    "SCHEDULER_OPTIONS",
    "SEEDED_ROUTERS",
    "BackendConfig",
    "BackendSpec",
    "BatchingSpec",
    "Cancellation",
    "ClusterSpec",
    "EngineBuilder",
    "PhysicsBackendSpec",
    "PoolSpec",
    "RequestSpec",
    "Scenario",
    "Server",
    "Workload",
    "check_replicas",
    "scenario_options",
]


def scenario_options(registry: Registry[Any], name: str) -> tuple[str, ...]:
    """The options of plug-in *name* a scenario file may set: its factory's keyword
    options, but those whose default is ``None`` (Python-only, such as the
    ``shortest_job`` policy's ``predict``)."""
    defaults = registry.defaults(name)
    return tuple(
        option
        for option in registry.options(name) or ()
        if option not in defaults or defaults[option] is not None
    )


class _SchedulerOptions(Mapping[str, tuple[str, ...]]):
    """Each scheduler policy's scenario options, read from the scheduler registry."""

    def __getitem__(self, name: str) -> tuple[str, ...]:
        if name not in SCHEDULER_FACTORIES:
            raise KeyError(name)
        return scenario_options(SCHEDULER_FACTORIES, name)

    def __iter__(self) -> Iterator[str]:
        return iter(SCHEDULER_FACTORIES)

    def __len__(self) -> int:
        return len(SCHEDULER_FACTORIES)


SCHEDULER_OPTIONS: Mapping[str, tuple[str, ...]] = _SchedulerOptions()
"""``[scheduler] policy`` names and the options each takes (in the same table), read from
the signatures in :data:`simsim.schedulers.SCHEDULERS` (registered policies included)."""

SCHEDULERS = tuple(SCHEDULER_FACTORIES)
"""The built-in scheduler names, in the order the docs list them (registered policies
are in :data:`simsim.schedulers.SCHEDULERS`)."""


@dataclass(frozen=True, slots=True)
class Cancellation:
    """Cancel *request_id* at *time_us* (skipped if it has finished by then)."""

    time_us: int
    request_id: int


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A ``[backend]`` table of a registered kind (:func:`simsim.register_backend`): the
    kind's name and the options its factory is called with."""

    kind: str
    options: tuple[tuple[str, Any], ...] = ()

    def build(self) -> Backend:
        """A new backend: the kind's factory called with the options."""
        backend: Backend = BACKENDS.build(self.kind, **dict(self.options))
        return backend


@dataclass(frozen=True, slots=True)
class PhysicsBackendSpec:
    """A ``[backend] kind = "physics"`` table (or the cost model of ``[vllm]``): the
    model, GPU, tp and coefficients of a :class:`~simsim.gpu.physics.PhysicsBackend`."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    coefficients: PhysicsCoefficients = DEFAULT_COEFFICIENTS

    def build(self) -> PhysicsBackend:
        """A new :class:`~simsim.gpu.physics.PhysicsBackend` of this model, GPU and tp."""
        return PhysicsBackend(self.model, self.gpu, self.tp, coefficients=self.coefficients)


BackendConfig = SimulatedBackendConfig | FittedBackendConfig | BackendSpec | PhysicsBackendSpec
"""What a ``[backend]`` table describes (``engine = "vllm"``: its physics backend)."""

Workload = OpenLoopWorkload | ClosedLoopWorkload | ClassMix
"""What ``[workload]`` describes: open-loop, closed-loop, or a mix of request classes."""


@dataclass(frozen=True, slots=True)
class BatchingSpec:
    """The ``[batching]``, ``[kv_cache]`` and ``[prefix_cache]`` tables: how the batching
    server is set up (``first_token_at_prefill``: ``[batching]``'s key of that name)."""

    max_active_requests: int
    max_batch_tokens: int | None = None
    policy: str = "prefill_first"
    kv_cache: KvCacheConfig | None = None
    prefix_cache: bool = False
    first_token_at_prefill: bool = False

    def build(
        self,
        backend: Backend,
        scheduler: Scheduler,
        env: Environment,
        admission: AdmissionControl | None = None,
    ) -> BatchingEngine:
        """A :class:`BatchingEngine` with these settings."""
        return BatchingEngine(
            backend,
            scheduler,
            max_active_requests=self.max_active_requests,
            max_batch_tokens=self.max_batch_tokens,
            policy=self.policy,
            kv_cache=self.kv_cache,
            prefix_cache=self.prefix_cache,
            env=env,
            admission=admission,
            first_token_at_prefill=self.first_token_at_prefill,
        )


Server = ServerProtocol
"""What a scenario runs on: one engine, or a :class:`~simsim.Cluster` of them; the same
:class:`simsim.Server` protocol (this name is kept for compatibility)."""

SEEDED_ROUTERS = tuple(name for name in ROUTERS if ROUTERS.seeded(name))
"""The built-in routers that take a ``seed`` (:meth:`~simsim.registry.Registry.seeded`
answers for registered ones too)."""

_SEED_LIMIT = 2**63
"""Router seeds, like scenario seeds, are below this."""

MAX_REPLICAS = 10_000
"""The most replicas one pool of a scenario's cluster may have.

Each replica is a whole server, built before the first request is checked: a million
take a minute and gigabytes. Real fleets are far smaller, so a larger count is refused
before anything is built.
"""


def check_replicas(value: object) -> int:
    """*value* as a pool's replica count: an ``int`` from 1 to :data:`MAX_REPLICAS`
    (``ValueError`` otherwise, ``TypeError`` for a non-integer)."""
    replicas = check_count(value, "replicas", minimum=1)
    if replicas > MAX_REPLICAS:
        raise ValueError(
            f"replicas must be at most {MAX_REPLICAS:,} per pool (each replica is a whole "
            f"server, built before the run), got {replicas:,}"
        )
    return replicas


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A pool of identical replicas and the router in front of it (``[cluster]``,
    ``[cluster.prefill]`` or ``[cluster.decode]``).

    ``seed`` is the router's seed (``random`` and ``power_of_two`` only; ``None``: derived
    from the scenario's seed), ``weights`` the ``weighted`` router's scorer weights.
    ``batching`` is the server each replica runs when the pool overrides the scenario's
    ``[batching]``/``[kv_cache]`` settings, ``None`` for the scenario's own server.
    """

    replicas: int
    router: str
    seed: int | None = None
    weights: tuple[tuple[str, float], ...] | None = None
    batching: BatchingSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", check_replicas(self.replicas))

    def router_options(self, scenario_seed: int) -> dict[str, object]:
        """The options this pool's router factory is called with: its weights, and a seed
        (*scenario_seed* unless ``seed`` is set) when the factory takes one."""
        options: dict[str, object] = {}
        if ROUTERS.seeded(self.router):
            options["seed"] = scenario_seed if self.seed is None else self.seed
        if self.weights is not None:
            options["weights"] = dict(self.weights)
        return options

    def make_router(self, scenario_seed: int) -> Router:
        """A new router of this pool's kind; *scenario_seed* seeds it unless ``seed`` is set."""
        return make_router(self.router, **self.router_options(scenario_seed))


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The ``[cluster]`` table: replicas of the scenario's server behind a router, or a
    prefill pool and a decode pool joined by a KV transfer (disaggregation).

    Exactly one of ``pool`` (a plain cluster) and ``prefill``/``decode``/``transfer``
    (all three: a disaggregated one) is given.
    """

    pool: PoolSpec | None = None
    prefill: PoolSpec | None = None
    decode: PoolSpec | None = None
    transfer: KvTransferConfig | None = None
    refresh_interval_us: int = 0

    @property
    def disaggregated(self) -> bool:
        """Whether prefill and decode run on separate pools."""
        return self.pool is None

    @property
    def replica_count(self) -> int:
        """How many replicas the cluster has in all."""
        return sum(pool.replicas for pool in self.pools())

    def pools(self) -> tuple[PoolSpec, ...]:
        """The pools, in replica order: the one pool, or prefill then decode."""
        if self.pool is not None:
            return (self.pool,)
        assert self.prefill is not None and self.decode is not None
        return (self.prefill, self.decode)

    def describe(self) -> str:
        """A short description for reports: ``4 replicas, router least_outstanding``."""
        if self.pool is not None:
            return f"{counted(self.pool.replicas, 'replica')}, router {self.pool.router}"
        assert self.prefill is not None and self.decode is not None
        return (
            f"{self.prefill.replicas} prefill + {self.decode.replicas} decode replicas, "
            f"routers {self.prefill.router} / {self.decode.router}"
        )


@dataclass(frozen=True)
class Scenario:
    """A complete, validated simulation: what to build and what to feed it."""

    name: str = "scenario"
    engine: str = "single_slot"
    batching: BatchingSpec | None = None
    scheduler: str = "fcfs"
    backend: BackendConfig = field(default_factory=SimulatedBackendConfig)
    requests: tuple[RequestSpec, ...] = ()
    workload: Workload | None = None
    cancellations: tuple[Cancellation, ...] = ()
    seed: int = 0
    source: str = "<scenario>"
    #: The ``[cluster]`` table: run replicas of the server behind a router (``None``: one).
    cluster: ClusterSpec | None = None
    #: The ``[scheduler]`` table's options for ``scheduler`` (``aging_per_s``...), by name.
    scheduler_options: tuple[tuple[str, float], ...] = ()
    #: The ``[admission]`` table: limits checked at each arrival (of the cluster, if any).
    admission: AdmissionControl | None = None
    #: The ``[vllm]`` table of ``engine = "vllm"``: the server each replica runs.
    vllm: VllmConfig | None = None

    @property
    def frontend(self) -> FrontendOverheads | None:
        """What a client sees beyond the server's steps (a vLLM server's frontend
        overheads; ``None`` for the other engines, whose clients see the engine's times)."""
        return None if self.vllm is None else self.vllm.frontend

    def requests_frame(self, server: Server) -> pd.DataFrame:
        """*server*'s requests frame as this scenario's clients see it.

        With a :attr:`frontend` (``engine = "vllm"``), two float columns are appended
        (:data:`simsim.results.CLIENT_COLUMNS`, finished requests only, ``<NA>`` otherwise):
        ``client_ttft_us`` and ``client_e2e_us``, the engine's TTFT and end-to-end
        latency plus the frontend's overheads
        (:func:`simsim.gpu.physics.client_latencies`); :func:`simsim.summarize` then
        reports their statistics too. Without one, the frame is the server's own.
        """
        frame = server.requests_frame()
        overheads = self.frontend
        if overheads is None:
            return frame
        client = client_latencies(frame, overheads)
        for column in CLIENT_COLUMNS:
            frame[column] = client[column].reindex(frame.index).astype("Float64")
        return frame

    def with_seed(self, seed: int) -> Scenario:
        """The same scenario with another seed for its generated workload."""
        return replace(self, seed=check_seed(seed))

    def generated(self) -> GeneratedWorkload | None:
        """What an open-loop ``workload`` makes from the seed (``None`` otherwise).

        Generated once per :class:`Scenario` object and kept: checking the scenario's
        cancellations and running it use the same draw. The requests are specs' source
        only; :meth:`all_requests` is what an engine is fed.
        """
        return self._generated

    @functools.cached_property
    def _generated(self) -> GeneratedWorkload | None:
        workload = self.workload
        if not isinstance(workload, OpenLoopWorkload | ClassMix):
            return None
        try:
            with out_of_memory_while(self.source, lambda: _generating(workload)):
                return workload.generate(self.seed)
        except (ValueError, OverflowError) as error:
            raise ScenarioError(self.source, "workload", str(error)) from None

    def build_engine(self, env: Environment | None = None) -> EngineBase:
        """A new engine of this scenario's kind (:data:`ENGINE_BUILDERS`) and scheduler, idle.

        One server only: a scenario with a ``[cluster]`` table raises
        :class:`ScenarioError` (build it with :meth:`build`).
        """
        if self.cluster is not None:
            raise ScenarioError(
                self.source,
                "cluster",
                f"the scenario describes a cluster ({self.cluster.describe()}), not one "
                "engine; build it with Scenario.build(), which also gives what "
                "simsim.live serves",
            )
        return self._build_server(env or Environment(), self.batching)

    def build(self, env: Environment | None = None) -> Server:
        """What the scenario runs on, new and idle: its engine, or with ``[cluster]`` a
        :class:`~simsim.Cluster` (or :class:`~simsim.DisaggregatedCluster`) of such
        engines on one environment, each with its own scheduler and backend."""
        with out_of_memory_while(self.source, self._building):
            return self._build(env or Environment())

    def build_served(self, env: Environment | None = None) -> Server:
        """What ``simsim serve`` serves, new and idle: :meth:`build`, but an engine kind
        that cannot stream tokens is replaced by the kind it serves as (its
        :class:`~simsim.scenario.engine_kinds.EngineKind` ``serves_as``: the full single
        slot for ``single_slot_fast``, which gives the same request table)."""
        kind = ENGINE_KINDS.lookup(self.engine)
        scenario = self
        if not kind.streams_tokens and kind.serves_as is not None:
            scenario = replace(self, engine=kind.serves_as)
        return scenario.build(env)

    def _building(self) -> str:
        """What :meth:`build` makes, for an out-of-memory message."""
        if self.cluster is None:
            return "building the server"
        return (
            f"building the cluster's {counted(self.cluster.replica_count, 'replica', grouped=True)}"
        )

    def _build(self, env: Environment) -> Server:
        spec = self.cluster
        if spec is None:
            return self._build_server(env, self.batching)
        try:
            return self._build_cluster(spec, env)
        except (TypeError, ValueError) as error:
            # The file's checks should have caught it; if not, it is still the file's fault.
            raise ScenarioError(self.source, "cluster", str(error)) from None

    def _build_cluster(self, spec: ClusterSpec, env: Environment) -> Cluster:
        if spec.pool is not None:
            return Cluster(
                self._build_pool(spec.pool, env),
                spec.pool.make_router(self.seed),
                refresh_interval_us=spec.refresh_interval_us,
                admission=self.admission,
            )
        assert spec.prefill is not None and spec.decode is not None
        assert spec.transfer is not None
        return DisaggregatedCluster(
            self._build_pool(spec.prefill, env),  # type: ignore[arg-type]
            self._build_pool(spec.decode, env),  # type: ignore[arg-type]
            spec.transfer,
            prefill_router=spec.prefill.make_router(self.seed),
            decode_router=spec.decode.make_router(decode_router_seed(self.seed)),
            refresh_interval_us=spec.refresh_interval_us,
            admission=self.admission,
        )

    def _build_pool(self, pool: PoolSpec, env: Environment) -> list[EngineBase]:
        # The cluster checks admission at its own arrival; its replicas never do.
        replica = replace(self, admission=None)
        batching = self.batching if pool.batching is None else pool.batching
        return [replica._build_server(env, batching) for _ in range(pool.replicas)]

    def _build_server(self, env: Environment, batching: BatchingSpec | None) -> EngineBase:
        scenario = self if batching is self.batching else replace(self, batching=batching)
        return ENGINE_KINDS.lookup(self.engine)(
            scenario, self.build_backend(), self.build_scheduler(), env
        )

    def build_scheduler(self) -> Scheduler:
        """A new, empty scheduler of the ``[scheduler]`` table's policy and options
        (every server of a cluster gets its own)."""
        try:
            return SCHEDULER_FACTORIES.lookup(self.scheduler)(**dict(self.scheduler_options))
        except (TypeError, ValueError) as error:
            raise ScenarioError(self.source, "scheduler", str(error)) from None

    def slo_targets(self) -> dict[str, tuple[float | None, float | None]]:
        """Each request class's ``(ttft_slo_us, tpot_slo_us)`` targets (a class mix's
        ``ttft_slo_us``/``tpot_slo_us``); empty when no class sets one."""
        if isinstance(self.workload, ClassMix):
            return self.workload.slo_targets()
        return {}

    def build_backend(self) -> Backend:
        """The cost model of the ``[backend]`` table: simulated (default), fitted,
        physics (also ``engine = "vllm"``'s), or a registered kind."""
        if isinstance(self.backend, PhysicsBackendSpec):
            return self.backend.build()
        if isinstance(self.backend, BackendSpec):
            try:
                return self.backend.build()
            except (TypeError, ValueError) as error:
                raise ScenarioError(self.source, "backend", str(error)) from None
        if isinstance(self.backend, FittedBackendConfig):
            return FittedBackend(self.backend)
        return SimulatedBackend(self.backend)

    def all_requests(self) -> list[RequestSpec]:
        """Listed, traced and generated requests, in id order; ids must be unique.

        A closed-loop workload's requests are made while the simulation runs and are
        not included. Worked out once per :class:`Scenario` object (a copy each call).
        """
        return list(self._all_requests)

    @functools.cached_property
    def _all_requests(self) -> tuple[RequestSpec, ...]:
        specs = list(self.requests)
        generated = self.generated()
        if generated is not None:
            with out_of_memory_while(
                self.source,
                lambda: (
                    "listing the workload's "
                    + counted(len(generated.requests), "request", grouped=True)
                ),
            ):
                specs.extend(generated.requests)
        seen: set[int] = set()
        for spec in specs:
            if spec.request_id in seen:
                raise ScenarioError(
                    self.source,
                    "requests",
                    f"request id {spec.request_id} appears twice (ids must be unique "
                    "across [[requests]], [trace] and [workload])",
                )
            seen.add(spec.request_id)
        specs.sort(key=lambda s: s.request_id)
        return tuple(specs)


def _generating(workload: OpenLoopWorkload | ClassMix) -> str:
    """What generating *workload* makes, for an out-of-memory message."""
    count = workload.count or 0  # an OpenLoopWorkload's count is an int once made
    what = f"generating the workload's {counted(count, 'request', grouped=True)}"
    prefixes = workload.shared_prefixes if isinstance(workload, OpenLoopWorkload) else None
    if prefixes is not None:
        what += (
            f" and their block hashes (one per {prefixes.block_size_tokens}-token block of "
            "each prompt)"
        )
    return what


def decode_router_seed(scenario_seed: int) -> int:
    """The decode pool's router seed when the file sets none: the scenario's seed plus
    one (modulo ``2**63``), so the two pools' routers draw apart."""
    return (scenario_seed + 1) % _SEED_LIMIT


ENGINE_BUILDERS: Registry[EngineKind] = ENGINE_KINDS
"""``[scenario] engine`` names and how each engine is built (:data:`ENGINE_KINDS`, whose
entries are called like builders): a new server is one entry."""

ENGINES = tuple(ENGINE_KINDS)
"""The built-in engine names a scenario may choose, in the order the docs list them."""
