"""The cost model: how many simulated microseconds each piece of work takes.

A backend prices work and knows nothing else. :class:`SimulatedBackend` is the built-in
linear model in whole microseconds; :class:`FittedBackend` is the richer model that
``simsim calibrate`` fits to a real server (fractional coefficients, a quadratic prompt
term, decode costs that grow with the context); any object with the two methods of
:class:`Backend` can replace them. The figures are analytical costs that drive a
simulation, never measured performance of any real hardware or inference runtime (a
fitted model describes the server it was fitted to, on the workload it was fitted on).
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt

from simsim.checks import check_real, overflow
from simsim.clock import MAX_TIME_US, check_count
from simsim.registry import Registry

IntArray: TypeAlias = npt.NDArray[np.int64]

__all__ = [
    "BACKENDS",
    "Backend",
    "DecodeStepsBackend",
    "FittedBackend",
    "FittedBackendConfig",
    "SimulatedBackend",
    "SimulatedBackendConfig",
    "StepCostBackend",
    "check_duration_us",
    "iteration_cost_us",
    "register_backend",
    "round_us",
    "rounded_us",
]


@runtime_checkable
class Backend(Protocol):
    """What an engine asks of a cost model. Both methods return ``int`` microseconds."""

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        """Duration of a prefill of *prompt_token_count* tokens in a batch of that size."""
        ...

    def decode_step_us(self, active_sequence_count: int) -> int:
        """Duration of one decode step over *active_sequence_count* sequences."""
        ...


@runtime_checkable
class StepCostBackend(Backend, Protocol):
    """A backend that prices each step from every sequence's work (optional, richer).

    When a backend has ``step_us``, every engine but :class:`~simsim.FastSimulationEngine`
    (which refuses it) prices all its work with it instead of ``prefill_us`` and
    ``decode_step_us``: the single slot's prefill is ``step_us(((prompt, 0),), ())``
    and its decode step ``step_us((), (context,))``; a batching iteration passes every
    prefilling and every decoding sequence, in admission order.
    """

    def step_us(self, prefills: Sequence[tuple[int, int]], decodes: Sequence[int]) -> int:
        """Duration of one step: *prefills* holds ``(new_tokens, cached_tokens)`` per
        prefilling sequence (tokens computed now, tokens already in its KV cache),
        *decodes* the context (tokens in its KV cache) of each decoding sequence."""
        ...


@runtime_checkable
class DecodeStepsBackend(StepCostBackend, Protocol):
    """A :class:`StepCostBackend` that also prices a run of decode-only steps at once.

    ``decode_steps_us(count, context_sums)`` returns, for each entry of the int64 array
    *context_sums*, exactly what ``step_us((), decodes)`` returns for ``count`` decoding
    sequences whose contexts sum to it (an int64 array of the same length), or ``None``
    if it cannot. :class:`~simsim.BatchingEngine` uses it, when the class that defines
    ``step_us`` also defines it, to advance through a stretch of decode iterations in one
    event (``docs/batching.md``, "Stretches"); :class:`FittedBackend` and
    :class:`~simsim.gpu.PhysicsBackend` implement it. A step must then depend on the
    decodes only through their count and the sum of their contexts.
    """

    def decode_steps_us(self, count: int, context_sums: npt.NDArray[np.int64]) -> IntArray | None:
        """The durations of decode-only steps of *count* sequences, one per context sum."""
        ...


@dataclass(frozen=True, slots=True)
class SimulatedBackendConfig:
    """Coefficients of the linear cost model, each a non-negative ``int`` of microseconds.

    ``prefill_us = prefill_base_us + prefill_per_token_us * prompt_tokens
    + prefill_per_active_sequence_us * active_batch_size`` and
    ``decode_step_us = decode_base_us + decode_per_active_sequence_us * active_sequences``.
    """

    prefill_base_us: int = 0
    prefill_per_token_us: int = 0
    prefill_per_active_sequence_us: int = 0
    decode_base_us: int = 0
    decode_per_active_sequence_us: int = 0

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = check_count(getattr(self, spec.name), spec.name)
            object.__setattr__(self, spec.name, value)


def _checked(total: int, what: str) -> int:
    if total > MAX_TIME_US:
        raise overflow(what, total, " us")
    return total


class SimulatedBackend:
    """The built-in linear cost model (see :class:`SimulatedBackendConfig`).

    Arguments must be non-negative ``int`` counts; a result past ``2**63 - 1`` raises
    ``OverflowError``.
    """

    __slots__ = ("_config",)

    def __init__(self, config: SimulatedBackendConfig) -> None:
        if not isinstance(config, SimulatedBackendConfig):
            raise TypeError(f"config must be a SimulatedBackendConfig, got {type(config).__name__}")
        self._config = config

    @property
    def config(self) -> SimulatedBackendConfig:
        """The coefficients this backend prices with."""
        return self._config

    def __repr__(self) -> str:
        return f"SimulatedBackend({self._config!r})"

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        """Prefill cost: base + per-token * prompt + per-active-sequence * batch size."""
        tokens, batch = prompt_token_count, active_batch_size
        if type(tokens) is not int or tokens < 0:
            tokens = check_count(tokens, "prompt_token_count")
        if type(batch) is not int or batch < 0:
            batch = check_count(batch, "active_batch_size")
        c = self._config
        total = (
            c.prefill_base_us
            + c.prefill_per_token_us * tokens
            + c.prefill_per_active_sequence_us * batch
        )
        if total > MAX_TIME_US:
            raise overflow(f"prefill_us({tokens}, {batch})", total, " us")
        return total

    def decode_step_us(self, active_sequence_count: int) -> int:
        """Decode-step cost: base + per-active-sequence * active sequences."""
        count = active_sequence_count
        if type(count) is not int or count < 0:
            count = check_count(count, "active_sequence_count")
        c = self._config
        total = c.decode_base_us + c.decode_per_active_sequence_us * count
        if total > MAX_TIME_US:
            raise overflow(f"decode_step_us({count})", total, " us")
        return total

    def iteration_us(self, prefill_tokens: int, prefilling_count: int, decoding_count: int) -> int:
        """Cost of one batching iteration: a prefill part plus a decode part.

        ``prefill_us(prefill_tokens, prefilling_count)`` when anyone prefills, plus
        ``decode_step_us(decoding_count)`` when anyone decodes.
        """
        return iteration_cost_us(self, prefill_tokens, prefilling_count, decoding_count)


def iteration_cost_us(
    backend: Backend,
    prefill_tokens: int,
    prefilling_count: int,
    decoding_count: int,
    *,
    subject: int | str | Callable[[], str] = "an iteration",
) -> int:
    """The default iteration cost for any backend, from its two per-phase costs.

    Each part is checked before it is added (a non-negative ``int``, not ``bool``), so a
    bad answer from ``prefill_us`` or ``decode_step_us`` is reported under that method's
    name and never hidden by the other part. *subject* names the work in messages (a
    request id, a description such as ``"the iteration at 40 us"``, or a function that
    returns one, called only when a message is written).
    """
    prefill_tokens = check_count(prefill_tokens, "prefill_tokens")
    prefilling_count = check_count(prefilling_count, "prefilling_count")
    decoding_count = check_count(decoding_count, "decoding_count")
    total = 0
    if prefilling_count > 0:
        part = backend.prefill_us(prefill_tokens, prefilling_count)
        if type(part) is not int or part < 0:
            part = check_duration_us(part, "prefill_us", subject)
        total += part
    if decoding_count > 0:
        part = backend.decode_step_us(decoding_count)
        if type(part) is not int or part < 0:
            part = check_duration_us(part, "decode_step_us", subject)
        total += part
    return _checked(total, "iteration_us")


def check_duration_us(value: object, what: str, subject: int | str | Callable[[], str]) -> int:
    """Check a backend's answer: a non-negative ``int`` (NumPy integers converted).

    *what* names the backend method, *subject* the work it priced: an ``int`` is a
    request id (``"request 7"``), a string is used as it is, a function is called for
    the string. ``bool``, floats, strings and ``None`` raise ``TypeError``; a negative
    duration raises ``ValueError``.
    """
    if type(value) is int:
        duration = value
    else:
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(
                f"backend {what} for {_named(subject)} returned "
                f"{type(value).__name__} {value!r}; durations must be int microseconds"
            )
        duration = int(operator.index(value))  # type: ignore[arg-type]
    if duration < 0:
        raise ValueError(
            f"backend {what} for {_named(subject)} returned a negative duration {duration} us"
        )
    return duration


def _named(subject: int | str | Callable[[], str]) -> str:
    if isinstance(subject, int):
        return f"request {subject}"
    return subject if isinstance(subject, str) else subject()


# ---------------------------------------------------------------------- fitted model


def round_us(value: float, what: str = "a duration") -> int:
    """*value* microseconds as a plain ``int``: the nearest integer, halves rounded up.

    ``floor(value + 0.5)``: the one rounding rule of :class:`FittedBackend`, applied once
    per priced step. Raises ``OverflowError`` past ``2**63 - 1`` (or for an infinite or
    NaN total), naming *what*.
    """
    if not value <= MAX_TIME_US:  # also catches NaN
        raise overflow(what, value, " us")
    return math.floor(value + 0.5)


def rounded_us(values: npt.NDArray[np.floating[Any]]) -> IntArray | None:
    """:func:`round_us` for an array of durations: ``floor(value + 0.5)`` each, as int64;
    ``None`` if any is NaN or near ``2**63`` (past ``2**62``, where a float no longer
    tells the limit apart): the caller then prices one by one, which raises where an
    error belongs."""
    if not bool((values < 2.0**62).all()):
        return None
    rounded: IntArray = np.floor(values + 0.5).astype(np.int64)
    return rounded


@dataclass(frozen=True, slots=True)
class FittedBackendConfig:
    """Coefficients of the fitted cost model: finite, non-negative microseconds (floats).

    A step with prefilling sequences *i* (``new_i`` tokens computed now, ``cached_i``
    already in the KV cache) and decoding sequences *j* (``context_j`` tokens in the KV
    cache) costs, before the one rounding (:func:`round_us`)::

        prefill part = prefill_base_us + sum over i of (
                           prefill_per_token_us * new_i
                         + prefill_per_token_squared_us * new_i * (new_i + 2 * cached_i)
                         + prefill_per_sequence_us)                      (if anyone prefills)
        decode part  = decode_base_us + sum over j of (
                           decode_per_sequence_us
                         + decode_per_context_token_us * context_j)     (if anyone decodes)

    ``new * (new + 2 * cached)`` is ``(cached + new)**2 - cached**2``: a prompt prefilled
    in chunks pays the same quadratic (attention) term in total as in one piece.
    """

    prefill_base_us: float = 0.0
    prefill_per_token_us: float = 0.0
    prefill_per_token_squared_us: float = 0.0
    prefill_per_sequence_us: float = 0.0
    decode_base_us: float = 0.0
    decode_per_sequence_us: float = 0.0
    decode_per_context_token_us: float = 0.0

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = check_real(getattr(self, spec.name), spec.name, unit=" microseconds")
            object.__setattr__(self, spec.name, value)

    def as_dict(self) -> dict[str, float]:
        """The coefficients by name, as a scenario's ``[backend]`` table holds them."""
        return asdict(self)


def _checked_counts(values: Sequence[int], what: str) -> None:
    for value in values:
        if type(value) is not int or value < 0:
            check_count(value, what)


class FittedBackend:
    """The fitted cost model (see :class:`FittedBackendConfig` for the formula).

    It implements :class:`StepCostBackend`: engines pass it every sequence's new and
    cached tokens, and each step is rounded once to integer microseconds with
    :func:`round_us`. ``prefill_us`` and ``decode_step_us`` (the :class:`Backend`
    methods, for code that knows no context) price ``prompt_token_count`` tokens as one
    sequence with nothing cached plus ``active_batch_size`` sequences' per-sequence
    cost, and a decode step of sequences with an empty context.
    """

    __slots__ = ("_config",)

    def __init__(self, config: FittedBackendConfig) -> None:
        if not isinstance(config, FittedBackendConfig):
            raise TypeError(f"config must be a FittedBackendConfig, got {type(config).__name__}")
        self._config = config

    @property
    def config(self) -> FittedBackendConfig:
        """The coefficients this backend prices with."""
        return self._config

    def __repr__(self) -> str:
        return f"FittedBackend({self._config!r})"

    def step_us(self, prefills: Sequence[tuple[int, int]], decodes: Sequence[int]) -> int:
        """One step's cost, rounded once (see :class:`FittedBackendConfig`)."""
        c = self._config
        total = 0.0
        if prefills:
            news = [new for new, _ in prefills]
            cached = [old for _, old in prefills]
            _checked_counts(news, "new_tokens")
            _checked_counts(cached, "cached_tokens")
            squares = sum(new * (new + 2 * old) for new, old in zip(news, cached, strict=True))
            total += (
                c.prefill_base_us
                + c.prefill_per_token_us * sum(news)
                + c.prefill_per_token_squared_us * squares
                + c.prefill_per_sequence_us * len(news)
            )
        if decodes:
            _checked_counts(decodes, "context_tokens")
            total += (
                c.decode_base_us
                + c.decode_per_sequence_us * len(decodes)
                + c.decode_per_context_token_us * sum(decodes)
            )
        return round_us(total, "step_us")

    def decode_steps_us(self, count: int, context_sums: npt.NDArray[np.int64]) -> IntArray | None:
        """Many decode-only steps at once: for each entry of *context_sums*, what
        ``step_us((), decodes)`` gives for *count* decoding sequences whose contexts sum
        to it, with the same floating-point operations in the same order (so the same
        rounding). ``None`` when a step would pass ``2**63 - 1``: the engine then prices
        step by step, which raises at the right step. See :class:`DecodeStepsBackend`.
        """
        c = self._config
        fixed = c.decode_base_us + c.decode_per_sequence_us * count
        totals = 0.0 + (fixed + c.decode_per_context_token_us * context_sums)
        return rounded_us(totals)

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        """A prefill of *prompt_token_count* tokens (one sequence, nothing cached)."""
        tokens = check_count(prompt_token_count, "prompt_token_count")
        batch = check_count(active_batch_size, "active_batch_size")
        c = self._config
        total = (
            c.prefill_base_us
            + c.prefill_per_token_us * tokens
            + c.prefill_per_token_squared_us * tokens * tokens
            + c.prefill_per_sequence_us * batch
        )
        return round_us(total, f"prefill_us({tokens}, {batch})")

    def decode_step_us(self, active_sequence_count: int) -> int:
        """A decode step of *active_sequence_count* sequences with an empty context."""
        count = check_count(active_sequence_count, "active_sequence_count")
        c = self._config
        return round_us(c.decode_base_us + c.decode_per_sequence_us * count, "decode_step_us")


# ---------------------------------------------------------------------- backends by name


def _configured(
    config_type: type[SimulatedBackendConfig] | type[FittedBackendConfig],
    backend_type: Callable[[Any], Backend],
) -> Callable[..., Backend]:
    """A factory of *backend_type* taking *config_type*'s fields as keyword options."""

    def build(**options: Any) -> Backend:
        return backend_type(config_type(**options))

    build.__signature__ = inspect.signature(config_type)  # type: ignore[attr-defined]
    build.__name__ = build.__qualname__ = backend_type.__name__
    return build


BACKENDS: Registry[Callable[..., Backend]] = Registry("backend kind")
"""``[backend] kind`` names -> factory taking the table's other keys as keyword options
and returning a :class:`Backend`; :func:`register_backend` adds a user's own."""

BACKENDS.register("simulated", _configured(SimulatedBackendConfig, SimulatedBackend))
BACKENDS.register("fitted", _configured(FittedBackendConfig, FittedBackend))


def register_backend(
    name: str, factory: Callable[..., Backend], *, replace: bool = False
) -> Callable[..., Backend]:
    """Make *factory* the backend kind *name*, for a scenario's ``[backend] kind``;
    returns *factory*.

    *factory* (a class or a function) is called with the ``[backend]`` table's other
    keys as keyword arguments, which its signature declares, and returns a
    :class:`Backend`. A name already taken raises ``ValueError`` unless *replace* is
    true.
    """
    return BACKENDS.register(name, factory, replace=replace)
