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
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final

from simsim.clock import MAX_TIME_US, check_count, check_time_us
from simsim.errors import InvalidTransitionError
from simsim.wording import counted

__all__ = [
    "LEGAL_TRANSITIONS",
    "METADATA_COLUMNS",
    "METADATA_FIELDS",
    "SPEC_FIELDS",
    "TERMINAL_STATES",
    "Request",
    "RequestSpec",
    "RequestState",
    "request_spec",
    "submitted_request",
]


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


def _checked_metadata(
    request_id: object,
    request_class: object,
    tenant: object,
    priority: object,
    deadline_us: object,
    tags: object,
) -> tuple[str | None, str | None, int, int | None, Mapping[str, Any] | None]:
    """The metadata fields checked and normalised (``priority`` an ``int``, ``tags`` a
    read-only mapping); ``TypeError``/``ValueError`` naming the request and the field."""
    for name, value in (("request_class", request_class), ("tenant", tenant)):
        if value is not None and (type(value) is not str or not value):
            raise TypeError(
                f"request {request_id}: {name} must be a non-empty str or None, got {value!r}"
            )
    if isinstance(priority, bool) or not hasattr(type(priority), "__index__"):
        raise TypeError(f"request {request_id}: priority must be an int, got {priority!r}")
    checked_priority = int(operator.index(priority))  # type: ignore[arg-type]
    if deadline_us is not None:
        try:
            deadline_us = check_time_us(deadline_us, "deadline_us")
        except (TypeError, ValueError) as error:
            raise type(error)(f"request {request_id}: {error}") from None
    if tags is not None:
        if not isinstance(tags, Mapping) or not all(type(k) is str and k for k in tags):
            raise TypeError(
                f"request {request_id}: tags must be a mapping with non-empty str keys, "
                f"got {tags!r}"
            )
        tags = MappingProxyType(dict(tags))
    return (
        request_class,
        tenant,
        checked_priority,
        deadline_us,  # type: ignore[return-value]
        tags,
    )


_SCHEDULING: Final = MappingProxyType({"scheduling": True})
"""Field metadata marking what a scheduler may order by besides the sizes."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as a value: its identity, sizes, block hashes and metadata, checked once.

    Traces and workloads make these; a scheduler sees nothing else
    (:class:`~simsim.scheduler.QueuedRequest` is this type); an engine makes its own
    mutable :class:`Request` from one at ``submit`` (:func:`submitted_request`) without
    checking it again. Every field is also a :class:`Request` attribute and constructor
    argument of the same name, so this class is the one list of a request's fields
    (:data:`SPEC_FIELDS`). The four sizes are positional; the rest are keyword-only,
    with defaults that change nothing. Bad values raise ``TypeError``/``ValueError``
    naming the request and the field, as :class:`Request` does.
    """

    request_id: int
    arrival_time_us: int
    prompt_token_count: int
    max_output_tokens: int
    block_hashes: tuple[Hashable, ...] | None = None
    """The chain of hashes of the prompt's full KV blocks (prefix caching), or ``None``."""
    request_class: str | None = field(default=None, metadata={**_SCHEDULING, "column": "string"})
    tenant: str | None = field(default=None, metadata={**_SCHEDULING, "column": "string"})
    priority: int = field(default=0, metadata={**_SCHEDULING, "column": "int64"})
    deadline_us: int | None = field(default=None, metadata={**_SCHEDULING, "column": "Int64"})
    tags: Mapping[str, Any] | None = field(default=None, hash=False, metadata=_SCHEDULING)

    # Written out (dataclass keeps a class's own __init__): one is made per request, and
    # a frozen dataclass's generated __init__ is slow (object.__setattr__ per field).
    # Checked in Request's order (hashes, metadata, sizes), with Request's messages.
    def __init__(
        self,
        request_id: int,
        arrival_time_us: int,
        prompt_token_count: int,
        max_output_tokens: int,
        *,
        block_hashes: Iterable[Hashable] | None = None,
        request_class: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
        deadline_us: int | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        if block_hashes is not None:
            block_hashes = _hashes(block_hashes, request_id)
        if (
            request_class is not None
            or tenant is not None
            or priority != 0
            or type(priority) is not int
            or deadline_us is not None
            or tags is not None
        ):
            request_class, tenant, priority, deadline_us, tags = _checked_metadata(
                request_id, request_class, tenant, priority, deadline_us, tags
            )
        if (
            type(request_id) is type(arrival_time_us) is int
            and type(prompt_token_count) is type(max_output_tokens) is int
        ):
            # All in 0 .. 2**63 - 1 exactly when their bitwise OR is.
            bits = request_id | arrival_time_us | prompt_token_count | max_output_tokens
        else:
            bits = -1
        if not 0 <= bits <= MAX_TIME_US:
            request_id = check_count(request_id, "request_id")
            arrival_time_us = check_time_us(arrival_time_us, "arrival_time_us")
            prompt_token_count = check_count(prompt_token_count, "prompt_token_count")
            max_output_tokens = check_count(max_output_tokens, "max_output_tokens")
        _set_request_id(self, request_id)
        _set_arrival_time_us(self, arrival_time_us)
        _set_prompt_token_count(self, prompt_token_count)
        _set_max_output_tokens(self, max_output_tokens)
        _set_block_hashes(self, block_hashes)
        _set_request_class(self, request_class)
        _set_tenant(self, tenant)
        _set_priority(self, priority)
        _set_deadline_us(self, deadline_us)
        _set_tags(self, tags)

    def __post_init__(self) -> None:
        # Only a dataclass subclass's generated __init__ calls this: the same checks.
        checked = RequestSpec(*_spec_values(self)[:4], **_extra_arguments(_extras(self)))
        for name, value in zip(SPEC_FIELDS, _spec_values(checked), strict=True):
            object.__setattr__(self, name, value)

    @property
    def has_metadata(self) -> bool:
        """``True`` when any of :data:`METADATA_FIELDS` is set (see
        :attr:`Request.has_metadata`)."""
        return _has_metadata(self)

    @classmethod
    def of(cls, request: Request) -> RequestSpec:
        """The spec of an existing request: :func:`request_spec`."""
        return request_spec(request)

    def to_request(self) -> Request:
        """A new pristine :class:`Request` of this spec: :func:`submitted_request`."""
        return submitted_request(self)


# The slots' own setters: the fastest way for a frozen record's __init__ to fill it.
_set_request_id = vars(RequestSpec)["request_id"].__set__
_set_arrival_time_us = vars(RequestSpec)["arrival_time_us"].__set__
_set_prompt_token_count = vars(RequestSpec)["prompt_token_count"].__set__
_set_max_output_tokens = vars(RequestSpec)["max_output_tokens"].__set__
_set_block_hashes = vars(RequestSpec)["block_hashes"].__set__
_set_request_class = vars(RequestSpec)["request_class"].__set__
_set_tenant = vars(RequestSpec)["tenant"].__set__
_set_priority = vars(RequestSpec)["priority"].__set__
_set_deadline_us = vars(RequestSpec)["deadline_us"].__set__
_set_tags = vars(RequestSpec)["tags"].__set__

SPEC_FIELDS: Final = tuple(spec_field.name for spec_field in fields(RequestSpec))
"""Every field of a :class:`RequestSpec`, in order; each is also a :class:`Request`
attribute and constructor argument (the four sizes positional, the rest keyword)."""

METADATA_FIELDS: Final = tuple(
    spec_field.name for spec_field in fields(RequestSpec) if spec_field.metadata.get("scheduling")
)
"""The metadata fields a scheduler may order by besides the sizes (class, tenant,
priority, deadline, tags); absent, each is its default and nothing changes."""

METADATA_COLUMNS: Final = {
    spec_field.name: spec_field.metadata["column"]
    for spec_field in fields(RequestSpec)
    if "column" in spec_field.metadata
}
"""The requests frame's metadata columns and their pandas dtypes, in field order (a
field's ``column`` metadata); ``tags`` become one ``tag_<key>`` column per key instead."""

_EXTRA_FIELDS: Final = SPEC_FIELDS[4:]
_spec_values = operator.attrgetter(*SPEC_FIELDS)
_extras = operator.attrgetter(*_EXTRA_FIELDS)
_DEFAULT_EXTRAS: Final = tuple(spec_field.default for spec_field in fields(RequestSpec)[4:])
_new_spec = object.__new__
_DEFAULT_SETTERS: Final = tuple(
    (vars(RequestSpec)[name].__set__, default)
    for name, default in zip(_EXTRA_FIELDS, _DEFAULT_EXTRAS, strict=True)
)
_METADATA_DEFAULTS: Final = tuple(
    (spec_field.name, spec_field.default)
    for spec_field in fields(RequestSpec)
    if spec_field.name in METADATA_FIELDS
)


def _extra_arguments(extras: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(_EXTRA_FIELDS, extras, strict=True))


def _has_metadata(item: RequestSpec | Request) -> bool:
    """Whether any metadata field of *item* differs from its default (empty tags count as
    none)."""
    for name, default in _METADATA_DEFAULTS:
        value = getattr(item, name)
        if default is None:
            if value is not None and not (isinstance(value, Mapping) and not value):
                return True
        elif value != default:
            return True
    return False


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
    # The request's spec, made once: given at submit, or at its first enqueue.
    _spec: RequestSpec | None = field(default=None, init=False, repr=False, compare=False)

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
        self._spec = None
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
        """``True`` when any of :data:`METADATA_FIELDS` (``request_class``, ``tenant``,
        ``priority``, ``deadline_us``, ``tags``) is set: not its default, and tags not
        empty."""
        return _has_metadata(self)

    def _check_metadata(self) -> None:
        (
            self.request_class,
            self.tenant,
            self.priority,
            self.deadline_us,
            self.tags,
        ) = _checked_metadata(
            self.request_id,
            self.request_class,
            self.tenant,
            self.priority,
            self.deadline_us,
            self.tags,
        )

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


def request_spec(request: Request) -> RequestSpec:
    """The :class:`RequestSpec` of *request*: what a scheduler may know of it.

    Made once and kept: a request submitted as a spec keeps that spec, and one submitted
    as a :class:`Request` gets its spec at its first enqueue (engines call this at each
    arrival and at each re-queueing after a preemption).
    """
    spec = request._spec
    if spec is None:
        extras = _extras(request)
        if extras == _DEFAULT_EXTRAS:
            # The request's sizes were checked when it was made: set them unchecked (a
            # third cheaper than RequestSpec(...), once per arrival on every engine).
            spec = _new_spec(RequestSpec)
            _set_request_id(spec, request.request_id)
            _set_arrival_time_us(spec, request.arrival_time_us)
            _set_prompt_token_count(spec, request.prompt_token_count)
            _set_max_output_tokens(spec, request.max_output_tokens)
            for set_default, default in _DEFAULT_SETTERS:
                set_default(spec, default)
        else:
            spec = RequestSpec(
                request.request_id,
                request.arrival_time_us,
                request.prompt_token_count,
                request.max_output_tokens,
                **_extra_arguments(extras),
            )
        request._spec = spec
    return spec


def submitted_request(item: Request | RequestSpec) -> Request:
    """What an engine's ``submit`` works on: a new pristine :class:`Request` made from a
    :class:`RequestSpec` (which is not checked again), or *item* itself otherwise.

    The one place a spec becomes a request; ``submit`` checks whatever is not a spec as
    before (a :class:`Request` must be pristine; anything else is a ``TypeError``).
    """
    if not isinstance(item, RequestSpec):
        return item
    request = Request(
        item.request_id, item.arrival_time_us, item.prompt_token_count, item.max_output_tokens
    )
    extras = _extras(item)
    if extras != _DEFAULT_EXTRAS:
        for name, value in zip(_EXTRA_FIELDS, extras, strict=True):
            setattr(request, name, value)
    request._spec = item
    return request
