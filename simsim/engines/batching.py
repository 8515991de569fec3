"""The continuous-batching server: iterations over a batch of requests, KV-cache blocks.

While any request holds a slot, :class:`BatchingEngine` runs iterations back to back.
Each iteration is one SimPy event whose duration is fixed when it is launched. A new
iteration starts at a timestamp boundary (after every event of that time), in four
steps:

1. requests that finished or were cancelled have already left;
2. each decoding request reserves the KV block its next token needs, oldest admission
   first; when no block is free the most recently admitted request is preempted (freed,
   logged ``REQUEST_PREEMPTED``, queued again as ``PREEMPTED``), and so on;
3. the scheduler's heads are admitted while a slot and memory allow (and, under
   ``prefill_first``, the token cap); a head that does not fit stops admission;
4. the iteration is launched: under ``prefill_first`` an iteration with new admissions
   prefills their whole prompts and decodes nobody, otherwise every decoding request
   decodes one token; under ``mixed`` every decoding request decodes one token and the
   rest of ``max_batch_tokens`` goes to prefill chunks in admission order.

When the iteration ends, its records are written in admission order, each with its own
sequence number, stamped with the end time. See ``docs/batching.md``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from simsim.admission import AdmissionControl
from simsim.backend import (
    Backend,
    FittedBackend,
    SimulatedBackend,
    check_duration_us,
    iteration_cost_us,
    round_us,
)
from simsim.clock import MAX_TIME_US, Environment, ScheduledEvent, time_overflow
from simsim.engines.base import EngineBase, engine_work, positive_int, queued_request
from simsim.engines.prefix_cache import BlockTable, PrefixCache
from simsim.engines.server import LoadFigures
from simsim.engines.stretches import (
    MAX_STRETCH,
    MIN_STRETCH,
    decode_steps_pricer,
    stretch_ends,
)
from simsim.errors import InvalidTransitionError, StaleEventError
from simsim.records import EventType, IterationLog, IterationRecord, IterationRow
from simsim.registry import Registry
from simsim.request import Request, RequestState
from simsim.scheduler import AdmissionDecision, FcfsScheduler, Scheduler
from simsim.schedulers import (
    EarliestDeadlineFirstScheduler,
    FairShareScheduler,
    PriorityScheduler,
    ShortestJobFirstScheduler,
    ShortestPromptFirstScheduler,
)
from simsim.wording import counted

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["POLICIES", "BatchingEngine", "BatchingPolicy", "KvCacheConfig", "KvLink"]

_PREFILLING = RequestState.PREFILLING
_DECODING = RequestState.DECODING
_FINISHED = RequestState.FINISHED
_CANCELLED = RequestState.CANCELLED
_PREEMPTED = RequestState.PREEMPTED

_PREFILL = EventType.PREFILL_COMPLETE
_DECODE = EventType.DECODE_STEP_COMPLETE
_COMPLETE = EventType.REQUEST_COMPLETE
_PREEMPT = EventType.REQUEST_PREEMPTED


@dataclass(frozen=True, slots=True)
class KvCacheConfig:
    """A paged KV cache: ``total_blocks`` blocks of ``block_size_tokens`` tokens each."""

    block_size_tokens: int
    total_blocks: int

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = positive_int(getattr(self, spec.name), spec.name)
            object.__setattr__(self, spec.name, value)

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold *tokens* tokens: ``ceil(tokens / block_size_tokens)``."""
        return -(-tokens // self.block_size_tokens)

    def check_fits(self, request_id: int, prompt_tokens: int, output_tokens: int) -> None:
        """Refuse (``ValueError``) request *request_id* if its *prompt_tokens* and
        *output_tokens* need more blocks than the whole cache: it could never run."""
        need = self.blocks_for(prompt_tokens + output_tokens)
        if need > self.total_blocks:
            raise ValueError(
                f"request {request_id} needs {need} KV blocks for its {prompt_tokens} prompt "
                f"and {output_tokens} output tokens, more than the whole cache "
                f"({self.total_blocks} blocks of {self.block_size_tokens} tokens); it could "
                "never run"
            )


class KvLink(Protocol):
    """How a decode replica moves a handed-over request's KV cache in (see
    :mod:`simsim.cluster.disaggregation`): the engine calls :meth:`start` when it admits
    the request, then :meth:`finish` when the transfer ends or :meth:`abort` when the
    request leaves before (cancelled or preempted)."""

    def start(self, request: Request, now_us: int) -> int:
        """The transfer starts now; return its duration in microseconds."""
        ...

    def finish(self, request: Request, now_us: int) -> None:
        """The transfer has ended."""
        ...

    def abort(self, request: Request, now_us: int) -> None:
        """The request left before its transfer ended."""
        ...


class _Slot:
    """A request's place in the batch: how much it has prefilled and what it holds."""

    __slots__ = (
        "arriving",
        "blocks",
        "decoded",
        "left",
        "prefilled",
        "request",
        "table",
        "target",
    )

    def __init__(
        self, request: Request, target: int, blocks: int, table: BlockTable | None = None
    ) -> None:
        self.request = request
        self.target = target  # tokens to prefill: the prompt plus any recomputed output
        self.prefilled = 0
        self.decoded = 0  # tokens decoded since this admission
        self.blocks = blocks
        self.table = table  # its blocks in the prefix cache's pool (None without one)
        self.left = False  # cancelled while its iteration ran
        self.arriving = False  # its prompt's KV cache is on its way from a prefill replica


_Plan = tuple[list[tuple[_Slot, int | None]], list[_Slot], int, int, int]
"""Who takes part in an iteration (each slot with its prefill chunk, ``None`` for a
decode), who decodes for the first time since admission, and the prefill tokens,
prefilling and decoding counts."""


def _plan_prefill_first(slots: list[_Slot], new_slots: list[_Slot], budget: int | None) -> _Plan:
    """vLLM's original rule: newly admitted requests prefill their whole prompts together
    and nobody decodes; without new admissions every decoding request decodes a token."""
    participants: list[tuple[_Slot, int | None]] = []
    first_decoders: list[_Slot] = []
    prefill_tokens = prefilling = decoding = 0
    if new_slots:  # a request whose KV cache is on its way takes no part yet
        new_slots = [slot for slot in new_slots if not slot.arriving]
    if new_slots:
        for slot in new_slots:
            chunk = slot.target - slot.prefilled
            participants.append((slot, chunk))
            prefill_tokens += chunk
            prefilling += 1
    else:
        for slot in slots:
            if slot.request.state is _DECODING:
                participants.append((slot, None))
                decoding += 1
                if not slot.decoded:
                    first_decoders.append(slot)
    return participants, first_decoders, prefill_tokens, prefilling, decoding


def _plan_mixed(slots: list[_Slot], new_slots: list[_Slot], budget: int | None) -> _Plan:
    """Chunked prefill (Sarathi-Serve): every decoding request decodes a token, and what
    is left of the token budget goes to prefill chunks in admission order."""
    assert budget is not None
    participants: list[tuple[_Slot, int | None]] = []
    first_decoders: list[_Slot] = []
    prefill_tokens = prefilling = decoding = 0
    budget -= sum(1 for slot in slots if slot.request.state is _DECODING)
    for slot in slots:
        if slot.request.state is _DECODING:
            participants.append((slot, None))
            decoding += 1
            if not slot.decoded:
                first_decoders.append(slot)
            continue
        if slot.arriving:
            continue
        remaining = slot.target - slot.prefilled
        chunk = min(remaining, budget)
        if chunk > 0 or remaining == 0:
            participants.append((slot, chunk))
            prefill_tokens += chunk
            prefilling += 1
            budget -= chunk
    return participants, first_decoders, prefill_tokens, prefilling, decoding


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """How :class:`BatchingEngine` fills an iteration: one ``policy=`` choice.

    ``plan`` picks an iteration's participants from the batch (see the module's step 4);
    ``token_cap_at_admission``: admission stops before the new prompts' total would pass
    ``max_batch_tokens`` (``prefill_first``); ``needs_max_batch_tokens``: the policy
    spends that per-iteration budget and cannot run without it (``mixed``).
    """

    name: str
    plan: Callable[[list[_Slot], list[_Slot], int | None], _Plan]
    token_cap_at_admission: bool = False
    needs_max_batch_tokens: bool = False

    def __call__(
        self, slots: list[_Slot], new_slots: list[_Slot], max_batch_tokens: int | None
    ) -> _Plan:
        """The iteration's plan (``plan``)."""
        return self.plan(slots, new_slots, max_batch_tokens)


POLICIES: Registry[BatchingPolicy] = Registry("policy", "policies")
"""The iteration policies :class:`BatchingEngine` knows, by name (``policy=``)."""

POLICIES.register(
    "prefill_first",
    BatchingPolicy("prefill_first", _plan_prefill_first, token_cap_at_admission=True),
)
POLICIES.register("mixed", BatchingPolicy("mixed", _plan_mixed, needs_max_batch_tokens=True))


_TIMELESS_SCHEDULERS = frozenset(
    {
        FcfsScheduler,
        EarliestDeadlineFirstScheduler,
        FairShareScheduler,
        PriorityScheduler,
        ShortestJobFirstScheduler,
        ShortestPromptFirstScheduler,
    }
)
"""The built-in schedulers: their head depends on their queue alone, not on the time
``decide`` is asked at (aging orders by a virtual arrival time)."""


class _IterationEvent(ScheduledEvent):
    """The end of one iteration: the engine's one event for the whole batch."""


class _TransferEnd(ScheduledEvent):
    """The end of one request's KV-cache transfer into this replica."""

    def __init__(self, env: Environment, callback: Any, at_us: int, slot: _Slot) -> None:
        self.slot = slot
        super().__init__(env, callback, at_us)


class _Stretch:
    """Decode iterations run before an event's iteration, priced and numbered at once.

    Iterations ``0 .. len(ends) - 2`` of the stretch happen inside it (their launches at
    the previous ones' ends, with nobody else acting before the stretch's event); the
    event ends iteration ``len(ends) - 1``, whose records are written as usual. Every
    iteration numbers ``stride`` sequences as it would step by step: the boundary
    before it, its end event, then its records; iteration *k* of the stretch has its
    records from ``first_sequence + k * stride + 1``.
    """

    __slots__ = (
        "ends",
        "first_sequence",
        "kv_blocks_cached",
        "kv_blocks_in_use",
        "start_us",
        "stride",
    )

    def __init__(
        self,
        start_us: int,
        ends: npt.NDArray[np.int64],
        first_sequence: int,
        stride: int,
        kv_blocks_in_use: npt.NDArray[np.int64],
        kv_blocks_cached: npt.NDArray[np.int64],
    ) -> None:
        self.start_us = start_us
        self.ends = ends  # every iteration's end, the event's last
        self.first_sequence = first_sequence  # iteration 0's end event's number
        self.stride = stride
        self.kv_blocks_in_use = kv_blocks_in_use  # at each iteration's launch
        self.kv_blocks_cached = kv_blocks_cached


class _Iteration:
    __slots__ = ("event", "next_sequence", "participants", "record", "stretch")

    def __init__(
        self,
        event: _IterationEvent,
        participants: list[tuple[_Slot, int | None]],
        record: IterationRow,
        first_sequence: int,
        stretch: _Stretch | None = None,
    ) -> None:
        self.event = event
        self.participants = participants  # (slot, prefill chunk) or (slot, None) to decode
        self.record = record
        # Sequence numbers set aside at launch for the records written at the end, so
        # that they sort before every event scheduled after the launch.
        self.next_sequence = first_sequence
        # The decode iterations before this one that its event also ends (None: none).
        self.stretch = stretch


class BatchingEngine(EngineBase):
    """An iteration-level (continuous batching) server with an optional paged KV cache.

    ``BatchingEngine(backend, scheduler=None, *, max_active_requests,
    max_batch_tokens=None, policy="prefill_first", kv_cache=None, prefix_cache=False,
    env=None, admission=None, first_token_at_prefill=False, stretches=True)``;
    ``prefix_cache=True`` (with a ``kv_cache``) shares the KV blocks of common prefixes
    (``docs/batching.md``, "Prefix caching"); an :class:`~simsim.AdmissionControl` as
    *admission* checks every arrival (:mod:`simsim.admission`);
    ``first_token_at_prefill=True`` samples each request's first token in the iteration
    that ends its prefill, as vLLM and llama.cpp do (``docs/batching.md``, "The first
    token at the end of the prefill"); ``stretches=False`` runs one event per iteration
    instead of advancing through a run of decode iterations nothing can interrupt in
    one (``docs/batching.md``, "Stretches"; the results are the same).
    Same ``submit``, ``run_next_timestamp``, ``run``, ``cancel_request``,
    ``completion``, accessors, failure rules and frames as
    :class:`~simsim.SimulationEngine`, plus :attr:`iteration_log` and
    :meth:`iterations_frame`.
    """

    def __init__(
        self,
        backend: Backend,
        scheduler: Scheduler | None = None,
        *,
        max_active_requests: int,
        max_batch_tokens: int | None = None,
        policy: str = "prefill_first",
        kv_cache: KvCacheConfig | None = None,
        prefix_cache: bool = False,
        env: Environment | None = None,
        admission: AdmissionControl | None = None,
        first_token_at_prefill: bool = False,
        stretches: bool = True,
    ) -> None:
        slots = positive_int(max_active_requests, "max_active_requests")
        if type(stretches) is not bool:
            raise TypeError(f"stretches must be True or False, got {stretches!r}")
        if type(prefix_cache) is not bool:
            raise TypeError(f"prefix_cache must be True or False, got {prefix_cache!r}")
        if type(first_token_at_prefill) is not bool:
            raise TypeError(
                f"first_token_at_prefill must be True or False, got {first_token_at_prefill!r}"
            )
        if prefix_cache and kv_cache is None:
            raise ValueError(
                "prefix_cache=True needs a kv_cache: the cache shares and keeps its KV blocks"
            )
        if max_batch_tokens is not None:
            max_batch_tokens = positive_int(max_batch_tokens, "max_batch_tokens")
            if max_batch_tokens < slots:
                raise ValueError(
                    f"max_batch_tokens={max_batch_tokens} must be >= max_active_requests="
                    f"{slots}, so that one decode token per request always fits"
                )
        rule = POLICIES.lookup(policy)
        if rule.needs_max_batch_tokens and max_batch_tokens is None:
            raise ValueError(
                f"policy {rule.name!r} needs max_batch_tokens (the per-iteration budget)"
            )
        if kv_cache is not None and not isinstance(kv_cache, KvCacheConfig):
            raise TypeError(f"kv_cache must be a KvCacheConfig or None, got {kv_cache!r}")
        super().__init__(backend, scheduler, env, admission)
        self._max_active_requests = slots
        self._max_batch_tokens = max_batch_tokens
        self._policy = rule
        self._kv_cache = kv_cache
        self._first_token_at_prefill = first_token_at_prefill
        # Records one participant may write at an iteration's end: a prefill or a token,
        # then a completion; with the first token at the prefill, all three.
        self._records_per_participant = 3 if first_token_at_prefill else 2
        self._free_blocks = 0 if kv_cache is None else kv_cache.total_blocks
        self._pool: PrefixCache | None = None
        if prefix_cache:
            assert kv_cache is not None
            self._pool = PrefixCache(kv_cache.total_blocks)
        self._slots: list[_Slot] = []  # admission order, oldest first
        self._slot_of: dict[int, _Slot] = {}
        self._iteration: _Iteration | None = None
        self._ending: _Iteration | None = None  # the iteration whose records are written
        self._abandoned: set[_IterationEvent] = set()
        self._iterations = IterationLog()
        # Disaggregation (simsim.cluster): a prefill replica hands each request over at
        # its prefill's end; a decode replica queues handed-over requests (ids in
        # _incoming) and moves their KV cache over a link once admitted.
        self._hand_off: Callable[[Request, int], None] | None = None
        self._link: KvLink | None = None
        self._incoming: set[int] = set()
        self._preemption_count = 0
        # A backend's own iteration_us, unless it is SimulatedBackend's composition of
        # the two per-phase costs: those are priced part by part, each part checked.
        iteration_us = getattr(backend, "iteration_us", None)
        if getattr(type(backend), "iteration_us", None) is SimulatedBackend.iteration_us:
            iteration_us = None
        self._iteration_us = iteration_us if callable(iteration_us) else None
        # A lower bound on every iteration a request decodes in, when it is known: with
        # SimulatedBackend's own decode price, decode_base_us + per-sequence * 1.
        self._decode_floor_us = 0
        self._decode_floor_what = "decode_base_us + decode_per_active_sequence_us"
        if (
            self._iteration_us is None
            and isinstance(backend, SimulatedBackend)
            and type(backend).decode_step_us is SimulatedBackend.decode_step_us
        ):
            costs = backend.config
            self._decode_floor_us = costs.decode_base_us + costs.decode_per_active_sequence_us
        elif isinstance(backend, FittedBackend) and type(backend).step_us is FittedBackend.step_us:
            # FittedBackend's steps are never cheaper than one sequence decoding alone
            # over no context, rounded as it rounds (the rounding is monotone).
            fitted = backend.config
            self._decode_floor_us = round_us(fitted.decode_base_us + fitted.decode_per_sequence_us)
            self._decode_floor_what = "decode_base_us + decode_per_sequence_us, rounded"
        # How a stretch of decode iterations is priced at once (None: no stretches).
        self._decode_steps = None
        if stretches:
            self._decode_steps = decode_steps_pricer(backend, self._iteration_us)

    # ------------------------------------------------------------------ accessors

    @property
    def max_active_requests(self) -> int:
        """How many requests may hold a slot at once."""
        return self._max_active_requests

    @property
    def max_batch_tokens(self) -> int | None:
        """The per-iteration token budget (``None``: no cap under ``prefill_first``)."""
        return self._max_batch_tokens

    @property
    def policy(self) -> str:
        """``"prefill_first"`` or ``"mixed"``."""
        return self._policy.name

    @property
    def first_token_at_prefill(self) -> bool:
        """Whether the iteration that ends a request's prefill also gives its first token
        (vLLM's and llama.cpp's lifecycle) rather than the next one (the default)."""
        return self._first_token_at_prefill

    @property
    def kv_cache(self) -> KvCacheConfig | None:
        """The KV cache, or ``None`` for unlimited memory."""
        return self._kv_cache

    @property
    def prefix_cache(self) -> bool:
        """Whether requests share and keep the KV blocks of common prompt prefixes."""
        return self._pool is not None

    @property
    def kv_blocks_cached(self) -> int:
        """KV blocks nobody holds that still hold a cached prefix (0 without a cache)."""
        self._check_alive()
        return 0 if self._pool is None else self._pool.cached_blocks

    @property
    def kv_blocks_in_use(self) -> int:
        """KV blocks held by requests in the batch now."""
        self._check_alive()
        if self._pool is not None:  # shared blocks count once
            return self._pool.used_blocks
        return sum(slot.blocks for slot in self._slots)

    @property
    def active_request_ids(self) -> list[int]:
        """Ids of the requests holding a slot, in admission order."""
        self._check_alive()
        return [slot.request.request_id for slot in self._slots]

    @property
    def iteration_log(self) -> Sequence[IterationRecord]:
        """Every launched iteration, in the order they ended or were abandoned."""
        self._check_alive()
        return self._iterations.records()

    def requests_frame(self) -> pd.DataFrame:
        """As on every engine; with a prefix cache, ``cached_prompt_tokens`` is appended:
        the prompt tokens the cache served at each request's first admission."""
        frame = super().requests_frame()
        if self._pool is not None:
            import pandas as pd

            counts = [self._requests[rid].cached_prompt_token_count for rid in frame["request_id"]]
            frame["cached_prompt_tokens"] = pd.array(counts, dtype="int64")
        return frame

    def iterations_frame(self) -> pd.DataFrame:
        """One row per :attr:`iteration_log` entry; times are ``Int64``. With a prefix
        cache, ``kv_blocks_cached`` is appended."""
        self._check_alive()
        import pandas as pd

        from simsim.results import iterations_frame

        frame = iterations_frame(self._iterations)
        if self._pool is not None:
            cached = self._iterations.column("kv_blocks_cached")
            frame["kv_blocks_cached"] = pd.array(cached, dtype="int64")
        return frame

    # ------------------------------------------------------------------ submission

    def _shares_prefixes(self) -> bool:
        return self._pool is not None

    def _admission_rule(self) -> Hashable:
        # Replicas of one kind with one KV cache refuse the same requests; a prefill
        # replica (it hands requests off) holds less.
        return (type(self), self._kv_cache, self._hand_off is not None)

    def _prefix_lookup(self, frozen: bool) -> Callable[[Sequence[Hashable]], int] | None:
        pool = self._pool
        if pool is None:
            return None
        return pool.frozen_match() if frozen else pool.match

    def _check_admissible(self, request: Request) -> None:
        cache = self._kv_cache
        if cache is None:
            return
        hashes = request.block_hashes
        if (
            hashes is not None
            and len(hashes)
            > (request.prompt_token_count + request.max_output_tokens) // cache.block_size_tokens
        ):
            tokens = request.prompt_token_count + request.max_output_tokens
            raise ValueError(
                f"request {request.request_id} has {len(hashes)} block_hashes, but its "
                f"{request.prompt_token_count} prompt and {request.max_output_tokens} output "
                f"tokens fill at most {tokens // cache.block_size_tokens} blocks of "
                f"{cache.block_size_tokens} tokens (one hash per full block)"
            )
        output = request.max_output_tokens
        if self._hand_off is not None:
            # A prefill replica holds the prompt and the next token's block, no more.
            output = min(output, 1)
        cache.check_fits(request.request_id, request.prompt_token_count, output)

    # ------------------------------------------------------------------ events

    def _is_idle(self) -> bool:
        return self._iteration is None

    def _running_count(self) -> int:
        return len(self._slots)

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of KV-cache blocks held by requests (cached prefix blocks nobody
        holds do not count); without a KV cache, the fraction of slots held."""
        self._check_alive()
        return self._load()[2]

    def _load(self) -> LoadFigures:
        running = len(self._slots)
        cache = self._kv_cache
        if cache is None:
            usage = running / self._max_active_requests
        else:
            pool = self._pool
            used = pool.used_blocks if pool is not None else cache.total_blocks - self._free_blocks
            usage = used / cache.total_blocks
        return len(self._scheduler), running, usage, self._preemption_count

    @property
    def kv_capacity_tokens(self) -> int | None:
        """The tokens the whole KV cache holds (``None`` without a KV cache)."""
        cache = self._kv_cache
        return None if cache is None else cache.total_blocks * cache.block_size_tokens

    @engine_work
    def _on_iteration_end(self, event: _IterationEvent) -> None:
        iteration = self._iteration
        now = self._env.now
        if iteration is None or iteration.event is not event:
            if event in self._abandoned:
                self._abandoned.discard(event)
                self._ignored_cancelled_event_count += 1
                self._processed_event_count += 1
                return
            raise StaleEventError(
                f"an iteration end (sequence {event.sequence}) came up at "
                f"{now} us that the engine was not waiting for"
            )
        self._iteration = None
        if iteration.stretch is not None:
            self._end_stretch(iteration.stretch, iteration.participants)
        self._ending = iteration
        # A decode that only adds a token (no first or last token, nobody watching, no
        # block to name) is written here; its record waits in `tokens` (request ids,
        # numbered from `first`) until another record must be written.
        waiters = self._token_waiters
        tokens: list[int] = []
        first = 0
        for slot, chunk in iteration.participants:
            if slot.left:
                continue  # cancelled during the iteration: its share is ignored
            if chunk is None:
                request = slot.request
                count = request.generated_token_count + 1
                table = slot.table
                if (
                    count < request.max_output_tokens
                    and request.first_token_time_us is not None
                    and not waiters
                    and (
                        table is None
                        or not request.block_hashes
                        or len(request.block_hashes) <= len(table.named)
                    )
                ):
                    request.generated_token_count = count
                    slot.decoded += 1
                    if not tokens:
                        first = iteration.next_sequence
                    tokens.append(request.request_id)
                    iteration.next_sequence += 1
                    continue
            if tokens:
                self._event_log.extend_tokens(now, first, tokens)
                tokens = []
            if chunk is None:
                self._decoded(slot, now)
            else:
                self._prefilled(slot, chunk, now)
        if tokens:
            self._event_log.extend_tokens(now, first, tokens)
        self._ending = None
        self._iterations.append(iteration.record)
        self._processed_event_count += 1
        if self._slots or len(self._scheduler):
            env = self._env
            if self._boundary_pending or env.event_due_now():
                self._request_boundary()
            else:
                # Nothing else happens at this time: the boundary would be the very next
                # event, so start the next iteration now, numbered as if it had been
                # scheduled (run_next_timestamp() pauses here as after a boundary).
                env.next_sequence()
                self._note_admission_ran()
                self._admit()

    def _prefilled(self, slot: _Slot, chunk: int, now: int) -> None:
        slot.prefilled += chunk
        if slot.table is not None:
            self._publish(slot)
        if slot.prefilled < slot.target:
            return
        request = slot.request
        request.prefill_end_time_us = now
        self._log(now, _PREFILL, request.request_id)
        if request.generated_token_count == request.max_output_tokens:
            self._complete(slot, now)  # a zero-output request
        elif self._hand_off is not None:
            # A prefill replica: the request leaves with its KV cache for a decode one.
            self._leave(slot)
            del self._requests[request.request_id]
            self._hand_off(request, now)
        else:
            request.transition_to(_DECODING, now)
            if self._first_token_at_prefill:
                self._decoded(slot, now)  # the prefill's last step samples a token

    def _decoded(self, slot: _Slot, now: int) -> None:
        request = slot.request
        tokens = request.generated_token_count + 1
        if tokens > request.max_output_tokens:
            raise InvalidTransitionError(
                f"request {request.request_id}: token {tokens} is past max_output_tokens "
                f"{request.max_output_tokens}"
            )
        request.generated_token_count = tokens
        slot.decoded += 1
        if slot.table is not None:
            self._publish(slot)  # hashes past the prompt name the answer's blocks
        if request.first_token_time_us is None:
            request.first_token_time_us = now
        self._log(now, _DECODE, request.request_id)
        if self._token_waiters:
            self._notify_token(request)
        if tokens == request.max_output_tokens:
            self._complete(slot, now)

    def _complete(self, slot: _Slot, now: int) -> None:
        request = slot.request
        request.transition_to(_FINISHED, now)
        self._log(now, _COMPLETE, request.request_id)
        self._leave(slot)
        self._notify_terminal(request)

    def _log(self, now: int, event_type: EventType, request_id: int) -> None:
        # Every record takes its own sequence number, so (timestamp, sequence) stays
        # unique: at an iteration end one of those reserved at launch, at an iteration
        # start (a preemption) a fresh one.
        ending = self._ending
        if ending is not None:
            sequence = ending.next_sequence
            ending.next_sequence += 1
        else:
            sequence = self._env.next_sequence()
        self._event_log.append(now, sequence, event_type, request_id)

    def _publish(self, slot: _Slot) -> None:
        """Name the blocks *slot* has filled (prefilled and decoded tokens) that its
        request's ``block_hashes`` name, so that later requests can share them."""
        assert self._pool is not None and self._kv_cache is not None and slot.table is not None
        hashes = slot.request.block_hashes
        if hashes:
            full = (slot.prefilled + slot.decoded) // self._kv_cache.block_size_tokens
            if full > len(slot.table.named):
                self._pool.publish(slot.table, hashes[:full])

    def _leave(self, slot: _Slot) -> None:
        self._slots.remove(slot)
        del self._slot_of[slot.request.request_id]
        if slot.table is not None:
            assert self._pool is not None
            self._pool.release(slot.table)
        else:
            self._free_blocks += slot.blocks
        slot.blocks = 0

    # ------------------------------------------------------------------ iteration start

    def _admit(self) -> None:
        """Start an iteration at the current time (steps 2 to 4 of the module docs).

        The iteration is planned and priced before any admitted request changes: if the
        backend's answer is refused, the heads the scheduler handed over stay
        ``WAITING`` (or ``PREEMPTED``) with no admission time, as on the single slot.
        Step 2's block reservations and preemptions, and the scheduler's commits, have
        happened by then and stand (the engine fails for good).
        """
        now = self._env.now
        self._reserve_decode_blocks(now)
        admitted = self._choose_heads(now) if len(self._scheduler) else []
        new_slots = [slot for slot, _ in admitted]
        slots = self._slots + new_slots if new_slots else self._slots
        if not slots:
            return
        participants, record = self._plan(now, slots, new_slots)
        for slot, epoch in admitted:
            request = slot.request
            first_admission = request.admit_time_us is None
            if slot.arriving:
                self._incoming.discard(request.request_id)
            else:
                request.transition_to(_PREFILLING, now)
            if slot.table is None:
                self._free_blocks -= slot.blocks
            elif first_admission:
                request.cached_prompt_token_count = slot.prefilled
            if first_admission and self._gate is not None:
                self._gate.left_queue(request)  # it stops counting as queued
            self._slots.append(slot)
            self._slot_of[request.request_id] = slot
            self._admission_log.append(now, request.request_id, epoch)
            if slot.arriving:
                self._start_transfer(slot, now)
        if record is None:
            return  # every request in the batch waits for its KV cache
        if self._decode_steps is not None and not admitted:
            iteration = self._stretch(now, participants, record)
            if iteration is not None:
                self._iteration = iteration
                return
        event = _IterationEvent(self._env, self._on_iteration_end, record.end_us)
        first = self._env.reserve_sequences(self._records_per_participant * len(participants))
        self._iteration = _Iteration(event, participants, record, first)

    # ------------------------------------------------------------------ stretches

    def _stretch(
        self, now: int, participants: list[tuple[_Slot, int | None]], record: IterationRow
    ) -> _Iteration | None:
        """Launch the decode iteration *record* and the ones after it as one stretch.

        A stretch is possible when every request in the batch decodes, nobody can be
        admitted, and nobody else can act before its event: its iterations' launches
        all come before the heap's next event (an arrival, a foreign event, a stop of
        ``env.run(until=...)``), before any request's last token, any watched token
        (:meth:`token`), any KV block that a launch could not reserve (with a prefix
        cache: any new block or name at all), and the engine is not being stepped
        through (:attr:`Environment.stepping`). Its event then ends its last iteration;
        the ones before are written out at once when it comes up
        (:meth:`_end_stretch`), exactly as step by step. Returns the launched
        iteration, or ``None`` (launch one iteration as usual).
        """
        env = self._env
        slots = self._slots
        count = len(slots)
        if (
            env.stepping
            or not env.processing
            or record.prefilling_count
            or record.decoding_count != count
            or len(participants) != count
            or (
                len(self._scheduler)
                and count < self._max_active_requests
                and not self._head_waits_for_memory(now)
            )
        ):
            return None
        first_end = record.end_us
        horizon = env.next_event_time()
        if horizon is not None and horizon <= first_end:
            return None
        # The most iterations before one of them must be the event's; below `least`
        # a stretch is not worth pricing at once, and the loop stops early.
        limit = MAX_STRETCH
        least = MIN_STRETCH
        if horizon is not None and record.end_us > record.start_us:
            # Decode steps cost no less as contexts grow: at most this many iterations
            # launch before the horizon (a guess for other backends: a stretch is
            # only missed if it is wrong).
            limit = (horizon - record.start_us) // (record.end_us - record.start_us)
            if limit < least:
                return None
        waiters = self._token_waiters
        pool = self._pool
        cache = self._kv_cache
        contexts = 0
        for slot in slots:
            request = slot.request
            generated = request.generated_token_count
            left = request.max_output_tokens - generated
            if waiters:
                watched = waiters.get(request.request_id)
                if watched:
                    left = min(left, min(watched) - generated)
            if left < limit:
                if left < least:
                    return None
                limit = left
            contexts += slot.prefilled + slot.decoded
            if pool is not None:
                assert cache is not None and slot.table is not None
                hashes = slot.request.block_hashes
                if hashes and len(hashes) > len(slot.table.named):
                    return None  # a decode step could name a block
        assert self._decode_steps is not None
        ends = stretch_ends(
            self._decode_steps,
            count,
            record.end_us,
            record.end_us - record.start_us,
            contexts,
            limit,
            horizon,
        )
        if ends is None:
            return None
        size = len(ends)
        if horizon is not None:
            size = int(np.searchsorted(ends, horizon))  # ends before the horizon
        size = min(size, limit)
        in_use = np.full(size, record.kv_blocks_in_use, dtype=np.int64)
        cached_blocks = np.full(size, record.kv_blocks_cached, dtype=np.int64)
        if cache is not None and size > 1:
            size, growth = self._stretch_blocks(size)
            in_use = record.kv_blocks_in_use + growth[:size]
            if pool is not None:  # free blocks first, then cached ones by eviction
                free = pool.available_blocks - pool.cached_blocks
                cached_blocks = record.kv_blocks_cached - np.maximum(growth[:size] - free, 0)
        if size < 2:
            return None
        ends = ends[:size]
        per = self._records_per_participant * count
        stride = 2 + per  # the boundary before an iteration, its end event, its records
        first = env.reserve_sequences((size - 1) * stride + 1 + per)
        last = first + (size - 1) * stride
        end = int(ends[-1])
        event = _IterationEvent(env, self._on_iteration_end, end, last)
        final = IterationRow(
            start_us=int(ends[-2]),
            end_us=end,
            prefill_tokens=0,
            prefilling_count=0,
            decoding_count=count,
            abandoned=False,
            batch_size=count,
            kv_blocks_in_use=int(in_use[-1]),
            kv_blocks_cached=int(cached_blocks[-1]),
        )
        stretch = _Stretch(now, ends, first, stride, in_use, cached_blocks)
        return _Iteration(event, participants, final, last + 1, stretch)

    def _stretch_blocks(self, size: int) -> tuple[int, npt.NDArray[np.int64]]:
        """How many of *size* stretch iterations can launch with the free KV blocks, and
        the blocks the batch has taken by each launch (0 for the first, launched now).

        Step by step, each launch reserves the block every decoding request's next
        token needs (step 2); a launch that finds too few free blocks preempts, so the
        stretch must end before it.
        """
        cache = self._kv_cache
        assert cache is not None
        slots = self._slots
        cached = np.fromiter((slot.target + slot.decoded for slot in slots), np.int64, len(slots))
        held = np.fromiter((slot.blocks for slot in slots), np.int64, len(slots))
        steps = np.arange(size, dtype=np.int64)
        block = cache.block_size_tokens
        needed = -(-(cached[:, None] + steps[None, :] + 1) // block)
        growth = np.maximum(needed - held[:, None], 0).sum(axis=0)
        pool = self._pool
        available = self._free_blocks if pool is None else pool.available_blocks
        fits = int(np.searchsorted(growth, available, side="right"))
        return min(size, fits), growth

    def _head_waits_for_memory(self, now: int) -> bool:
        """Whether the scheduler's head does not fit in the KV cache now, so that it
        waits through a stretch, whose launches only take blocks: without a prefix cache
        the free blocks only shrink; with one, so do the available blocks, and an
        evicted block the head would have shared only adds to what it needs. Only for
        the built-in schedulers, whose head does not change with the time asked."""
        cache = self._kv_cache
        if cache is None or type(self._scheduler) not in _TIMELESS_SCHEDULERS:
            return False
        decision = self._scheduler.decide(now)
        if decision is None:
            return False
        request = self._requests.get(decision.request_id)
        if request is None or request.state not in (RequestState.WAITING, _PREEMPTED):
            return False  # step by step tells the scheduler what is wrong
        arriving = request.request_id in self._incoming
        return self._memory_for(request, arriving, self._free_blocks) is None

    def _memory_for(
        self, request: Request, arriving: bool, free_blocks: int
    ) -> tuple[int, int] | None:
        """The KV blocks *request* needs to be admitted (its prompt, any recomputed
        output and its next token) and how many of them the prefix cache holds already,
        or ``None`` when they do not fit (*free_blocks*: the free blocks, without a
        prefix cache). The longest cached prefix leaves at least one token to compute;
        an *arriving* request (handed over) brings its whole prompt's KV cache."""
        cache = self._kv_cache
        assert cache is not None
        target = request.prompt_token_count + request.generated_token_count
        more = 1 if request.generated_token_count < request.max_output_tokens else 0
        blocks = cache.blocks_for(target + more)
        pool = self._pool
        if pool is None:
            return None if blocks > free_blocks else (blocks, 0)
        keys = request.block_hashes or ()
        limit = max(0, target - 1) // cache.block_size_tokens
        matched = 0 if arriving else pool.match(keys, limit)
        if pool.needed(keys, matched) + blocks - matched > pool.available_blocks:
            return None
        return blocks, matched

    def _end_stretch(self, stretch: _Stretch, participants: list[tuple[_Slot, int | None]]) -> None:
        """Write out the stretch's iterations before its event's (all but the last):
        every decoding request's tokens, their records and the iterations' rows, as
        step by step; the KV blocks their launches reserved."""
        ends = stretch.ends[:-1]
        done = len(ends)
        slots = [slot for slot, _ in participants]
        count = len(slots)
        firsts = stretch.first_sequence + 1 + stretch.stride * np.arange(done, dtype=np.int64)
        times = array("q")
        times.frombytes(ends.tobytes())
        numbers = array("q")
        numbers.frombytes(firsts.tobytes())
        self._event_log.add_tokens(times, numbers, [slot.request.request_id for slot in slots])
        starts = np.empty(done, dtype=np.int64)
        starts[0] = stretch.start_us
        starts[1:] = ends[:-1]
        counts = np.full(done, count, dtype=np.int64)
        zeros = np.zeros(done, dtype=np.int64)
        self._iterations.extend(
            (
                starts,
                ends,
                zeros,
                zeros,
                counts,
                zeros.astype(np.int8),
                counts,
                stretch.kv_blocks_in_use[:-1],
                stretch.kv_blocks_cached[:-1],
            )
        )
        first_token = int(ends[0])
        cache = self._kv_cache
        pool = self._pool
        for slot in slots:
            request = slot.request
            request.generated_token_count += done
            slot.decoded += done
            if request.first_token_time_us is None:
                request.first_token_time_us = first_token
            if cache is not None:
                # The reservations of the launches up to the event's iteration (step 2).
                growth = cache.blocks_for(slot.target + slot.decoded + 1) - slot.blocks
                if growth > 0:
                    slot.blocks += growth
                    if pool is None:
                        self._free_blocks -= growth
                    else:
                        assert slot.table is not None
                        pool.grow(slot.table, growth)
        self._processed_event_count += done

    def _reserve_decode_blocks(self, now: int) -> None:
        cache = self._kv_cache
        if cache is None:
            return
        block = cache.block_size_tokens
        for slot in list(self._slots):
            if slot.left or slot.request.state is not _DECODING:
                continue
            # cache.blocks_for(...), written out: this runs for every slot every iteration.
            need = -(-(slot.target + slot.decoded + 1) // block) - slot.blocks
            if need <= 0:
                continue
            rid = slot.request.request_id
            pool = self._pool
            while need > 0 and self._slot_of.get(rid) is slot:
                if pool is not None and slot.table is not None and pool.available_blocks > 0:
                    pool.grow(slot.table)
                    slot.blocks += 1
                    need -= 1
                elif pool is None and self._free_blocks > 0:
                    self._free_blocks -= 1
                    slot.blocks += 1
                    need -= 1
                else:
                    self._preempt(self._slots[-1], now)

    def _preempt(self, slot: _Slot, now: int) -> None:
        request = slot.request
        if len(self._slots) == 1:
            raise InvalidTransitionError(
                f"request {request.request_id} is alone in the batch and still does not fit "
                "in the KV cache"
            )
        request.transition_to(_PREEMPTED, now)
        self._leave(slot)
        if slot.arriving:
            self._abort_transfer(slot, now)  # it recomputes its prompt when admitted again
        self._log(now, _PREEMPT, request.request_id)
        self._preemption_count += 1
        self._scheduler.enqueue(queued_request(request))

    def _choose_heads(self, now: int) -> list[tuple[_Slot, int]]:
        """Take the scheduler's heads while a slot and memory allow (step 3).

        Returns each new slot with its decision's epoch, in admission order. The
        scheduler has handed them over; the requests themselves change only once the
        iteration is priced (see :meth:`_admit`).
        """
        scheduler = self._scheduler
        cache = self._kv_cache
        cap = self._max_batch_tokens if self._policy.token_cap_at_admission else None
        chosen: list[tuple[_Slot, int]] = []
        free_slots = self._max_active_requests - len(self._slots)
        free_blocks = self._free_blocks
        new_tokens = 0
        while len(chosen) < free_slots:
            decision = scheduler.decide(now)
            if decision is None:
                break
            request = self._proposed(decision)
            target = request.prompt_token_count + request.generated_token_count
            arriving = bool(self._incoming) and request.request_id in self._incoming
            if cap is not None and chosen and not arriving and new_tokens + target > cap:
                break  # the head would pass the token cap: it waits, nobody overtakes it
            blocks = 0
            table = None
            cached = 0
            if cache is not None:
                need = self._memory_for(request, arriving, free_blocks)
                if need is None:
                    break  # the head does not fit in memory: it waits
                blocks, matched = need
                pool = self._pool
                if pool is not None:
                    # Held at once: if pricing the iteration fails, the engine has failed.
                    table = pool.acquire(request.block_hashes or (), matched, blocks - matched)
                    cached = matched * cache.block_size_tokens
            self._commit(decision)
            free_blocks -= blocks
            slot = _Slot(request, target, blocks, table)
            if arriving:
                slot.prefilled = target
                slot.arriving = True
            else:
                slot.prefilled = cached
                new_tokens += target - cached
            chosen.append((slot, decision.epoch))
        return chosen

    def _plan(
        self, now: int, slots: list[_Slot], new_slots: list[_Slot]
    ) -> tuple[list[tuple[_Slot, int | None]], IterationRow | None]:
        """Who takes part in the iteration launched now, and its priced record (step 4).

        *slots* is the batch in admission order, ending with *new_slots*, the requests
        admitted now (still ``WAITING`` or ``PREEMPTED``). Nothing changes here: every
        error is raised before the admissions take effect. Requests whose KV cache is
        still on its way take no part; the record is ``None`` when nobody does.
        """
        participants, first_decoders, prefill_tokens, prefilling, decoding = self._policy(
            slots, new_slots, self._max_batch_tokens
        )
        if not participants:
            return participants, None
        if self._first_token_at_prefill:
            # A request whose prefill ends here also takes its first token here.
            first_decoders = first_decoders + [
                slot
                for slot, chunk in participants
                if chunk is not None
                and slot.prefilled + chunk >= slot.target
                and slot.request.generated_token_count < slot.request.max_output_tokens
            ]
        duration = self._price(now, participants, prefill_tokens, prefilling, decoding)
        end = now + duration
        if end > MAX_TIME_US:
            raise time_overflow(end, f"the iteration from {now} us lasting {duration} us")
        if first_decoders and self._decode_floor_us:
            self._check_output_fits(first_decoders, end)
        record = IterationRow(
            start_us=now,
            end_us=end,
            prefill_tokens=prefill_tokens,
            prefilling_count=prefilling,
            decoding_count=decoding,
            abandoned=False,
            batch_size=len(slots),
            kv_blocks_in_use=self._blocks_in_use(new_slots),
            kv_blocks_cached=0 if self._pool is None else self._pool.cached_blocks,
        )
        return participants, record

    def _blocks_in_use(self, new_slots: list[_Slot]) -> int:
        """The KV blocks the batch holds at a launch, *new_slots* (admitted now, whose
        blocks the free count does not show yet) included."""
        cache = self._kv_cache
        if cache is None:
            return 0
        if self._pool is not None:
            return self._pool.used_blocks
        held = cache.total_blocks - self._free_blocks
        for slot in new_slots:
            held += slot.blocks
        return held

    def _price(
        self,
        now: int,
        participants: list[tuple[_Slot, int | None]],
        prefill_tokens: int,
        prefilling: int,
        decoding: int,
    ) -> int:
        """The iteration's duration from the backend, every part checked before use.

        A backend with ``step_us`` gets every participant, in admission order: a
        prefilling one as ``(chunk, tokens already prefilled)``, a decoding one as its
        context (tokens prefilled plus tokens decoded since its admission).
        """

        def subject() -> str:  # for an error message only: built when one is raised
            ids = [slot.request.request_id for slot, _ in participants]
            who = f"request {ids[0]}" if len(ids) == 1 else f"requests {', '.join(map(str, ids))}"
            return f"the iteration at {now} us ({who})"

        if self._price_step is not None:
            prefills: list[tuple[int, int]] = []
            decodes: list[int] = []
            for slot, chunk in participants:
                if chunk is None:
                    decodes.append(slot.prefilled + slot.decoded)
                else:
                    prefills.append((chunk, slot.prefilled))
            cost = self._price_step(prefills, decodes)
            if type(cost) is int and cost >= 0:
                return cost
            return check_duration_us(cost, "step_us", subject)
        if self._iteration_us is None:
            return iteration_cost_us(
                self._backend, prefill_tokens, prefilling, decoding, subject=subject
            )
        cost = self._iteration_us(prefill_tokens, prefilling, decoding)
        if type(cost) is int and cost >= 0:
            return cost
        return check_duration_us(cost, "iteration_us", subject)

    def _check_output_fits(self, first_decoders: list[_Slot], end: int) -> None:
        """Refuse a request whose output limit must end past 2**63 - 1.

        Checked when a request decodes for the first time since its admission (with
        ``first_token_at_prefill``, also in the iteration that ends its prefill), with
        :attr:`_decode_floor_us`, the least any later iteration it decodes in can cost
        (so only with :class:`SimulatedBackend`'s own decode price). Without this a
        request with an absurd output limit would be stepped through one iteration at a
        time until the clock overflowed, which no run lives to see.
        """
        floor = self._decode_floor_us
        for slot in first_decoders:
            request = slot.request
            left = request.max_output_tokens - request.generated_token_count - 1
            if left > (MAX_TIME_US - end) // floor:
                raise OverflowError(
                    f"request {request.request_id}: {counted(left, 'more output token')} "
                    "(max_output_tokens "
                    f"{request.max_output_tokens}) at no less than {floor} us per iteration "
                    f"({self._decode_floor_what}) would end past the "
                    f"64-bit limit 2**63 - 1 (its first decode iteration ends at {end} us)"
                )

    # ------------------------------------------------------------------ disaggregation

    def _accept_handed_over(self, request: Request) -> None:
        """Queue *request*, prefilled on another replica, for its KV cache's transfer.

        It keeps its state (``PREFILLING``) and its times; admission reserves the blocks
        of its prompt and next token, then the transfer starts (:class:`KvLink`).
        """
        self._check_alive()
        rid = request.request_id
        if rid in self._requests:
            raise ValueError(f"request {rid} was already submitted to this engine")
        self._check_admissible(request)
        self._requests[rid] = request
        self._incoming.add(rid)
        self._scheduler.enqueue(queued_request(request))
        if self._is_idle():
            self._fill_free_slot()

    def _proposed(self, decision: AdmissionDecision) -> Request:
        rid = decision.request_id
        if self._incoming and rid in self._incoming:
            return self._requests[rid]  # handed over: PREFILLING until its KV cache lands
        return super()._proposed(decision)

    def _start_transfer(self, slot: _Slot, now: int) -> None:
        assert self._link is not None
        duration = check_duration_us(
            self._link.start(slot.request, now),
            "the KV transfer",
            lambda: f"request {slot.request.request_id}'s transfer at {now} us",
        )
        end = now + duration
        if end > MAX_TIME_US:
            raise time_overflow(end, f"request {slot.request.request_id}'s KV transfer")
        _TransferEnd(self._env, self._on_transfer_end, end, slot)

    @engine_work
    def _on_transfer_end(self, event: _TransferEnd) -> None:
        slot = event.slot
        request = slot.request
        if not slot.arriving or self._slot_of.get(request.request_id) is not slot:
            return  # it left (cancelled or preempted) before its KV cache arrived
        slot.arriving = False
        now = self._env.now
        assert self._link is not None
        self._link.finish(request, now)
        if slot.table is not None:
            self._publish(slot)
        request.transition_to(_DECODING, now)
        if self._iteration is None:
            self._request_boundary()

    def _abort_transfer(self, slot: _Slot, now: int) -> None:
        slot.arriving = False
        assert self._link is not None
        self._link.abort(slot.request, now)

    # ------------------------------------------------------------------ cancellation

    def _cancel_active(self, request: Request, now: int) -> None:
        rid = request.request_id
        slot = self._slot_of.get(rid)
        if slot is None:
            if rid in self._incoming:  # handed over, still queued for its transfer
                self._incoming.discard(rid)
                self._scheduler.remove(rid)
                request.transition_to(_CANCELLED, now)
                return
            raise InvalidTransitionError(
                f"request {request.request_id} is {request.state.name} but holds no slot"
            )
        request.transition_to(_CANCELLED, now)
        slot.left = True
        self._leave(slot)
        if slot.arriving:
            self._abort_transfer(slot, now)
        iteration = self._iteration
        if iteration is None:
            # Between an iteration's end and the boundary that admits, or (a decode
            # replica) with every slot waiting for its KV cache: fill the freed slot.
            if len(self._scheduler):
                self._admit_now_or_at_boundary()
            return
        if self._slots:
            return
        # Nobody holds a slot any more: abandon the iteration; its end will be ignored.
        self._iteration = None
        self._abandoned.add(iteration.event)
        record = iteration.record
        self._iterations.append(record._replace(abandoned=True, kv_blocks_cached=0))
        if len(self._scheduler):
            self._admit_now_or_at_boundary()
