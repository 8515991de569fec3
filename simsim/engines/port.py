"""The replica port: the one door through which a cluster drives an engine.

A :class:`~simsim.Cluster` is a user of its engines, not a part of them: it reads and
changes a replica only through the engine's public names and its
:class:`ReplicaPort` (``engine.replica_port``). The port offers what a cluster needs
and nothing else:

* **joining**: :meth:`ReplicaPort.join` makes the engine a replica (its own ``submit``
  then refuses requests; the cluster is told when it fails; admission counts are
  shared);
* **intake**: :attr:`ReplicaPort.accept_routed` takes a request the router chose this
  replica for, inside the arrival event that routed it; :meth:`ReplicaPort.check_admissible`
  and :meth:`ReplicaPort.admission_rule` let the cluster check at its ``submit`` what the
  engine would refuse;
* **load**: :attr:`ReplicaPort.load` gives the figures of the engine's
  :class:`~simsim.engines.server.ServerLoad`, unchecked (the router reads it at every
  decision); :meth:`ReplicaPort.prefix_lookup` and :meth:`ReplicaPort.frozen_prefix_lookup`
  answer how much of a prompt its prefix cache holds;
* **waiters**: :meth:`ReplicaPort.take_waiters` and :meth:`ReplicaPort.give_waiters` move a
  request's completion and token events with the request;
* **disaggregation** (batching engines only): :meth:`ReplicaPort.hand_off_to`,
  :meth:`ReplicaPort.receive_over` and :meth:`ReplicaPort.accept_handed_over`.

``tests/test_engine_interface.py`` keeps it so: code in ``simsim/cluster/`` and
``simsim/live/`` touches no other object's private names.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from simpy.events import Event

from simsim.engines.base import EngineBase
from simsim.engines.batching import BatchingEngine
from simsim.engines.server import LoadFigures
from simsim.request import Request

if TYPE_CHECKING:
    from simsim.admission import AdmissionGate
    from simsim.engines.batching import KvLink

__all__ = ["PrefixLookup", "ReplicaPort", "Waiters"]

PrefixLookup = Callable[[Sequence[Hashable]], int]
"""How many of some block hashes, from the first, a prefix cache holds."""

Waiters = tuple[Event | None, dict[int, Event] | None]
"""A request's completion event and its token events by token number (``None``: none)."""


class ReplicaPort:
    """What a cluster may do to *engine*, one of its replicas (see the module's docs).

    Two members are plain attributes, bound once, because the cluster calls them for
    every request or routing decision:

    * ``accept_routed(request, sequence)``: *request* (checked by the cluster's
      ``submit``) arrives here now, inside the arrival event numbered *sequence*, as if
      that were the engine's own arrival event; an error fails the engine.
    * ``load()``: the figures of the engine's :class:`~simsim.engines.server.ServerLoad`
      now, as a plain tuple in its field order
      (:data:`~simsim.engines.server.LoadFigures`), without the failure check of
      ``engine.load()``.
    """

    __slots__ = ("_engine", "accept_routed", "load")

    def __init__(self, engine: EngineBase) -> None:
        self._engine = engine
        self.accept_routed: Callable[[Request, int], None] = engine._accept_routed
        self.load: Callable[[], LoadFigures] = engine._load

    @property
    def engine(self) -> EngineBase:
        """The engine behind this port."""
        return self._engine

    @property
    def cluster(self) -> object | None:
        """The cluster this engine is a replica of, or ``None``."""
        return self._engine._cluster

    def join(
        self, cluster: object, on_fail: Callable[[], None], gate: AdmissionGate | None
    ) -> None:
        """Make the engine a replica of *cluster*: its ``submit`` refuses requests from
        now on, *on_fail* is called once when it fails, and it keeps *gate*'s queue
        counts (the cluster's admission control) as its requests are admitted or leave.
        ``ValueError`` if it already serves a cluster."""
        engine = self._engine
        if engine._cluster is not None:
            raise ValueError(
                f"the engine is already a replica of {engine._cluster!r}; an engine serves "
                "one cluster"
            )
        engine._cluster = cluster
        engine._on_fail = on_fail
        engine._gate = gate

    def check_admissible(self, request: Request) -> None:
        """Raise ``ValueError`` if the engine could never run *request* (a prompt that
        can never fit its KV cache, say), as its ``submit`` would."""
        self._engine._check_admissible(request)

    def admission_rule(self) -> Hashable | None:
        """A key equal for replicas that refuse the same requests (``None``: this one
        accepts every request), so a cluster checks each distinct rule once."""
        engine = self._engine
        if type(engine)._check_admissible is EngineBase._check_admissible:
            return None
        return engine._admission_rule()

    def check_token_events(self, request: Request) -> None:
        """Raise if the engine cannot give token events for *request*, as its
        ``token()`` would."""
        self._engine._check_token_events(request)

    def prefix_lookup(self) -> PrefixLookup | None:
        """The engine's prefix cache as it is at each call, or ``None`` without one."""
        return self._engine._prefix_lookup(frozen=False)

    def frozen_prefix_lookup(self) -> PrefixLookup | None:
        """The engine's prefix cache as it is now, unchanged by later work, or ``None``
        without one."""
        return self._engine._prefix_lookup(frozen=True)

    def take_waiters(self, request_id: int) -> Waiters:
        """Remove and return the completion and token events waiting on *request_id*
        here (it leaves for another replica)."""
        engine = self._engine
        return (
            engine._completions.pop(request_id, None),
            engine._token_waiters.pop(request_id, None),
        )

    def give_waiters(self, request_id: int, waiters: Waiters) -> None:
        """Make *waiters* (from the cluster or another replica) wait on *request_id*
        here."""
        completion, tokens = waiters
        engine = self._engine
        if completion is not None:
            engine._completions[request_id] = completion
        if tokens:
            engine._token_waiters[request_id] = tokens

    # ------------------------------------------------------------------ disaggregation

    def hand_off_to(self, hand_off: Callable[[Request, int], None]) -> None:
        """Make this batching engine a prefill replica: at each request's prefill end it
        calls ``hand_off(request, now_us)`` and lets the request go. Set it before the
        cluster reads :meth:`admission_rule` (a prefill replica holds less)."""
        self._batching()._hand_off = hand_off

    def receive_over(self, link: KvLink) -> None:
        """Make this batching engine a decode replica that moves each handed-over
        request's KV cache in over *link*."""
        self._batching()._link = link

    def accept_handed_over(self, request: Request) -> None:
        """Queue *request*, prefilled on another replica, for its KV cache's transfer."""
        self._batching()._accept_handed_over(request)

    def _batching(self) -> BatchingEngine:
        engine = self._engine
        if not isinstance(engine, BatchingEngine):
            raise TypeError(
                f"{type(engine).__name__} cannot take part in disaggregation; both pools "
                "of a DisaggregatedCluster are BatchingEngine replicas"
            )
        return engine
