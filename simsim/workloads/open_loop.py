"""Open-loop workloads: a fixed list of requests whose arrivals do not depend on the server,
optionally behind shared system prompts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from simsim.checks import check_real
from simsim.clock import MAX_TIME_US, check_count, check_time_us
from simsim.engines.batching import KvCacheConfig
from simsim.request import RequestSpec
from simsim.workloads.arrivals import StagedArrivals
from simsim.workloads.base import (
    ArrivalProcess,
    LengthDistribution,
    _distribution,
    _set,
    check_request_count,
    check_seed,
)
from simsim.workloads.submission import GeneratedWorkload, PatienceDeadline, WorkloadEngine

__all__ = ["OpenLoopWorkload", "SharedPrefixes"]


@dataclass(frozen=True, slots=True)
class SharedPrefixes:
    """Shared system prompts: every request starts with one of a few common prefixes.

    Group *k* is a prefix of ``lengths[k]`` tokens, chosen with probability
    proportional to ``weights[k]`` (all equal by default). A request's prompt is its
    group's prefix followed by its own drawn prompt tokens, and it names its full KV
    blocks of ``block_size_tokens`` (use the KV cache's) with ``block_hashes``: the
    prefix's full blocks ``("g<k>", i)`` (shared by the whole group), then blocks of its
    own ``("r<request_id>", i)``. The block holding the end of the prefix and the start
    of the request's own tokens is the request's own.

    With ``total_blocks`` (the KV cache's size), a request whose prompt and output limit
    need more blocks than the whole cache could never run: it is refused
    (``ValueError`` naming it) before a single block hash is made, since a prompt that
    large would cost one hash per block first.

    With ``block_hashes=False`` the requests are the same (the same groups, prompts and
    sizes from the same seed) but name no blocks: the baseline for a server without a
    prefix cache, which refuses hashes it would not use.

    With ``users_per_prefix`` (inference-perf's ``shared_prefix`` data: ``lengths`` holds
    one entry per system prompt) there are ``users_per_prefix`` users per prefix, and
    user *u* (0, 1, ...) belongs to prefix ``u // users_per_prefix``. Users take turns,
    in an order shuffled once from *rng*: the request at place *p* of its stage (see
    :meth:`apply`) is asked by the user at place ``p % users`` of that order. Each user
    always asks the same question: the prompt tokens drawn for its first request. Its
    blocks are the prefix's full blocks ``("g<k>", i)`` and then ``("u<user>", i)``, so
    requests of the same prefix share the prefix's full blocks and a user's repeated
    prompt shares every full block with its earlier ones. ``weights`` do not apply.
    """

    lengths: Sequence[int]
    block_size_tokens: int
    weights: Sequence[float] | None = None
    total_blocks: int | None = None
    block_hashes: bool = True
    """Whether each request names its full blocks (``False``: the same requests for a
    server without a prefix cache)."""
    users_per_prefix: int | None = None
    """Users per shared prefix who take turns, each repeating its own question
    (inference-perf's ``shared_prefix`` data), or ``None`` for a group drawn per request."""

    def __post_init__(self) -> None:
        lengths = tuple(check_count(length, "shared prefix length") for length in self.lengths)
        if not lengths:
            raise ValueError("lengths must name at least one shared prefix")
        _set(self, "lengths", lengths)
        _set(
            self,
            "block_size_tokens",
            check_count(self.block_size_tokens, "block_size_tokens", minimum=1),
        )
        if self.weights is not None:
            weights = tuple(check_real(w, "weight", positive=False) for w in self.weights)
            if len(weights) != len(lengths) or not sum(weights) > 0:
                raise ValueError(
                    f"weights must give one non-negative weight per prefix ({len(lengths)}) "
                    f"with a positive sum, got {list(self.weights)}"
                )
            _set(self, "weights", weights)
        if self.total_blocks is not None:
            _set(self, "total_blocks", check_count(self.total_blocks, "total_blocks", minimum=1))
        if type(self.block_hashes) is not bool:
            raise TypeError(f"block_hashes must be True or False, got {self.block_hashes!r}")
        if self.users_per_prefix is not None:
            users = check_count(self.users_per_prefix, "users_per_prefix", minimum=1)
            if self.weights is not None:
                raise ValueError(
                    "weights do not apply with users_per_prefix: users take turns, so every "
                    "prefix gets the same share of the requests; give one or the other"
                )
            _set(self, "users_per_prefix", users)

    def apply(
        self,
        rng: np.random.Generator,
        request_ids: Sequence[int],
        prompts: Sequence[int],
        outputs: Sequence[int] | None = None,
        positions: Sequence[int] | None = None,
    ) -> tuple[list[int], list[tuple[tuple[str, int], ...] | None]]:
        """Each request's full prompt length and block hashes (``None`` for every
        request with ``block_hashes=False``), its group drawn from *rng* (with
        ``users_per_prefix``: its user, from the order of turns shuffled from *rng*).

        *positions* gives each request's place in its stage of a staged load (the turns
        start again with every stage, as inference-perf numbers each stage's requests
        from zero); by default the requests are one stage, in order. With
        ``total_blocks``, every request (its full prompt and its output limit from
        *outputs*, 0 without) is checked against the cache before any hash is made.
        """
        if self.users_per_prefix is None:
            weights = None
            if self.weights is not None:
                total = sum(self.weights)
                weights = [w / total for w in self.weights]
            groups = rng.choice(len(self.lengths), size=len(prompts), p=weights).tolist()
            owners = [f"r{rid}" for rid in request_ids]
            own_tokens = list(prompts)
        else:
            places = range(len(prompts)) if positions is None else positions
            if len(places) != len(prompts):
                raise ValueError(
                    f"positions must give one place per request ({len(prompts)}), got {len(places)}"
                )
            turns = rng.permutation(len(self.lengths) * self.users_per_prefix).tolist()
            users = [turns[place % len(turns)] for place in places]
            groups = [user // self.users_per_prefix for user in users]
            questions: dict[int, int] = {}
            own_tokens = [questions.setdefault(u, q) for u, q in zip(users, prompts, strict=True)]
            owners = [f"u{user}" for user in users]
        full_prompts = [
            self.lengths[group] + own for own, group in zip(own_tokens, groups, strict=True)
        ]
        if self.total_blocks is not None:
            # Every size first: a request that cannot fit is refused before any hash.
            cache = KvCacheConfig(self.block_size_tokens, self.total_blocks)
            limits = [0] * len(full_prompts) if outputs is None else outputs
            for rid, total_tokens, output in zip(request_ids, full_prompts, limits, strict=True):
                cache.check_fits(rid, total_tokens, output)
        if not self.block_hashes:
            return full_prompts, [None] * len(full_prompts)
        block = self.block_size_tokens
        hashes: list[tuple[tuple[str, int], ...] | None] = []
        for owner, total_tokens, group in zip(owners, full_prompts, groups, strict=True):
            shared = self.lengths[group] // block
            keys = [(f"g{group}", i) for i in range(shared)]
            keys += [(owner, i) for i in range(shared, total_tokens // block)]
            hashes.append(tuple(keys))
        return full_prompts, hashes


@dataclass(frozen=True, slots=True)
class OpenLoopWorkload:
    """A fixed number of requests whose arrivals do not depend on the server.

    Request ``first_request_id + i`` is the i-th arrival of ``arrivals`` (from
    ``start_us``), with a prompt drawn from ``prompt_tokens`` and an output limit drawn
    from ``output_tokens``. With ``patience``, the client cancels a request that has not
    finished ``patience`` microseconds after its arrival (a deadline of
    ``arrival + patience``).

    :meth:`generate` draws arrivals, prompts, outputs and patience from four child
    streams of ``SeedSequence(seed)``, in that order, so each is unaffected by the others;
    with ``shared_prefixes``, each request's prefix group comes from a fifth, and its
    prompt is the group's prefix followed by the drawn prompt tokens.

    With :class:`~simsim.workloads.StagedArrivals`, ``count`` may be left out (``None``):
    the stages' own :attr:`~simsim.workloads.StagedArrivals.count` (a smaller ``count``
    keeps the first requests). Every request then carries the tag ``stage`` (0 for the
    first stage), a ``tag_stage`` column of the requests frame to group results by.
    """

    arrivals: ArrivalProcess
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    count: int | None = None
    """How many requests; ``None`` only with staged arrivals (then all they make)."""
    patience: LengthDistribution | None = None
    """Microseconds a client waits before cancelling, or ``None`` for endless patience."""
    first_request_id: int = 0
    start_us: int = 0
    shared_prefixes: SharedPrefixes | None = None
    """Shared system prompts in front of every prompt (for a prefix cache), or ``None``."""

    def __post_init__(self) -> None:
        if self.shared_prefixes is not None and not isinstance(
            self.shared_prefixes, SharedPrefixes
        ):
            raise TypeError(
                f"shared_prefixes must be SharedPrefixes or None, got {self.shared_prefixes!r}"
            )
        if not isinstance(self.arrivals, ArrivalProcess):
            raise TypeError(
                "arrivals must be an arrival process (an object with arrival_times_us), "
                f"got {type(self.arrivals).__name__} {self.arrivals!r}"
            )
        _distribution(self.prompt_tokens, "prompt_tokens")
        _distribution(self.output_tokens, "output_tokens")
        if self.patience is not None:
            _distribution(self.patience, "patience")
        if self.count is None:
            if not isinstance(self.arrivals, StagedArrivals):
                raise TypeError(
                    "count must be an int (only StagedArrivals, which fix their own count, "
                    f"may leave it out), got None with {type(self.arrivals).__name__}"
                )
            count = check_request_count(self.arrivals.count, "the stages' count")
        else:
            count = check_request_count(self.count, "count")
            if isinstance(self.arrivals, StagedArrivals) and count > self.arrivals.count:
                raise ValueError(
                    f"count must be at most {self.arrivals.count}, the requests the stages "
                    f"make (rate x duration per stage), got {count}"
                )
        _set(self, "count", count)
        first = check_count(self.first_request_id, "first_request_id")
        if first + count - 1 > MAX_TIME_US:
            raise OverflowError(f"request ids {first} to {first + count - 1} pass the 64-bit limit")
        _set(self, "first_request_id", first)
        _set(self, "start_us", check_time_us(self.start_us, "start_us"))

    def generate(self, seed: int) -> GeneratedWorkload:
        """The requests and deadlines this workload makes from *seed* (a non-negative int).

        The same seed gives the same result on every machine and every call.
        """
        seed = check_seed(seed)
        arrival_seq, prompt_seq, output_seq, patience_seq = np.random.SeedSequence(seed).spawn(4)
        count = self._count()
        arrivals = self.arrivals.arrival_times_us(
            np.random.default_rng(arrival_seq), count, self.start_us
        )
        prompts = self.prompt_tokens.sample(np.random.default_rng(prompt_seq), count)
        outputs = self.output_tokens.sample(np.random.default_rng(output_seq), count)
        first = self.first_request_id
        staged = self.arrivals if isinstance(self.arrivals, StagedArrivals) else None
        if self.shared_prefixes is None:
            full = prompts.tolist()
            hashes: Sequence[tuple[tuple[str, int], ...] | None] = [None] * count
        else:
            # A fifth stream: the four above draw exactly what they draw without it.
            group_seq = np.random.SeedSequence(seed).spawn(5)[4]
            full, hashes = self.shared_prefixes.apply(
                np.random.default_rng(group_seq),
                range(first, first + count),
                prompts.tolist(),
                outputs.tolist(),
                None if staged is None else staged.positions_in_stage(count),
            )
        if staged is None:
            requests = tuple(
                RequestSpec(first + i, arrival, prompt, output, block_hashes=keys)
                for i, (arrival, prompt, output, keys) in enumerate(
                    zip(arrivals.tolist(), full, outputs.tolist(), hashes, strict=True)
                )
            )
        else:
            tags = [MappingProxyType({"stage": index}) for index in range(len(staged.stages))]
            requests = tuple(
                RequestSpec(first + i, arrival, prompt, output, block_hashes=keys, tags=tags[stage])
                for i, (arrival, prompt, output, keys, stage) in enumerate(
                    zip(
                        arrivals.tolist(),
                        full,
                        outputs.tolist(),
                        hashes,
                        staged.stage_indices(count),
                        strict=True,
                    )
                )
            )
        deadlines: list[PatienceDeadline] = []
        if self.patience is not None:
            patience = self.patience.sample(np.random.default_rng(patience_seq), count)
            for request, wait_us in zip(requests, patience.tolist(), strict=True):
                deadline = request.arrival_time_us + wait_us
                if deadline > MAX_TIME_US:
                    raise OverflowError(
                        f"request {request.request_id}: deadline {deadline} us is past the "
                        "64-bit limit 2**63 - 1"
                    )
                deadlines.append(PatienceDeadline(deadline, request.request_id))
            deadlines.sort()
        return GeneratedWorkload(requests, tuple(deadlines))

    def _count(self) -> int:
        # An int after __post_init__; None only as an argument.
        assert self.count is not None
        return self.count

    def submit_to(self, engine: WorkloadEngine, seed: int) -> GeneratedWorkload:
        """Generate from *seed*, submit to *engine* (see :meth:`GeneratedWorkload.submit_to`).

        Returns the generated workload (specs and deadlines); the engine's own requests
        are in ``engine.requests``.
        """
        generated = self.generate(seed)
        generated.submit_to(engine)
        return generated
