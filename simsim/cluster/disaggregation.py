"""Disaggregated prefill and decode: two pools of batching replicas and a KV transfer.

A request arrives at a prefill replica (chosen by the prefill router), is queued and
prefilled there as on any batching server, and at its prefill's end leaves that replica
with its prompt's KV cache. The decode router then chooses a decode replica, where the
request queues (state still ``PREFILLING``) until admission reserves the KV blocks of
its prompt and next token; only then does the transfer start. It lasts

    ``base_us + round(bytes * transfers_in_flight * 1e6 / bandwidth_bytes_per_s)``

microseconds, with ``bytes = prompt tokens * kv_bytes_per_token`` and
``transfers_in_flight`` the transfers into that decode replica at its start, itself
included (its link's bandwidth is shared equally, and the share is fixed when the
transfer starts). When it ends the request is ``DECODING`` and joins the replica's next
iteration; its first token, and so its TTFT, comes after the transfer.

A request preempted on the decode replica loses its KV cache and recomputes it there,
as on any batching server; one cancelled during the transfer frees its blocks at once.
The prefill replica frees its blocks when the request leaves it (the KV cache is staged
out at the prefill's end).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simsim.admission import AdmissionControl
from simsim.clock import MAX_TIME_US, check_count, time_overflow
from simsim.cluster.cluster import Cluster, _probe, _RouterView, check_prefix_router
from simsim.cluster.routers import Router, make_router
from simsim.engines.base import EngineBase
from simsim.engines.batching import BatchingEngine
from simsim.request import Request

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DisaggregatedCluster", "KvTransferConfig"]


@dataclass(frozen=True, slots=True)
class KvTransferConfig:
    """The cost of moving a prompt's KV cache from a prefill to a decode replica.

    ``base_us`` (>= 0) is paid by every transfer; ``kv_bytes_per_token`` (>= 1) is the
    KV cache's size per token (for a model, ``2 * layers * kv_heads * head_dim *
    bytes_per_value``); ``bandwidth_bytes_per_s`` (>= 1) is each decode replica's
    inbound bandwidth, shared by the transfers in flight into it.
    """

    kv_bytes_per_token: int
    bandwidth_bytes_per_s: int
    base_us: int = 0

    def __post_init__(self) -> None:
        # Plain ints (NumPy integers converted), as every other config.
        object.__setattr__(self, "base_us", check_count(self.base_us, "base_us"))
        for name in ("kv_bytes_per_token", "bandwidth_bytes_per_s"):
            object.__setattr__(self, name, check_count(getattr(self, name), name, minimum=1))

    def transfer_us(self, tokens: int, in_flight: int) -> int:
        """A transfer of *tokens* tokens' KV cache sharing the link with ``in_flight - 1``
        others: ``base_us + bytes * in_flight * 1e6 / bandwidth``, rounded to the nearest
        microsecond (halves up), in exact integer arithmetic."""
        bandwidth = self.bandwidth_bytes_per_s
        scaled = tokens * self.kv_bytes_per_token * in_flight * 1_000_000
        return self.base_us + (2 * scaled + bandwidth) // (2 * bandwidth)


class _Link:
    """One decode replica's inbound link: transfers in flight, reported to the cluster
    (*started* when one starts, *ended* with the end time or ``None`` when aborted)."""

    __slots__ = ("_config", "_ended", "_in_flight", "_started")

    def __init__(
        self,
        config: KvTransferConfig,
        started: Callable[[int, int, int], None],
        ended: Callable[[int, int | None], None],
    ) -> None:
        self._config = config
        self._started = started
        self._ended = ended
        self._in_flight = 0

    def start(self, request: Request, now_us: int) -> int:
        duration = self._config.transfer_us(request.prompt_token_count, self._in_flight + 1)
        if now_us + duration > MAX_TIME_US:  # refused before anything is recorded
            raise time_overflow(
                now_us + duration, f"request {request.request_id}'s KV transfer at {now_us} us"
            )
        self._in_flight += 1
        self._started(request.request_id, now_us, duration)
        return duration

    def finish(self, request: Request, now_us: int) -> None:
        self._in_flight -= 1
        self._ended(request.request_id, now_us)

    def abort(self, request: Request, now_us: int) -> None:
        self._in_flight -= 1
        self._ended(request.request_id, None)


class DisaggregatedCluster(Cluster):
    """A prefill pool and a decode pool of :class:`~simsim.BatchingEngine` replicas.

    ``DisaggregatedCluster(prefill, decode, transfer, *, prefill_router="round_robin",
    decode_router="least_outstanding", refresh_interval_us=0, admission=None)``; an
    admission control checks each request at its arrival, before the prefill router.
    :attr:`replicas` lists the prefill replicas first, then the decode ones, and frames
    number them that way.
    The surface is :class:`Cluster`'s; see this module's docs for the request's path.
    """

    def __init__(
        self,
        prefill: Sequence[BatchingEngine],
        decode: Sequence[BatchingEngine],
        transfer: KvTransferConfig,
        *,
        prefill_router: Router | str = "round_robin",
        decode_router: Router | str = "least_outstanding",
        refresh_interval_us: int = 0,
        admission: AdmissionControl | None = None,
    ) -> None:
        prefill_pool = self._check_replicas(prefill, "prefill")
        decode_pool = self._check_replicas(decode, "decode")
        for name, pool in (("prefill", prefill_pool), ("decode", decode_pool)):
            for index, engine in enumerate(pool):
                if not isinstance(engine, BatchingEngine):
                    raise TypeError(
                        f"{name}[{index}] is a {type(engine).__name__}; both pools of a "
                        "DisaggregatedCluster are BatchingEngine replicas"
                    )
                if engine.first_token_at_prefill:
                    raise ValueError(
                        f"{name}[{index}] has first_token_at_prefill=True, which a "
                        "DisaggregatedCluster does not support (a prefill replica hands "
                        "over a request before its first token); build the replicas "
                        "without it"
                    )
        if not isinstance(transfer, KvTransferConfig):
            raise TypeError(f"transfer must be a KvTransferConfig, got {transfer!r}")
        replicas: tuple[EngineBase, ...] = self._check_replicas(
            prefill_pool + decode_pool, "prefill + decode"
        )
        front_router = make_router(prefill_router)
        back_router = make_router(decode_router)
        if back_router is front_router:
            raise ValueError("prefill_router and decode_router must be two router objects")
        check_prefix_router(front_router, prefill_pool, "prefill replicas")
        check_prefix_router(back_router, decode_pool, "decode replicas")
        count = len(prefill_pool)
        for engine in prefill_pool:  # before _setup, which reads each replica's rules
            engine.replica_port.hand_off_to(self._hand_off)
        self._setup(
            replicas, _RouterView(front_router, tuple(range(count))), refresh_interval_us, admission
        )
        self._back = _RouterView(back_router, tuple(range(count, len(replicas))))
        self._back.probes = [_probe(replicas[index]) for index in self._back.pool]
        self._transfer = transfer
        self._prefill_replica: dict[int, int] = {}
        self._transfer_start: dict[int, int] = {}
        self._handoff_time: dict[int, int] = {}  # when it left its prefill replica
        self._decode_admit: dict[int, int] = {}  # its first admission on a decode replica
        self._transfer_end: dict[int, int] = {}
        self._transfer_times: array[int] = array("q")
        self._transfer_ids: array[int] = array("q")
        self._transfer_replicas: array[int] = array("q")
        self._transfer_durations: array[int] = array("q")
        for index in self._back.pool:
            link = _Link(transfer, self._transfer_started, self._transfer_ended)
            replicas[index].replica_port.receive_over(link)

    @property
    def prefill_replicas(self) -> tuple[BatchingEngine, ...]:
        """The prefill pool."""
        return tuple(self._replicas[i] for i in self._front.pool)  # type: ignore[misc]

    @property
    def decode_replicas(self) -> tuple[BatchingEngine, ...]:
        """The decode pool."""
        return tuple(self._replicas[i] for i in self._back.pool)  # type: ignore[misc]

    @property
    def decode_router(self) -> Router:
        """The router that chooses the decode replica at a prefill's end."""
        return self._back.router

    @property
    def transfer(self) -> KvTransferConfig:
        """The KV transfer's cost."""
        return self._transfer

    # ------------------------------------------------------------------ the hand-off

    def _hand_off(self, request: Request, now_us: int) -> None:
        """A prefill replica's request has finished its prefill: route it to decode."""
        rid = request.request_id
        source = self._holder[rid]
        self._prefill_replica[rid] = source
        self._handoff_time[rid] = now_us
        index = self._route(request, self._back)
        self._hand_to(request, index)
        self._replicas[index].replica_port.accept_handed_over(request)

    def _transfer_started(self, request_id: int, now_us: int, duration_us: int) -> None:
        self._transfer_start[request_id] = now_us
        self._decode_admit.setdefault(request_id, now_us)
        self._transfer_times.append(now_us)
        self._transfer_ids.append(request_id)
        self._transfer_replicas.append(self._holder[request_id])
        self._transfer_durations.append(duration_us)

    def _transfer_ended(self, request_id: int, now_us: int | None) -> None:
        if now_us is None:  # aborted: a recompute follows, if anything
            self._transfer_start.pop(request_id, None)
        else:
            self._transfer_end[request_id] = now_us

    # ------------------------------------------------------------------ frames

    def requests_frame(self) -> pd.DataFrame:
        """One row per request with the engine columns, ``prefill_replica`` and
        ``decode_replica`` (indices in :attr:`replicas`, ``<NA>`` where it never got
        there), ``handoff_time_us`` (when it left its prefill replica),
        ``decode_admit_time_us`` (its first admission on the decode replica, where its
        transfer started, completed or not), ``transfer_start_us``, ``transfer_end_us``
        and ``transfer_us`` (of the transfer that completed, ``<NA>`` otherwise), and
        ``decode_queue_delay_us`` (decode admission - hand-off: how long it queued on
        its decode replica; ``<NA>`` if it was never admitted there)."""
        import pandas as pd

        frame = self._base_frame()
        ids = list(frame["request_id"])
        decode_set = set(self._back.pool)
        prefill: list[int | None] = []
        decode: list[int | None] = []
        for rid in ids:
            holder = self._holder.get(rid)
            if holder is None:
                prefill.append(None)
                decode.append(None)
            elif holder in decode_set:
                prefill.append(self._prefill_replica[rid])
                decode.append(holder)
            else:
                prefill.append(holder)
                decode.append(None)
        frame["prefill_replica"] = pd.array(prefill, dtype="Int64")
        frame["decode_replica"] = pd.array(decode, dtype="Int64")
        frame["handoff_time_us"] = pd.array(
            [self._handoff_time.get(rid) for rid in ids], dtype="Int64"
        )
        frame["decode_admit_time_us"] = pd.array(
            [self._decode_admit.get(rid) for rid in ids], dtype="Int64"
        )
        ends = [self._transfer_end.get(rid) for rid in ids]
        starts = [
            self._transfer_start.get(rid) if end is not None else None
            for rid, end in zip(ids, ends, strict=True)
        ]
        frame["transfer_start_us"] = pd.array(starts, dtype="Int64")
        frame["transfer_end_us"] = pd.array(ends, dtype="Int64")
        frame["transfer_us"] = frame["transfer_end_us"] - frame["transfer_start_us"]
        # The second queue of a request's path; summarize reports it beside queue_delay_us.
        frame["decode_queue_delay_us"] = frame["decode_admit_time_us"] - frame["handoff_time_us"]
        return frame

    def transfers_frame(self) -> pd.DataFrame:
        """One row per transfer started, in order: ``start_us, request_id,
        decode_replica, duration_us`` (an aborted transfer keeps its planned duration)."""
        self._check_alive()
        import pandas as pd

        return pd.DataFrame(
            {
                "start_us": pd.array(self._transfer_times, dtype="int64"),
                "request_id": pd.array(self._transfer_ids, dtype="int64"),
                "decode_replica": pd.array(self._transfer_replicas, dtype="int64"),
                "duration_us": pd.array(self._transfer_durations, dtype="int64"),
            }
        )
