"""Classes of requests: a mix of traffic classes, each with its own arrivals, sizes and
metadata (class, tenant, priority, deadline, tags), merged in arrival order."""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from simsim.checks import check_real
from simsim.clock import MAX_TIME_US, check_count, check_time_us
from simsim.request import RequestSpec
from simsim.workloads.base import (
    _HELD_IN_MEMORY,
    MAX_GENERATED_REQUESTS,
    ArrivalProcess,
    LengthDistribution,
    _distribution,
    _set,
    check_request_count,
    check_seed,
)
from simsim.workloads.open_loop import OpenLoopWorkload
from simsim.workloads.submission import GeneratedWorkload, PatienceDeadline, WorkloadEngine

__all__ = ["ClassMix", "RequestClass"]


def _class_seed(seed: int, name: str) -> int:
    """A class's own seed: a child of ``SeedSequence(seed)`` keyed by the class's *name*.

    Keyed by name, not position, so adding, removing or reordering other classes leaves
    this class's draws unchanged. The spawn key (four 32-bit words of the name's
    SHA-256) never equals a plain ``spawn()`` child's one-word key.
    """
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    words = tuple(int.from_bytes(digest[i : i + 4], "big") for i in range(0, 16, 4))
    sequence = np.random.SeedSequence(seed, spawn_key=words)
    return int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1))


def _optional_name(value: object, name: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(f"{name} must be a non-empty str or None, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One class of traffic in a :class:`ClassMix`: its arrivals, sizes and metadata.

    The class draws like an :class:`OpenLoopWorkload` of its own (arrivals, prompts,
    outputs, patience), and every request it makes carries ``request_class = name``,
    ``tenant``, ``priority``, ``tags`` and, with ``relative_deadline_us``, the absolute
    ``deadline_us = arrival_time_us + relative_deadline_us``. Give ``count`` (how many
    requests) or ``share`` (its part of the mix's ``total``), not both; with neither, the
    mix's ``total`` is split in proportion to the classes' arrival rates.

    ``ttft_slo_us`` and ``tpot_slo_us`` are the class's latency targets: they change no
    draw and no request, and are what reports judge the class by
    (:meth:`ClassMix.slo_targets`).
    """

    name: str
    arrivals: ArrivalProcess
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    count: int | None = None
    share: float | None = None
    """This class's weight in the mix's ``total`` (any positive number; weights are
    normalised over the classes)."""
    tenant: str | None = None
    priority: int = 0
    """Lower runs first under the ``priority`` scheduler (as in vLLM); may be negative."""
    relative_deadline_us: int | None = None
    """Each request's deadline, in microseconds after its arrival (``None``: none)."""
    tags: Mapping[str, Any] | None = None
    patience: LengthDistribution | None = None
    """Microseconds a client waits before cancelling, or ``None`` for endless patience."""
    ttft_slo_us: float | None = None
    tpot_slo_us: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"a request class needs a non-empty str name, got {self.name!r}")
        where = f"class {self.name!r}"
        if not isinstance(self.arrivals, ArrivalProcess):
            raise TypeError(
                f"{where}: arrivals must be an arrival process (an object with "
                f"arrival_times_us), got {type(self.arrivals).__name__} {self.arrivals!r}"
            )
        _distribution(self.prompt_tokens, f"{where}: prompt_tokens")
        _distribution(self.output_tokens, f"{where}: output_tokens")
        if self.patience is not None:
            _distribution(self.patience, f"{where}: patience")
        if self.count is not None and self.share is not None:
            raise ValueError(f"{where}: give count or share, not both")
        if self.count is not None:
            _set(self, "count", check_request_count(self.count, f"{where}: count"))
        if self.share is not None:
            _set(self, "share", check_real(self.share, f"{where}: share", positive=True))
        _optional_name(self.tenant, f"{where}: tenant")
        if isinstance(self.priority, bool) or not hasattr(type(self.priority), "__index__"):
            raise TypeError(f"{where}: priority must be an int, got {self.priority!r}")
        _set(self, "priority", int(operator.index(self.priority)))
        if self.relative_deadline_us is not None:
            _set(
                self,
                "relative_deadline_us",
                check_time_us(self.relative_deadline_us, f"{where}: relative_deadline_us"),
            )
        if self.tags is not None:
            if not isinstance(self.tags, Mapping) or not all(
                type(key) is str and key for key in self.tags
            ):
                raise TypeError(
                    f"{where}: tags must be a mapping with non-empty str keys, got {self.tags!r}"
                )
            _set(self, "tags", MappingProxyType(dict(self.tags)))
        for key in ("ttft_slo_us", "tpot_slo_us"):
            value = getattr(self, key)
            if value is not None:
                _set(self, key, check_real(value, f"{where}: {key}", positive=False))

    @property
    def slo_target(self) -> tuple[float | None, float | None]:
        """``(ttft_slo_us, tpot_slo_us)``: the class's latency targets (``None``: none)."""
        return (self.ttft_slo_us, self.tpot_slo_us)


def _split_total(total: int, weights: Sequence[float]) -> list[int]:
    """*total* split in proportion to *weights*, summing exactly to *total*.

    Largest remainder: every part gets the floor of its exact share, and the units
    left over go to the largest fractional parts, ties to the earlier class.
    """
    whole = math.fsum(weights)
    exact = [total * weight / whole for weight in weights]
    parts = [math.floor(value) for value in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - parts[i]), i))
    for index in order[: total - sum(parts)]:
        parts[index] += 1
    return parts


@dataclass(frozen=True, slots=True)
class ClassMix:
    """Open-loop traffic made of several :class:`RequestClass` es, merged in arrival order.

    Every class draws its own requests, from its own seed (a child of the mix's seed
    keyed by the class's name, see :meth:`generate`), from ``start_us``. The requests
    of all classes are then merged by ``(arrival_time_us, class order, draw order)``
    and numbered from ``first_request_id`` in that order, so request ids follow
    arrivals and are unique across classes.

    Counts: every class gives its ``count``, or ``total`` is given and split among the
    classes with the largest-remainder rule, in proportion to each class's ``share``
    (by default its arrival process's ``rate_per_s``, so that every class spans about
    the same time). A class with ``count`` and a ``total`` do not go together.
    """

    classes: Sequence[RequestClass]
    total: int | None = None
    first_request_id: int = 0
    start_us: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.classes, str | bytes) or not isinstance(self.classes, Sequence):
            raise TypeError(f"classes must be a sequence of RequestClass, got {self.classes!r}")
        classes = tuple(self.classes)
        if not classes:
            raise ValueError("a class mix needs at least one class, got none")
        names: set[str] = set()
        for index, item in enumerate(classes):
            if not isinstance(item, RequestClass):
                raise TypeError(
                    f"classes[{index}] must be a RequestClass, got {type(item).__name__} {item!r}"
                )
            if item.name in names:
                raise ValueError(f"class name {item.name!r} appears twice; names must be unique")
            names.add(item.name)
        _set(self, "classes", classes)
        if self.total is None:
            for item in classes:
                if item.count is None:
                    raise ValueError(
                        f"class {item.name!r} has no count: give every class a count, or "
                        "give the mix a total to split"
                    )
        else:
            _set(self, "total", check_request_count(self.total, "total"))
            for item in classes:
                if item.count is not None:
                    raise ValueError(
                        f"class {item.name!r} has count = {item.count} and the mix has "
                        f"total = {self.total}: give every class a count, or a total with "
                        "shares, not both"
                    )
                if item.share is None and not isinstance(
                    getattr(item.arrivals, "rate_per_s", None), float
                ):
                    raise ValueError(
                        f"class {item.name!r} has no share and its arrival process has no "
                        "rate_per_s to weigh it by: give it a share"
                    )
        made = sum(self.counts())
        if made > MAX_GENERATED_REQUESTS:
            raise ValueError(
                f"the classes make {made:,} requests, more than the limit of "
                f"{MAX_GENERATED_REQUESTS:,} per workload ({_HELD_IN_MEMORY})"
            )
        first = check_count(self.first_request_id, "first_request_id")
        if first + made - 1 > MAX_TIME_US:
            raise OverflowError(
                f"request ids from {first} for {made} requests pass the 64-bit limit"
            )
        _set(self, "first_request_id", first)
        _set(self, "start_us", check_time_us(self.start_us, "start_us"))

    def counts(self) -> list[int]:
        """How many requests each class makes, in class order."""
        if self.total is None:
            return [item.count or 0 for item in self.classes]
        weights = [
            item.share if item.share is not None else float(item.arrivals.rate_per_s)  # type: ignore[attr-defined]
            for item in self.classes
        ]
        return _split_total(self.total, weights)

    @property
    def count(self) -> int:
        """How many requests the mix makes in all."""
        return sum(self.counts())

    def slo_targets(self) -> dict[str, tuple[float | None, float | None]]:
        """``{class name: (ttft_slo_us, tpot_slo_us)}`` for every class with a target."""
        return {
            item.name: item.slo_target
            for item in self.classes
            if item.ttft_slo_us is not None or item.tpot_slo_us is not None
        }

    def generate(self, seed: int) -> GeneratedWorkload:
        """The requests and patience deadlines this mix makes from *seed*.

        Class *c* draws exactly what ``OpenLoopWorkload(c.arrivals, c.prompt_tokens,
        c.output_tokens, count, c.patience, start_us=start_us)`` draws from its own seed,
        a child of ``SeedSequence(seed)`` keyed by ``c.name``: adding, removing or
        reordering other classes does not change a class's arrivals and sizes (only the
        request ids, which follow the merged arrival order).
        """
        seed = check_seed(seed)
        drawn: list[tuple[int, int, int, RequestSpec, int | None]] = []
        for order, (item, count) in enumerate(zip(self.classes, self.counts(), strict=True)):
            if count == 0:
                continue  # a share too small to get a request of the total: nothing to draw
            own = OpenLoopWorkload(
                item.arrivals,
                item.prompt_tokens,
                item.output_tokens,
                count,
                patience=item.patience,
                start_us=self.start_us,
            ).generate(_class_seed(seed, item.name))
            patience = {d.request_id: d.time_us for d in own.cancellations}
            for request in own.requests:
                drawn.append(
                    (
                        request.arrival_time_us,
                        order,
                        request.request_id,
                        request,
                        patience.get(request.request_id),
                    )
                )
        drawn.sort(key=lambda row: row[:3])
        requests: list[RequestSpec] = []
        deadlines: list[PatienceDeadline] = []
        for position, (arrival, order, _, drawn_request, give_up_us) in enumerate(drawn):
            item = self.classes[order]
            rid = self.first_request_id + position
            deadline = None
            if item.relative_deadline_us is not None:
                deadline = arrival + item.relative_deadline_us
                if deadline > MAX_TIME_US:
                    raise OverflowError(
                        f"request {rid} of class {item.name!r}: deadline {deadline} us is "
                        "past the 64-bit limit 2**63 - 1"
                    )
            requests.append(
                RequestSpec(
                    rid,
                    arrival,
                    drawn_request.prompt_token_count,
                    drawn_request.max_output_tokens,
                    request_class=item.name,
                    tenant=item.tenant,
                    priority=item.priority,
                    deadline_us=deadline,
                    tags=item.tags,
                )
            )
            if give_up_us is not None:
                deadlines.append(PatienceDeadline(give_up_us, rid))
        deadlines.sort()
        return GeneratedWorkload(tuple(requests), tuple(deadlines))

    def submit_to(self, engine: WorkloadEngine, seed: int) -> GeneratedWorkload:
        """Generate from *seed*, submit to *engine* (see :meth:`GeneratedWorkload.submit_to`)."""
        generated = self.generate(seed)
        generated.submit_to(engine)
        return generated
