"""simsim: a deterministic discrete-event simulator of an LLM serving engine, on SimPy.

Time is an integer number of microseconds. All figures are simulated behaviour from an
analytical cost model, never measured hardware performance.
"""

from types import ModuleType

from simsim import cluster, run_folder, sweeps, traces, workloads
from simsim._version import __version__
from simsim.admission import AdmissionControl, Limit
from simsim.backend import (
    Backend,
    FittedBackend,
    FittedBackendConfig,
    SimulatedBackend,
    SimulatedBackendConfig,
    StepCostBackend,
    register_backend,
)
from simsim.clock import Environment, ms_to_us, seconds_to_us
from simsim.cluster import Cluster, DisaggregatedCluster, KvTransferConfig, register_router
from simsim.engines import (
    BatchingEngine,
    FastSimulationEngine,
    KvCacheConfig,
    SimulationEngine,
)
from simsim.engines.server import Server, ServerLoad
from simsim.errors import (
    EngineFailedError,
    InvalidTransitionError,
    SimulationError,
    StaleDecisionError,
    StaleEventError,
    UnknownRequestError,
)
from simsim.gpu import GpuSpec, ModelSpec, load_gpu, load_model
from simsim.gpu.physics import PhysicsBackend, PhysicsCoefficients
from simsim.gpu.vllm import VllmConfig, vllm_server
from simsim.records import AdmissionRecord, EventRecord, EventType, IterationRecord
from simsim.request import Request, RequestSpec, RequestState
from simsim.results import summarize
from simsim.scheduler import (
    AdmissionDecision,
    FcfsScheduler,
    QueuedRequest,
    Scheduler,
    SchedulerStats,
)
from simsim.schedulers import register_scheduler
from simsim.sweeps import CapacityResult, SweepResult, capacity_search, sweep

__all__ = [
    "AdmissionControl",
    "AdmissionDecision",
    "AdmissionRecord",
    "Backend",
    "BatchingEngine",
    "CapacityResult",
    "Cluster",
    "DisaggregatedCluster",
    "EngineFailedError",
    "Environment",
    "EventRecord",
    "EventType",
    "FastSimulationEngine",
    "FcfsScheduler",
    "FittedBackend",
    "FittedBackendConfig",
    "GpuSpec",
    "InvalidTransitionError",
    "IterationRecord",
    "KvCacheConfig",
    "KvTransferConfig",
    "Limit",
    "ModelSpec",
    "PhysicsBackend",
    "PhysicsCoefficients",
    "QueuedRequest",
    "Request",
    "RequestSpec",
    "RequestState",
    "Scheduler",
    "SchedulerStats",
    "Server",
    "ServerLoad",
    "SimulatedBackend",
    "SimulatedBackendConfig",
    "SimulationEngine",
    "SimulationError",
    "StaleDecisionError",
    "StaleEventError",
    "StepCostBackend",
    "SweepResult",
    "UnknownRequestError",
    "VllmConfig",
    "__version__",
    "capacity_search",
    "cluster",
    "load_gpu",
    "load_model",
    "ms_to_us",
    "register_backend",
    "register_router",
    "register_scheduler",
    "run_folder",
    "seconds_to_us",
    "summarize",
    "sweep",
    "sweeps",
    "traces",
    "vllm_server",
    "workloads",
]


def __getattr__(name: str) -> ModuleType:
    # simsim.live needs the serve extra, so `import simsim` does not import it: the
    # attribute imports it on first use (with an install hint if the extra is missing).
    if name == "live":
        import importlib

        return importlib.import_module("simsim.live")
    raise AttributeError(f"module 'simsim' has no attribute {name!r}")


# Public modules the guides use as simsim.<name> beyond __all__'s (which `import *` keeps
# as it was); simsim.live is left out: it needs the serve extra to import.
_DOCUMENTED_MODULES = ("admission", "gpu", "results", "scenario", "schedulers")


def __dir__() -> list[str]:
    # The public API and the module's own dunders, not the helpers and internal
    # submodules that importing it leaves in its namespace (ModuleType, engines...).
    dunders = (name for name in globals() if name.startswith("__") and name.endswith("__"))
    return sorted({*__all__, *_DOCUMENTED_MODULES, *dunders})
