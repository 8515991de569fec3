"""Fair share across tenants: a virtual token counter (VTC) per tenant.

The policy follows the virtual token counter of Sheng et al., "Fairness in Serving
Large Language Models" (OSDI 2024), adapted to a scheduler that sees only queued
metadata and decides one admission at a time:

- Every tenant (``QueuedRequest.tenant``; a request without one belongs to the tenant
  ``""``) has a counter of the service it was given, in weighted tokens.
- ``decide`` proposes the head of the *backlogged* tenant (one with a queued request)
  whose counter is least; within a tenant, requests go first come, first served,
  ``(arrival_time_us, request_id)``. Ties between counters go to the tenant whose head
  arrived first (then the lower head request id), so the order is total and runs are
  deterministic.
- ``commit`` charges the admitted request's tenant ``prompt_weight *
  prompt_token_count + output_weight * max_output_tokens``. A request admitted again
  after a preemption is not charged again.
- A tenant that becomes backlogged has its counter lifted to the least counter among
  the backlogged tenants (or, when no tenant is backlogged, to the counter of the last
  tenant that left the backlog), never lowered: a tenant cannot bank credit while it
  sends nothing and then claim the server for that long.

What differs from the paper: the paper charges each token as it is prefilled or
decoded; this scheduler charges a request's whole weighted size at admission (a
scheduler sees no tokens; simsim's requests generate exactly ``max_output_tokens``
unless cancelled, so the charge is what the request will cost). A cancelled request
keeps its charge. Between two admissions of one tenant, the other tenants therefore
see its counter jump by a request's size rather than climb token by token: the
service of two tenants that stay backlogged differs by at most one request's weighted
size, plus the lift (the paper's bound, with a request's size in place of the tokens
served in one step).

Every operation takes ``O(log n)`` time (amortised): one first-come-first-served heap
per tenant, and a heap of backlogged tenants keyed by ``(counter, head arrival, head
id)``, whose outdated entries are dropped when they reach the top.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from simsim.checks import check_weight
from simsim.clock import check_count, check_time_us
from simsim.errors import UnknownRequestError
from simsim.scheduler import AdmissionDecision, QueuedRequest, _QueueCounters

__all__ = ["DEFAULT_TENANT", "FairShareScheduler"]

DEFAULT_TENANT = ""
"""The tenant of a request that names none."""

# A per-tenant queue entry: (arrival, request id, enqueue number, record). The enqueue
# number breaks ties with an outdated entry of the same id (a request removed and queued
# again), which is recognised by identity against the live record.
_Entry = tuple[int, int, int, QueuedRequest]
# A tenant heap entry: (counter, head arrival, head id, stamp, tenant). An entry is
# current while its stamp is the tenant's latest.
_TenantEntry = tuple[float, int, int, int, str]


class FairShareScheduler(_QueueCounters):
    """Virtual-token-counter fair share across tenants (see the module's docstring).

    *prompt_weight* and *output_weight* (finite numbers ``>= 0``, at least one above 0)
    price a request's prompt and output tokens; the defaults count an output token twice
    a prompt token, as the paper's default does. Both zero would charge nobody and order
    first come, first served: ``ValueError``, as a weighted router's all-zero weights.

    The rules of :class:`simsim.FcfsScheduler` hold: ``decide`` is pure; ``enqueue``,
    ``remove`` and a successful ``commit`` each bump ``epoch``; a decision from another
    epoch, or naming a request that is not the head, raises
    :class:`~simsim.errors.StaleDecisionError` and changes nothing but the
    ``rejected_commits`` statistic.
    """

    __slots__ = (
        "_backlog",
        "_charged",
        "_counters",
        "_last_left",
        "_output_weight",
        "_prompt_weight",
        "_queues",
        "_stamp",
        "_stamps",
        "_tenants",
    )

    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0) -> None:
        super().__init__()
        self._prompt_weight = check_weight(prompt_weight, "FairShareScheduler: prompt_weight")
        self._output_weight = check_weight(output_weight, "FairShareScheduler: output_weight")
        if not (self._prompt_weight or self._output_weight):
            # Every counter would stay 0: plain FCFS under another name, as a weighted
            # router with all weights 0 would route by nothing (it is refused too).
            raise ValueError(
                f"FairShareScheduler: prompt_weight={prompt_weight!r} and "
                f"output_weight={output_weight!r}: at least one weight must be above 0 (with "
                "both 0 no tenant is ever charged and the order is first come, first served: "
                "use FcfsScheduler for that)"
            )
        self._counters: dict[str, float] = {}
        # Per backlogged tenant: its FCFS heap and how many of its entries are live.
        self._queues: dict[str, list[_Entry]] = {}
        self._backlog: dict[str, int] = {}
        self._tenants: list[_TenantEntry] = []
        self._stamps: dict[str, int] = {}
        self._stamp = 0
        self._last_left: float | None = None
        # Ids already charged: a preempted request queued again is not charged twice.
        self._charged: set[int] = set()

    def __repr__(self) -> str:
        return (
            f"FairShareScheduler(prompt_weight={self._prompt_weight}, "
            f"output_weight={self._output_weight}, queued={len(self._live)}, "
            f"tenants={len(self._backlog)}, epoch={self._epoch})"
        )

    @property
    def prompt_weight(self) -> float:
        """The charge per prompt token."""
        return self._prompt_weight

    @property
    def output_weight(self) -> float:
        """The charge per output token (``max_output_tokens``)."""
        return self._output_weight

    @property
    def counters(self) -> dict[str, float]:
        """Each tenant's virtual token counter (a copy), for every tenant seen so far."""
        return dict(self._counters)

    def backlogged_tenants(self) -> list[str]:
        """The tenants with a queued request, sorted by name."""
        return sorted(self._backlog)

    def queued_ids(self) -> list[int]:
        """The queued request ids in the order they would be admitted if nothing else
        arrived (for inspection and tests; the scheduler itself does not change)."""
        shadow = FairShareScheduler(self._prompt_weight, self._output_weight)
        shadow._counters = dict(self._counters)
        shadow._queues = {tenant: list(queue) for tenant, queue in self._queues.items()}
        shadow._backlog = dict(self._backlog)
        shadow._live = dict(self._live)
        shadow._tenants = list(self._tenants)
        shadow._stamps = dict(self._stamps)
        shadow._stamp = self._stamp
        shadow._last_left = self._last_left
        shadow._charged = set(self._charged)
        order = []
        while (decision := shadow.decide(0)) is not None:
            order.append(shadow.commit(decision).request_id)
        return order

    def enqueue(self, item: QueuedRequest) -> None:
        """Queue *item* behind its tenant's earlier requests; its id must not be queued.

        If its tenant had nothing queued, the tenant's counter is lifted first (see the
        class docstring).
        """
        if not isinstance(item, QueuedRequest):
            raise TypeError(f"enqueue takes a QueuedRequest, got {type(item).__name__}")
        rid = item.request_id
        live = self._live
        if rid in live:
            raise ValueError(f"request {rid} is already queued")
        tenant = DEFAULT_TENANT if item.tenant is None else item.tenant
        queue = self._queues.get(tenant)
        if queue is None:
            floor = self._tenants[0][0] if self._tenants else self._last_left
            counter = self._counters.get(tenant, 0.0)
            if floor is not None and floor > counter:
                counter = floor
            self._counters[tenant] = counter
            queue = self._queues[tenant] = []
            self._backlog[tenant] = 0
        entry = (item.arrival_time_us, rid, self._enqueued, item)
        heappush(queue, entry)
        self._backlog[tenant] += 1
        live[rid] = item
        if queue[0] is entry:
            self._push_tenant(tenant)
            self._drop_outdated_tenants()
        self._epoch += 1
        self._enqueued += 1
        if len(live) > self._max_queue_length:
            self._max_queue_length = len(live)

    def remove(self, request_id: int) -> None:
        """Take a queued request out; raises :class:`UnknownRequestError` if it is not queued."""
        rid = check_count(request_id, "request_id")
        item = self._live.pop(rid, None)
        if item is None:
            raise UnknownRequestError(f"request {rid} is not queued in this scheduler")
        tenant = DEFAULT_TENANT if item.tenant is None else item.tenant
        self._backlog[tenant] -= 1
        # A request behind the head stays in its tenant's heap until it surfaces.
        if self._queues[tenant][0][3] is item:
            self._head_changed(tenant)
        self._epoch += 1
        self._removed += 1

    def decide(self, now_us: int) -> AdmissionDecision | None:
        """The head of the least-served backlogged tenant, or ``None`` when empty."""
        if type(now_us) is not int or now_us < 0:
            check_time_us(now_us, "now_us")
        tenants = self._tenants
        if not tenants:
            return None
        return AdmissionDecision(tenants[0][2], self._epoch)

    def commit(self, decision: AdmissionDecision) -> QueuedRequest:
        """Admit the head named by *decision*, charge its tenant, and return its record.

        A decision from another epoch, or naming a request that is not the head, raises
        :class:`StaleDecisionError` and leaves the queue, the counters and the epoch
        unchanged.
        """
        if not isinstance(decision, AdmissionDecision):
            raise TypeError(f"commit takes an AdmissionDecision, got {type(decision).__name__}")
        tenants = self._tenants
        if decision.epoch != self._epoch or not tenants or tenants[0][2] != decision.request_id:
            raise self._refuse(decision, tenants[0][2] if tenants else None)
        tenant = tenants[0][4]
        _, rid, _, item = heappop(self._queues[tenant])
        del self._live[rid]
        self._backlog[tenant] -= 1
        if rid not in self._charged:
            self._charged.add(rid)
            self._counters[tenant] += (
                self._prompt_weight * item.prompt_token_count
                + self._output_weight * item.max_output_tokens
            )
        self._head_changed(tenant)
        self._epoch += 1
        self._admitted += 1
        return item

    # ------------------------------------------------------------------ internals

    def _head_changed(self, tenant: str) -> None:
        """Re-key *tenant* after its head or counter changed, or drop it from the
        backlog when nothing of it is queued; then keep the tenant heap's top current."""
        if self._backlog[tenant]:
            queue, live = self._queues[tenant], self._live
            while live.get(queue[0][1]) is not queue[0][3]:
                heappop(queue)
            self._push_tenant(tenant)
        else:
            del self._backlog[tenant], self._queues[tenant], self._stamps[tenant]
            self._last_left = self._counters[tenant]
        self._drop_outdated_tenants()

    def _push_tenant(self, tenant: str) -> None:
        head = self._queues[tenant][0]
        self._stamp += 1
        self._stamps[tenant] = self._stamp
        heappush(self._tenants, (self._counters[tenant], head[0], head[1], self._stamp, tenant))

    def _drop_outdated_tenants(self) -> None:
        # Keep "the tenant heap's top is current" so decide() stays a pure read.
        tenants, stamps = self._tenants, self._stamps
        while tenants and stamps.get(tenants[0][4]) != tenants[0][3]:
            heappop(tenants)
        # Outdated entries below the top are dropped when they surface; rebuilding when
        # they outnumber the current ones keeps the heap within twice the tenants.
        if len(tenants) > 2 * len(stamps) + 16:
            tenants[:] = [entry for entry in tenants if stamps.get(entry[4]) == entry[3]]
            heapify(tenants)
