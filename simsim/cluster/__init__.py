"""Clusters of simsim servers: replicas behind a router, and disaggregated prefill and
decode (``docs/cluster.md``)."""

from simsim.cluster.cluster import Cluster
from simsim.cluster.disaggregation import DisaggregatedCluster, KvTransferConfig
from simsim.cluster.routers import (
    ROUTERS,
    SCORERS,
    LeastKvCacheRouter,
    LeastOutstandingRouter,
    PowerOfTwoRouter,
    PrefixAffinityRouter,
    RandomRouter,
    ReplicaSnapshot,
    RoundRobinRouter,
    Router,
    WeightedRouter,
    make_router,
    register_router,
)

__all__ = [
    "ROUTERS",
    "SCORERS",
    "Cluster",
    "DisaggregatedCluster",
    "KvTransferConfig",
    "LeastKvCacheRouter",
    "LeastOutstandingRouter",
    "PowerOfTwoRouter",
    "PrefixAffinityRouter",
    "RandomRouter",
    "ReplicaSnapshot",
    "RoundRobinRouter",
    "Router",
    "WeightedRouter",
    "make_router",
    "register_router",
]
