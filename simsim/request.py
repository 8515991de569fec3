"""Requests and their lifecycle: the states, the legal transitions, the timestamps.

A :class:`Request` is created by the user and handed to an engine, which from then on
is its only writer. Every state change goes through :meth:`Request.transition_to`,
which checks the transition table below before touching anything.

==========================  ==========  =============================================
from                        to          when
==========================  ==========  =============================================
WAITING                     PREFILLING  admitted; sets ``admit_time_us``
PREFILLING                  DECODING    prefill done and ``max_output_tokens > 0``
PREFILLING                  FINISHED    a zero-output request completes
DECODING                    FINISHED    the last decode step completes
WAITING/PREFILLING/DECODING CANCELLED   cancelled; ``finish_time_us`` = now
PREFILLING/DECODING         PREEMPTED   evicted by the batching server
PREEMPTED                   PREFILLING  readmitted by the batching server
PREEMPTED                   CANCELLED   cancelled while waiting to be readmitted
==========================  ==========  =============================================
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from simsim.clock import MAX_TIME_US, check_count, check_time_us
from simsim.errors import InvalidTransitionError
from simsim.wording import counted

__all__ = ["LEGAL_TRANSITIONS", "TERMINAL_STATES", "Request", "RequestState"]


class RequestState(enum.Enum):
    """Where a request is in its life."""

    WAITING = enum.auto()
    """Submitted; not yet arrived, or arrived and queued for admission."""
    PREFILLING = enum.auto()
    """Admitted; its prompt is being processed."""
    DECODING = enum.auto()
    """Generating output tokens, one per decode step."""
    FINISHED = enum.auto()
    """Completed normally (terminal)."""
    CANCELLED = enum.auto()
    """Cancelled explicitly (terminal)."""
    PREEMPTED = enum.auto()
    """Evicted by the batching server and queued again (never used by the single slot)."""

    # Members are singletons: hash by identity in C instead of Enum's Python-level
    # hash of the name, which showed up in profiles of transition checks.
    __hash__ = object.__hash__


TERMINAL_STATES: Final = frozenset({RequestState.FINISHED, RequestState.CANCELLED})

_W, _P, _D = RequestState.WAITING, RequestState.PREFILLING, RequestState.DECODING
_F, _C, _X = RequestState.FINISHED, RequestState.CANCELLED, RequestState.PREEMPTED

LEGAL_TRANSITIONS: Final = frozenset(
    {
        (_W, _P),
        (_P, _D),
        (_P, _F),
        (_D, _F),
        (_W, _C),
        (_P, _C),
        (_D, _C),
        (_P, _X),
        (_D, _X),
        (_X, _P),
        (_X, _C),
    }
)
"""Every ``(from, to)`` pair a request may take; any other pair is refused."""

_NEXT_STATES: Final = {
    state: frozenset(to for (from_, to) in LEGAL_TRANSITIONS if from_ is state)
    for state in RequestState
}


def _hashes(values: Iterable[Hashable], request_id: object) -> tuple[Hashable, ...]:
    """*values* as a tuple of hashable keys (``TypeError`` naming the request otherwise)."""
    if isinstance(values, str | bytes | set | frozenset | dict) or not hasattr(values, "__iter__"):
        raise TypeError(
            f"request {request_id}: block_hashes must be a sequence of hashes, one per full "
            f"KV block in order, got {type(values).__name__} {values!r}"
        )
    keys = tuple(values)
    try:
        distinct = len(set(keys))
    except TypeError as error:
        raise TypeError(
            f"request {request_id}: block_hashes must be hashable values ({error})"
        ) from None
    if distinct != len(keys):
        raise ValueError(
            f"request {request_id}: block_hashes repeats a hash; chained hashes name "
            "different blocks, so each appears once"
        )
    return keys


@dataclass(slots=True, eq=True)
class Request:
    """One inference request: its size, its lifecycle state and its timestamps.

    Create it with the first four fields (and, for a batching server with a prefix
    cache, the keyword ``block_hashes``: one hash per full KV block of the prompt (and,
    optionally, of the output), chained so that equal hashes at position *i* mean equal
    tokens up to that block);
    the rest describe its progress and start pristine (``WAITING``, no tokens, no
    timestamps), which is what an engine's ``submit`` requires. All times are ``int``
    microseconds; a timestamp that has not happened is ``None``, never a sentinel
    number.
    """

    request_id: int
    arrival_time_us: int
    prompt_token_count: int
    max_output_tokens: int
    state: RequestState = RequestState.WAITING
    generated_token_count: int = 0
    admit_time_us: int | None = None
    prefill_end_time_us: int | None = None
    first_token_time_us: int | None = None
    finish_time_us: int | None = None
    # Prefix caching (optional): the chain of hashes of the prompt's full KV blocks, and
    # how many prompt tokens the batching server's cache served at the first admission.
    block_hashes: tuple[Hashable, ...] | None = field(default=None, repr=False)
    cached_prompt_token_count: int = field(default=0, repr=False)
    # Metadata schedulers may read (optional; absent, nothing changes).
    request_class: str | None = field(default=None, repr=False)
    tenant: str | None = field(default=None, repr=False)
    priority: int = field(default=0, repr=False)
    deadline_us: int | None = field(default=None, repr=False)
    tags: Mapping[str, Any] | None = field(default=None, repr=False)
    # Why an admission control turned it away at its arrival (it is then CANCELLED).
    rejection: str | None = field(default=None, repr=False)
    # The engine's one outstanding lifecycle event for this request (not public state).
    _pending: Any = field(default=None, init=False, repr=False, compare=False)
    # The engine's event object for this request, reused from step to step.
    _event: Any = field(default=None, init=False, repr=False, compare=False)

    # Written out instead of generated (dataclass keeps a class's own __init__) so that
    # a new request of plain ints is checked on the arguments, in one expression,
    # without a __post_init__ call: submitters create one Request per request.
    def __init__(
        self,
        request_id: int,
        arrival_time_us: int,
        prompt_token_count: int,
        max_output_tokens: int,
        state: RequestState = RequestState.WAITING,
        generated_token_count: int = 0,
        admit_time_us: int | None = None,
        prefill_end_time_us: int | None = None,
        first_token_time_us: int | None = None,
        finish_time_us: int | None = None,
        *,
        block_hashes: Iterable[Hashable] | None = None,
        request_class: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
        deadline_us: int | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        self.request_id = request_id
        self.arrival_time_us = arrival_time_us
        self.prompt_token_count = prompt_token_count
        self.max_output_tokens = max_output_tokens
        self.state = state
        self.generated_token_count = generated_token_count
        self.admit_time_us = admit_time_us
        self.prefill_end_time_us = prefill_end_time_us
        self.first_token_time_us = first_token_time_us
        self.finish_time_us = finish_time_us
        self.block_hashes = None if block_hashes is None else _hashes(block_hashes, request_id)
        self.cached_prompt_token_count = 0
        self.request_class = request_class
        self.tenant = tenant
        self.priority = priority
        self.deadline_us = deadline_us
        self.tags = tags
        self.rejection = None
        self._pending = None
        self._event = None
        if (
            request_class is not None
            or tenant is not None
            or priority != 0
            or type(priority) is not int
            or deadline_us is not None
            or tags is not None
        ):
            self._check_metadata()
        if (
            type(request_id) is type(arrival_time_us) is int
            and type(prompt_token_count) is type(max_output_tokens) is int
        ):
            # Ints are all in 0 .. 2**63 - 1 exactly when their bitwise OR is (a negative
            # one makes the OR negative, one past the range makes it past the range).
            bits = request_id | arrival_time_us | prompt_token_count | max_output_tokens
        else:
            bits = -1
        if not (
            0 <= bits <= MAX_TIME_US
            and state is _W
            and type(generated_token_count) is int
            and generated_token_count == 0
            and admit_time_us is prefill_end_time_us is first_token_time_us is None
            and finish_time_us is None
        ):
            self._validate_fields()

    def __post_init__(self) -> None:
        # Only a dataclass subclass's generated __init__ calls this; Request's own
        # __init__ checks its arguments itself.
        self.validate()

    def validate(self) -> None:
        """Check every field's type and range; normalise NumPy integers to ``int``.

        Raises ``TypeError`` or ``ValueError`` naming the field and the value.
        """
        if self.is_fresh():
            return
        self._validate_fields()

    def is_fresh(self) -> bool:
        """``True`` for a pristine request whose fields are all plain in-range ints.

        The common case, checked in one expression; :meth:`validate` does the full work
        only when this is ``False``.
        """
        rid = self.request_id
        arrival = self.arrival_time_us
        prompt = self.prompt_token_count
        limit = self.max_output_tokens
        tokens = self.generated_token_count
        return (
            type(rid) is type(arrival) is int
            and type(prompt) is type(limit) is int
            and 0 <= rid | arrival | prompt | limit <= MAX_TIME_US
            and self.state is _W
            and type(tokens) is int
            and tokens == 0
            and self.admit_time_us is self.prefill_end_time_us is None
            and self.first_token_time_us is self.finish_time_us is None
        )

    def _validate_fields(self) -> None:
        self.request_id = check_count(self.request_id, "request_id")
        self.arrival_time_us = check_time_us(self.arrival_time_us, "arrival_time_us")
        self.prompt_token_count = check_count(self.prompt_token_count, "prompt_token_count")
        self.max_output_tokens = check_count(self.max_output_tokens, "max_output_tokens")
        if not isinstance(self.state, RequestState):
            raise TypeError(
                f"request {self.request_id}: state must be a RequestState, got {self.state!r}"
            )
        self.generated_token_count = check_count(
            self.generated_token_count, "generated_token_count"
        )
        for name in ("admit_time_us", "prefill_end_time_us", "first_token_time_us"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, check_time_us(value, name))
        if self.finish_time_us is not None:
            self.finish_time_us = check_time_us(self.finish_time_us, "finish_time_us")

    @property
    def has_metadata(self) -> bool:
        """``True`` when any of ``request_class``, ``tenant``, ``priority``,
        ``deadline_us`` or ``tags`` is set."""
        return (
            self.request_class is not None
            or self.tenant is not None
            or self.priority != 0
            or self.deadline_us is not None
            or bool(self.tags)
        )

    def _check_metadata(self) -> None:
        rid = self.request_id
        for name in ("request_class", "tenant"):
            value = getattr(self, name)
            if value is not None and (type(value) is not str or not value):
                raise TypeError(
                    f"request {rid}: {name} must be a non-empty str or None, got {value!r}"
                )
        priority = self.priority
        if isinstance(priority, bool) or not hasattr(type(priority), "__index__"):
            raise TypeError(f"request {rid}: priority must be an int, got {priority!r}")
        self.priority = int(operator.index(priority))
        if self.deadline_us is not None:
            try:
                self.deadline_us = check_time_us(self.deadline_us, "deadline_us")
            except (TypeError, ValueError) as error:
                raise type(error)(f"request {rid}: {error}") from None
        tags = self.tags
        if tags is not None:
            if not isinstance(tags, Mapping) or not all(type(k) is str and k for k in tags):
                raise TypeError(
                    f"request {rid}: tags must be a mapping with non-empty str keys, got {tags!r}"
                )
            self.tags = MappingProxyType(dict(tags))

    @property
    def is_pristine(self) -> bool:
        """``True`` for a request that has never been touched by an engine."""
        return (
            self.state is RequestState.WAITING
            and self.generated_token_count == 0
            and self.admit_time_us is None
            and self.prefill_end_time_us is None
            and self.first_token_time_us is None
            and self.finish_time_us is None
        )

    @property
    def is_terminal(self) -> bool:
        """``True`` once the request is ``FINISHED`` or ``CANCELLED``."""
        return self.state in TERMINAL_STATES

    def transition_to(self, new_state: RequestState, now_us: int) -> None:
        """Move to *new_state* at time *now_us*, or raise without changing anything.

        Sets the timestamp the transition defines: ``admit_time_us`` on the first
        admission, ``finish_time_us`` on ``FINISHED`` and ``CANCELLED``. Engines call
        this; a user normally never does.

        Raises :class:`InvalidTransitionError` for a pair not in
        :data:`LEGAL_TRANSITIONS` (including any move out of a terminal state).
        """
        if type(now_us) is not int or not 0 <= now_us <= MAX_TIME_US:
            now_us = check_time_us(now_us, "now_us")
        old_state = self.state
        if new_state not in _NEXT_STATES[old_state]:
            raise InvalidTransitionError(
                f"request {self.request_id}: illegal transition "
                f"{old_state.name} -> {getattr(new_state, 'name', new_state)}"
            )
        if new_state is _D and self.max_output_tokens == 0:
            raise InvalidTransitionError(
                f"request {self.request_id}: PREFILLING -> DECODING needs max_output_tokens > 0"
            )
        if new_state is _F and self.generated_token_count != self.max_output_tokens:
            raise InvalidTransitionError(
                f"request {self.request_id}: {old_state.name} -> FINISHED needs "
                f"{'' if self.max_output_tokens == 1 else 'all '}"
                f"{counted(self.max_output_tokens, 'output token')}, "
                f"it has {self.generated_token_count}"
            )
        self.state = new_state
        if new_state is _P:
            if self.admit_time_us is None:
                self.admit_time_us = now_us
        elif new_state is _F or new_state is _C:
            self.finish_time_us = now_us
