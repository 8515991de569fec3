"""The cost model: how many simulated microseconds each piece of work takes.

A backend prices work and knows nothing else. :class:`SimulatedBackend` is the built-in
linear model; any object with the two methods of :class:`Backend` can replace it. The
figures are analytical costs that drive a simulation, never measured performance of
any real hardware or inference runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

from simsim.clock import MAX_TIME_US, check_count

__all__ = ["Backend", "SimulatedBackend", "SimulatedBackendConfig", "iteration_cost_us"]


@runtime_checkable
class Backend(Protocol):
    """What an engine asks of a cost model. Both methods return ``int`` microseconds."""

    def prefill_us(self, prompt_token_count: int, active_batch_size: int) -> int:
        """Duration of a prefill of *prompt_token_count* tokens in a batch of that size."""
        ...

    def decode_step_us(self, active_sequence_count: int) -> int:
        """Duration of one decode step over *active_sequence_count* sequences."""
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
        raise OverflowError(f"{what} = {total} us is past the 64-bit limit 2**63 - 1")
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
            raise OverflowError(f"prefill_us({tokens}, {batch}) = {total} us is past 2**63 - 1")
        return total

    def decode_step_us(self, active_sequence_count: int) -> int:
        """Decode-step cost: base + per-active-sequence * active sequences."""
        count = active_sequence_count
        if type(count) is not int or count < 0:
            count = check_count(count, "active_sequence_count")
        c = self._config
        total = c.decode_base_us + c.decode_per_active_sequence_us * count
        if total > MAX_TIME_US:
            raise OverflowError(f"decode_step_us({count}) = {total} us is past 2**63 - 1")
        return total

    def iteration_us(self, prefill_tokens: int, prefilling_count: int, decoding_count: int) -> int:
        """Cost of one batching iteration: a prefill part plus a decode part.

        ``prefill_us(prefill_tokens, prefilling_count)`` when anyone prefills, plus
        ``decode_step_us(decoding_count)`` when anyone decodes.
        """
        return iteration_cost_us(self, prefill_tokens, prefilling_count, decoding_count)


def iteration_cost_us(
    backend: Backend, prefill_tokens: int, prefilling_count: int, decoding_count: int
) -> int:
    """The default iteration cost for any backend, from its two per-phase costs."""
    prefill_tokens = check_count(prefill_tokens, "prefill_tokens")
    prefilling_count = check_count(prefilling_count, "prefilling_count")
    decoding_count = check_count(decoding_count, "decoding_count")
    total = 0
    if prefilling_count > 0:
        total += backend.prefill_us(prefill_tokens, prefilling_count)
    if decoding_count > 0:
        total += backend.decode_step_us(decoding_count)
    return _checked(total, "iteration_us")
