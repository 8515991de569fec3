"""The batching server's cost per generated token at batch sizes 1, 8 and 64, and the
prefix cache's cost on multi-turn conversations.

One iteration is one SimPy event whatever the batch size, so the events (and the wall
time) per generated token should fall roughly as 1 / batch size. The workload keeps
the batch full: every request arrives at time 0, with outputs of 64 to 192 tokens.
Each batch size runs twice in the same process, step by step (``stretches=False``, one
SimPy event per iteration) and with stretches (the default: a run of decode iterations
nothing interrupts is one event, ``docs/batching.md``), and the table gives the ratio;
``events`` counts iterations either way (``processed_event_count``).

The second table runs one cached-sessions workload (closed-loop conversations that
resend their history, 64 slots, a KV cache) with the prefix cache off and on, and
reports events per second of wall time for each and their ratio, measured in the same
process: what matching, sharing and evicting blocks cost the simulation; a third run
with a pool 100 times larger shows that this cost does not grow with the pool.

Run it:  python benchmarks/batching.py [--tokens N] [--quick]
Wall times are measured on this machine in one process; the simulated times are from
the cost model, never measured hardware performance.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass

import numpy as np

import simsim

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=2_000,
    prefill_per_token_us=50,
    prefill_per_active_sequence_us=100,
    decode_base_us=8_000,
    decode_per_active_sequence_us=300,
)
BATCH_SIZES = (1, 8, 64)


@dataclass(frozen=True)
class Result:
    """One batch size's run."""

    batch_size: int
    stretches: bool
    requests: int
    tokens: int
    events: int
    iterations: int
    wall_s: float

    @property
    def events_per_token(self) -> float:
        return self.events / self.tokens

    @property
    def wall_us_per_token(self) -> float:
        return self.wall_s * 1e6 / self.tokens


def run(batch_size: int, tokens_target: int, seed: int = 0, stretches: bool = True) -> Result:
    """Serve about *tokens_target* output tokens with *batch_size* slots."""
    rng = np.random.default_rng(seed)
    count = max(batch_size * 2, tokens_target // 128)
    prompts = rng.integers(16, 513, count).tolist()
    outputs = rng.integers(64, 193, count).tolist()
    gc.collect()  # the runs before leave no garbage for this one's collections to walk
    started = time.perf_counter()
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=batch_size,
        max_batch_tokens=max(512, batch_size),
        policy="mixed",
        stretches=stretches,
    )
    for request_id, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        engine.submit(simsim.Request(request_id, 0, prompt, output))
    engine.run()
    wall_s = time.perf_counter() - started
    return Result(
        batch_size=batch_size,
        stretches=stretches,
        requests=count,
        tokens=sum(outputs),
        events=engine.processed_event_count,
        iterations=len(engine.iteration_log),
        wall_s=wall_s,
    )


@dataclass(frozen=True)
class SessionResult:
    """The cached-sessions workload, with the prefix cache on or off."""

    prefix_cache: bool
    total_blocks: int
    requests: int
    events: int
    wall_s: float
    hit_rate_tokens: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s


def run_sessions(
    prefix_cache: bool, users: int, turns: int, seed: int = 0, total_blocks: int = 50_000
) -> SessionResult:
    """*users* conversations of *turns* turns on 64 slots, the prefix cache on or off."""
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=64,
        max_batch_tokens=4_096,
        policy="mixed",
        kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=total_blocks),
        prefix_cache=prefix_cache,
    )
    workload = simsim.workloads.ClosedLoopWorkload(
        users=users,
        think_time_us=simsim.workloads.Exponential(mean=2_000_000),
        prompt_tokens=simsim.workloads.Uniform(20, 200),
        output_tokens=simsim.workloads.Uniform(20, 120),
        requests_per_user=turns,
        conversation_block_size_tokens=16,
        block_hashes=prefix_cache,  # the same conversations, named only for a cache
    )
    started = time.perf_counter()
    workload.start(engine.env, engine, seed)
    engine.run()
    wall_s = time.perf_counter() - started
    frame = engine.requests_frame()
    hit = 0.0
    if prefix_cache:
        hit = float(frame["cached_prompt_tokens"].sum() / frame["prompt_token_count"].sum())
    return SessionResult(
        prefix_cache, total_blocks, len(frame), engine.processed_event_count, wall_s, hit
    )


def session_table(results: list[SessionResult]) -> str:
    """The cached-sessions runs as a Markdown table, with the on/off ratio."""
    off = next(r for r in results if not r.prefix_cache)
    lines = [
        "| prefix cache | KV blocks | requests | events | wall s | events/s | ratio to off "
        "| hit rate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {'on' if r.prefix_cache else 'off'} | {r.total_blocks:,} | {r.requests} "
            f"| {r.events} "
            f"| {r.wall_s:.3f} | {r.events_per_s:,.0f} | {r.events_per_s / off.events_per_s:.2f} "
            f"| {r.hit_rate_tokens:.1%} |"
        )
    return "\n".join(lines)


def table(results: list[Result], baselines: list[Result]) -> str:
    """The runs with stretches beside the step-by-step ones, as a Markdown table."""
    lines = [
        "| batch size | requests | tokens | events | iterations | events/token "
        "| wall us/token step by step | wall us/token | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r, b in zip(results, baselines, strict=True):
        lines.append(
            f"| {r.batch_size} | {r.requests} | {r.tokens} | {r.events} | {r.iterations} "
            f"| {r.events_per_token:.4f} | {b.wall_us_per_token:.2f} "
            f"| {r.wall_us_per_token:.2f} | {b.wall_s / r.wall_s:.1f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    """Run every batch size and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200_000, help="output tokens per run")
    parser.add_argument("--quick", action="store_true", help="a small run for the smoke test")
    args = parser.parse_args(argv)
    tokens = 5_000 if args.quick else args.tokens
    baselines = []
    results = []
    for size in BATCH_SIZES:  # alternated, so that both see the same machine
        baselines.append(run(size, tokens, stretches=False))
        results.append(run(size, tokens))
    print("BatchingEngine, mixed policy, all requests at t=0 (wall time on this machine)")
    print(table(results, baselines))
    users, turns = (20, 3) if args.quick else (400, 8)
    sessions = [run_sessions(cache, users, turns) for cache in (False, True)]
    # The same with a pool 100 times larger: no cache operation depends on its size.
    sessions.append(run_sessions(True, users, turns, total_blocks=5_000_000))
    print()
    print(
        f"Cached sessions: {users} conversations of {turns} turns, 64 slots, prefix cache "
        "off and on, and on with 100x the KV blocks (wall time on this machine, same process)"
    )
    print(session_table(sessions))
    return results


if __name__ == "__main__":
    main()
