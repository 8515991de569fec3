"""Closed-loop workloads: users who each keep one request outstanding, think, and ask again."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from simsim.clock import Environment, check_count, check_time_us
from simsim.request import RequestSpec
from simsim.workloads.base import (
    _HELD_IN_MEMORY,
    MAX_GENERATED_REQUESTS,
    LengthDistribution,
    _distribution,
    _set,
    check_request_count,
    check_seed,
)
from simsim.workloads.submission import WorkloadEngine

__all__ = ["ClosedLoopRun", "ClosedLoopSubmission", "ClosedLoopWorkload"]


@dataclass(frozen=True, slots=True)
class ClosedLoopSubmission:
    """One request a closed-loop user submitted, with the random draws that went with it."""

    request_id: int
    user: int
    """The user (0 to ``users - 1``) who submitted it."""
    index: int
    """0 for the user's first request, 1 for the second, ..."""
    submit_time_us: int
    """When it was submitted; also its ``arrival_time_us``."""
    think_time_us: int
    """How long the user thinks after this request ends before submitting the next."""
    patience_us: int | None
    """How long the user waits before cancelling it, or ``None`` for no deadline."""


class ClosedLoopRun:
    """What :meth:`ClosedLoopWorkload.start` set in motion.

    ``processes`` are the users' SimPy processes (in user order); ``submissions`` grows
    as the simulation runs, one :class:`ClosedLoopSubmission` per submitted request in
    submission order.
    """

    __slots__ = ("_processes", "_submissions")

    def __init__(self) -> None:
        self._processes: tuple[simpy.Process, ...] = ()
        self._submissions: list[ClosedLoopSubmission] = []

    @property
    def processes(self) -> tuple[simpy.Process, ...]:
        """One SimPy process per user, in user order."""
        return self._processes

    @property
    def submissions(self) -> tuple[ClosedLoopSubmission, ...]:
        """Every request submitted so far, in submission order."""
        return tuple(self._submissions)


@dataclass(frozen=True, slots=True)
class ClosedLoopWorkload:
    """``users`` clients who each keep exactly one request outstanding at a time.

    Each user, a SimPy process, repeats: submit a request (arrival = now), wait until it
    is terminal (``yield engine.completion(rid)``), think for a drawn time, and ask
    again. It stops after ``requests_per_user`` requests, or (with ``horizon_us``) once
    it would submit at or after that absolute time; requests in flight at the horizon
    still run to the end. Give exactly one of the two.

    With ``patience``, a user who has waited that long for an answer cancels the request
    (if it is not terminal) and goes on thinking, so a request must finish strictly
    before its deadline, as in :meth:`GeneratedWorkload.submit_to`.

    Request ids count up from ``first_request_id`` in submission order, one shared
    counter for all users; the simulation is deterministic, so the ids are too. User
    ``u`` draws from its own child stream of ``SeedSequence(seed)`` (one stream each for
    prompts, outputs, think times and patience), one value per request, so a user's
    n-th request has the same size and think time whatever the server does.

    With ``conversation_block_size_tokens`` (the KV cache's block size), each user is one
    multi-turn conversation: its n-th prompt is its previous prompt, plus the tokens the
    server answered it with, plus the newly drawn prompt tokens (the new message), and it
    names its full blocks, prompt and answer, ``("u<user>", i)`` as ``block_hashes``, so
    a prefix cache can serve the conversation so far, answers included. Sizes then
    depend on what the server answered (a cancelled turn's partial answer), which the
    deterministic simulation makes deterministic too. With ``block_hashes=False`` the
    conversations are the same but their turns name no blocks: the baseline for a
    server without a prefix cache.
    """

    users: int
    think_time_us: LengthDistribution
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    requests_per_user: int | None = None
    horizon_us: int | None = None
    first_request_id: int = 0
    patience: LengthDistribution | None = None
    conversation_block_size_tokens: int | None = None
    """With a block size (the KV cache's), each user is one multi-turn conversation."""
    block_hashes: bool = True
    """Whether a conversation's turns name their full blocks (``False``: the same
    conversations for a server without a prefix cache); only with
    ``conversation_block_size_tokens``."""

    def __post_init__(self) -> None:
        _set(self, "users", check_request_count(self.users, "users"))
        if type(self.block_hashes) is not bool:
            raise TypeError(f"block_hashes must be True or False, got {self.block_hashes!r}")
        if not self.block_hashes and self.conversation_block_size_tokens is None:
            raise ValueError(
                "block_hashes=False is for conversations (it names no blocks of their "
                "turns); without conversation_block_size_tokens no request names any"
            )
        if self.conversation_block_size_tokens is not None:
            _set(
                self,
                "conversation_block_size_tokens",
                check_count(
                    self.conversation_block_size_tokens,
                    "conversation_block_size_tokens",
                    minimum=1,
                ),
            )
        _distribution(self.think_time_us, "think_time_us")
        _distribution(self.prompt_tokens, "prompt_tokens")
        _distribution(self.output_tokens, "output_tokens")
        if self.patience is not None:
            _distribution(self.patience, "patience")
        if (self.requests_per_user is None) == (self.horizon_us is None):
            raise ValueError(
                "give exactly one of requests_per_user and horizon_us, got "
                f"requests_per_user={self.requests_per_user!r}, horizon_us={self.horizon_us!r}"
            )
        if self.requests_per_user is not None:
            per_user = check_count(self.requests_per_user, "requests_per_user", minimum=1)
            if self.users * per_user > MAX_GENERATED_REQUESTS:
                raise ValueError(
                    f"users * requests_per_user = {self.users:,} * {per_user:,} requests, more "
                    f"than the limit of {MAX_GENERATED_REQUESTS:,} per workload ({_HELD_IN_MEMORY})"
                )
            _set(self, "requests_per_user", per_user)
        if self.horizon_us is not None:
            horizon = check_time_us(self.horizon_us, "horizon_us")
            if horizon < 1:
                # As a count of 0 is: a workload that makes no request is a mistake.
                raise ValueError(f"horizon_us must be >= 1, got {horizon}")
            _set(self, "horizon_us", horizon)
        _set(self, "first_request_id", check_count(self.first_request_id, "first_request_id"))

    def start(self, env: Environment, engine: WorkloadEngine, seed: int) -> ClosedLoopRun:
        """Start one process per user on *env* (which must be ``engine.env``).

        Users submit their first requests at ``env.now``, in user order, once the
        simulation runs. Drive it with ``engine.run()`` or ``env.run()``. Returns the
        :class:`ClosedLoopRun` that records the submissions.
        """
        if env is not engine.env:
            raise ValueError("env must be the engine's own environment (engine.env)")
        if self.horizon_us is not None and self.horizon_us <= env.now:
            raise ValueError(
                f"horizon_us {self.horizon_us} is not after the time the users start "
                f"({env.now} us): they would make no request"
            )
        seed = check_seed(seed)
        run = ClosedLoopRun()
        ids = itertools.count(self.first_request_id)
        user_seeds = np.random.SeedSequence(seed).spawn(self.users)
        run._processes = tuple(
            env.process(self._user(env, engine, user, user_seeds[user], ids, run._submissions))
            for user in range(self.users)
        )
        return run

    def _user(
        self,
        env: Environment,
        engine: WorkloadEngine,
        user: int,
        seed: np.random.SeedSequence,
        ids: Iterator[int],
        log: list[ClosedLoopSubmission],
    ) -> Generator[simpy.Event, Any, None]:
        prompt_rng, output_rng, think_rng, patience_rng = (
            np.random.default_rng(child) for child in seed.spawn(4)
        )
        limit = self.requests_per_user
        horizon = self.horizon_us
        block = self.conversation_block_size_tokens
        context = 0  # a conversation's tokens so far: earlier prompts and answers
        index = 0
        while (limit is None or index < limit) and (horizon is None or env.now < horizon):
            request_id = next(ids)
            prompt = int(self.prompt_tokens.sample(prompt_rng, 1)[0])
            output = int(self.output_tokens.sample(output_rng, 1)[0])
            think = int(self.think_time_us.sample(think_rng, 1)[0])
            patience = (
                None if self.patience is None else int(self.patience.sample(patience_rng, 1)[0])
            )
            hashes = None
            if block is not None:
                # The whole conversation is resent with the new message; its full blocks
                # never change once full, so (user, block index) names each one.
                # The answer's blocks are named too: the next turn resends the answer.
                prompt += context
                if self.block_hashes:
                    hashes = tuple((f"u{user}", i) for i in range((prompt + output) // block))
            request = engine.submit(
                RequestSpec(request_id, env.now, prompt, output, block_hashes=hashes)
            )
            log.append(ClosedLoopSubmission(request_id, user, index, env.now, think, patience))
            done = engine.completion(request_id)
            if patience is None:
                yield done
            else:
                yield env.any_of([done, env.timeout(patience)])
                if not request.is_terminal:
                    engine.cancel_request(request_id)
            if block is not None:
                context = prompt + request.generated_token_count
            yield env.timeout(think)
            index += 1
