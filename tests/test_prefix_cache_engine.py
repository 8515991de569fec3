"""The batching server with a prefix cache (issue 15, step 2): sharing, pricing, equivalence."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import simsim
from simsim import (
    BatchingEngine,
    KvCacheConfig,
    Request,
    SimulatedBackend,
    SimulatedBackendConfig,
)
from simsim.scenario import ScenarioError, check_scenario, load_scenario, run_scenario

COSTS = SimulatedBackendConfig(prefill_base_us=100, prefill_per_token_us=10, decode_base_us=50)


def engine(blocks: int = 20, slots: int = 2) -> BatchingEngine:
    return BatchingEngine(
        SimulatedBackend(COSTS),
        max_active_requests=slots,
        kv_cache=KvCacheConfig(block_size_tokens=4, total_blocks=blocks),
        prefix_cache=True,
    )


def refused(path: Path, texts: Sequence[str], pattern: str) -> None:
    """Each of *texts*, written to *path*, is refused with a message matching *pattern*."""
    for text in texts:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ScenarioError, match=pattern):
            load_scenario(path)


def chain(*parts: str) -> tuple[str, ...]:
    return tuple("/".join(parts[: i + 1]) for i in range(len(parts)))


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    server = engine()
    server.submit(Request(0, 0, 12, 2, block_hashes=chain("s", "t", "a")))
    server.submit(Request(1, 1_000, 12, 2, block_hashes=chain("s", "t", "b")))
    server.run()
    first, second = server.requests[0], server.requests[1]
    assert first.cached_prompt_token_count == 0
    assert first.first_token_time_us == 100 + 10 * 12 + 50
    # Request 1 shares two blocks (8 tokens): it prefills 4.
    assert second.cached_prompt_token_count == 8
    assert second.first_token_time_us - 1_000 == 100 + 10 * 4 + 50
    assert server.kv_blocks_cached == 4  # s, s/t, s/t/a, s/t/b; nobody holds them


def test_a_whole_cached_prompt_still_computes_its_last_block() -> None:
    server = engine()
    server.submit(Request(0, 0, 8, 1, block_hashes=chain("p", "q")))
    server.submit(Request(1, 1_000, 8, 1, block_hashes=chain("p", "q")))
    server.run()
    # Every prompt token is cached, but one must be computed: the last block is recomputed.
    assert server.requests[1].cached_prompt_token_count == 4


def test_the_frames_and_the_engine_say_what_was_cached() -> None:
    server = engine()
    server.submit(Request(0, 0, 8, 1, block_hashes=chain("p", "q")))
    server.submit(Request(1, 1_000, 8, 1, block_hashes=chain("p", "r")))
    server.run()
    assert server.prefix_cache and server.kv_blocks_in_use == 0
    frame = server.requests_frame()
    assert frame.columns[-1] == "cached_prompt_tokens"  # appended, with a cache only
    assert frame["cached_prompt_tokens"].tolist() == [0, 4]
    iterations = server.iterations_frame()
    # Request 0's blocks (p, p/q) are cached once it leaves; request 1 takes p back and
    # leaves p/q cached through both of its iterations.
    assert iterations["kv_blocks_cached"].tolist() == [0, 0, 1, 1]
    plain = BatchingEngine(SimulatedBackend(COSTS), max_active_requests=1)
    plain.submit(Request(0, 0, 8, 1))
    plain.run()
    assert "cached_prompt_tokens" not in plain.requests_frame().columns
    assert "kv_blocks_cached" not in plain.iterations_frame().columns


def test_the_switch_needs_a_kv_cache_and_a_bool() -> None:
    with pytest.raises(ValueError, match="prefix_cache=True needs a kv_cache"):
        BatchingEngine(SimulatedBackend(COSTS), max_active_requests=1, prefix_cache=True)
    with pytest.raises(TypeError, match="prefix_cache must be True or False"):
        BatchingEngine(
            SimulatedBackend(COSTS),
            max_active_requests=1,
            kv_cache=KvCacheConfig(4, 4),
            prefix_cache=1,  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    "server",
    [
        lambda: simsim.SimulationEngine(SimulatedBackend(COSTS)),
        lambda: simsim.FastSimulationEngine(SimulatedBackend(COSTS)),
        lambda: BatchingEngine(SimulatedBackend(COSTS), max_active_requests=2),
        lambda: BatchingEngine(
            SimulatedBackend(COSTS), max_active_requests=2, kv_cache=KvCacheConfig(4, 20)
        ),
    ],
    ids=["single_slot", "fast", "batching", "batching_with_kv_cache"],
)
def test_block_hashes_without_a_prefix_cache_are_refused_at_submit(server: Any) -> None:
    # Once silently ignored: a request named blocks that nothing would ever share.
    engine_ = server()
    request = Request(3, 0, 12, 2, block_hashes=chain("s", "t", "a"))
    with pytest.raises(
        ValueError,
        match=r"^request 3 has block_hashes, but this server has no prefix cache to use them; "
        r"they would be ignored \(a BatchingEngine with a kv_cache and prefix_cache=True shares "
        r"the blocks they name\): leave them out, or give the server a prefix cache$",
    ):
        engine_.submit(request)
    # Before any state changed: nothing known, the request still pristine and free.
    assert dict(engine_.requests) == {} and engine_.scheduler_stats.enqueued == 0
    assert request.is_pristine and request._pending is None
    assert engine_.submit(Request(3, 0, 12, 2)).request_id == 3


def test_more_hashes_than_full_blocks_are_refused_at_submit() -> None:
    server = engine()
    with pytest.raises(
        ValueError, match="has 3 block_hashes, but its 10 prompt and 1 output tokens fill at most 2"
    ):
        server.submit(Request(0, 0, 10, 1, block_hashes=("a", "b", "c")))


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[int, int, int, tuple[str, ...]]]:
    count = draw(st.integers(1, 10))
    rows = []
    for _ in range(count):
        prompt = draw(st.integers(0, 24))
        output = draw(st.integers(0, 12))
        # Hashes may name the answer's blocks too (as a conversation's do).
        parts = draw(st.lists(st.sampled_from("xyz"), max_size=(prompt + output) // 4))
        rows.append((draw(st.integers(0, 3_000)), prompt, output, chain(*parts)))
    return rows


def _run(
    rows: list[tuple[int, int, int, tuple[str, ...]]],
    *,
    prefix_cache: bool,
    hashes: bool,
    blocks: int,
    policy: str,
) -> BatchingEngine:
    server = BatchingEngine(
        SimulatedBackend(COSTS),
        max_active_requests=3,
        max_batch_tokens=16 if policy == "mixed" else None,
        policy=policy,
        kv_cache=KvCacheConfig(block_size_tokens=4, total_blocks=blocks),
        prefix_cache=prefix_cache,
    )
    for rid, (arrival, prompt, output, keys) in enumerate(rows):
        server.submit(Request(rid, arrival, prompt, output, block_hashes=keys if hashes else None))
    server.run()
    return server


@settings(max_examples=150, deadline=None)
@given(
    rows=workloads(), blocks=st.integers(10, 30), policy=st.sampled_from(["prefill_first", "mixed"])
)
def test_without_hashes_the_cache_changes_nothing(
    rows: list[tuple[int, int, int, tuple[str, ...]]], blocks: int, policy: str
) -> None:
    """No request names its blocks: the same run as without a prefix cache, preemptions
    and all (a cache that can never hit is no cache)."""
    plain = _run(rows, prefix_cache=False, hashes=False, blocks=blocks, policy=policy)
    cached = _run(rows, prefix_cache=True, hashes=False, blocks=blocks, policy=policy)
    with_column = cached.requests_frame()
    assert (with_column.pop("cached_prompt_tokens") == 0).all()
    assert plain.requests_frame().equals(with_column)
    assert plain.events_frame().equals(cached.events_frame())
    iterations = cached.iterations_frame()
    assert (iterations.pop("kv_blocks_cached") == 0).all()
    assert plain.iterations_frame().equals(iterations)


@settings(max_examples=150, deadline=None)
@given(
    rows=workloads(), blocks=st.integers(10, 30), policy=st.sampled_from(["prefill_first", "mixed"])
)
def test_with_hashes_every_request_finishes_and_hits_stay_inside_the_prompt(
    rows: list[tuple[int, int, int, tuple[str, ...]]], blocks: int, policy: str
) -> None:
    server = _run(rows, prefix_cache=True, hashes=True, blocks=blocks, policy=policy)
    frame = server.requests_frame()
    assert (frame["state"] == "FINISHED").all()
    for request in server.requests.values():
        cached = request.cached_prompt_token_count
        assert cached % 4 == 0
        assert 0 <= cached <= max(0, request.prompt_token_count - 1)
        assert cached // 4 <= len(request.block_hashes or ())
        assert request.generated_token_count == request.max_output_tokens
    assert server.kv_blocks_in_use == 0
    assert server.kv_blocks_cached <= blocks
    iterations = server.iterations_frame()
    assert (iterations["kv_blocks_in_use"] <= blocks).all()


# ---------------------------------------------------------------------- an independent model


@st.composite
def sessions(draw: st.DrawFn) -> list[tuple[int, int, tuple[str, ...]]]:
    """Requests one after another (each arrives after the previous one has surely
    finished): (prompt tokens, output tokens, block hashes) drawn from a few
    conversations whose prompts grow turn by turn."""
    count = draw(st.integers(1, 12))
    rows = []
    for _ in range(count):
        conversation = draw(st.sampled_from("ABC"))
        turns = draw(st.integers(1, 5))
        parts = [f"{conversation}{i}" for i in range(turns)]
        prompt = 4 * turns + draw(st.integers(0, 3))
        rows.append((prompt, draw(st.integers(0, 5)), chain(*parts)))
    return rows


def model_hits(rows: list[tuple[int, int, tuple[str, ...]]]) -> list[int]:
    """Cached prompt tokens with a cache too large to evict: every full prompt block an
    earlier request published is still there; at least one token is computed."""
    published: set[str] = set()
    hits = []
    for prompt, _, keys in rows:
        limit = (prompt - 1) // 4 if prompt else 0
        matched = 0
        while matched < min(limit, len(keys)) and keys[matched] in published:
            matched += 1
        hits.append(4 * matched)
        # The chain stops being named where another copy of the block was published:
        # with requests one after another, that never happens, so all are published.
        published.update(keys)
    return hits


@settings(max_examples=100, deadline=None)
@given(rows=sessions())
def test_hits_agree_with_an_independent_model_of_sequential_sessions(
    rows: list[tuple[int, int, tuple[str, ...]]],
) -> None:
    server = engine(blocks=200, slots=2)
    for rid, (prompt, output, keys) in enumerate(rows):
        server.submit(Request(rid, 10_000 * rid, prompt, output, block_hashes=keys))
    server.run()
    hits = [server.requests[rid].cached_prompt_token_count for rid in range(len(rows))]
    assert hits == model_hits(rows)
    summary = simsim.summarize(server.requests_frame())["value"]
    prompts = sum(prompt for prompt, _, _ in rows)
    expected = sum(hits) / prompts if prompts else None
    if expected is not None:
        assert summary["prefix_cache_hit_rate_tokens"] == pytest.approx(expected)
    assert summary["prefix_cache_hit_rate_requests"] == pytest.approx(
        sum(hit > 0 for hit in hits) / len(rows)
    )


def test_ttft_falls_with_the_cached_fraction_as_the_cost_model_says() -> None:
    """The documented sanity result: a request whose prompt is cached up to k blocks
    prefills only the rest, so its TTFT falls linearly in k (10 us per token here)."""
    ttfts = []
    for shared in range(5):
        server = engine(blocks=50, slots=1)
        warm = tuple(f"w{i}" for i in range(shared))
        server.submit(Request(0, 0, 4 * shared, 0, block_hashes=chain(*warm)))
        keys = chain(*warm, *(f"n{i}" for i in range(5 - shared)))
        server.submit(Request(1, 10_000, 21, 1, block_hashes=keys))
        server.run()
        request = server.requests[1]
        ttfts.append(request.first_token_time_us - request.arrival_time_us)
    assert ttfts == [100 + 10 * (21 - 4 * k) + 50 for k in range(5)]


# ---------------------------------------------------------------------- scenario files

SCENARIO = """
[scenario]
engine = "batching"

[backend]
prefill_base_us = 100
prefill_per_token_us = 10
decode_base_us = 50

[batching]
max_active_requests = 2

[kv_cache]
block_size_tokens = 4
total_blocks = 20

[prefix_cache]
enabled = true

[[requests]]
request_id = 0
arrival_time_us = 0
prompt_token_count = 12
max_output_tokens = 2
block_hashes = [1, 2, 3]

[[requests]]
request_id = 1
arrival_time_us = 1_000
prompt_token_count = 12
max_output_tokens = 2
block_hashes = [1, 2, 4]
"""


def test_a_scenario_file_turns_the_cache_on_and_names_blocks(tmp_path: Path) -> None:
    path = tmp_path / "cached.toml"
    path.write_text(SCENARIO, encoding="utf-8")
    scenario = load_scenario(path)
    assert scenario.batching is not None and scenario.batching.prefix_cache
    server = run_scenario(scenario)
    assert server.requests_frame()["cached_prompt_tokens"].tolist() == [0, 8]
    # No prefix cache: block hashes would be ignored, so they are refused, naming the rule
    # (enabled = false leaves them out on purpose: see the baseline test below).
    off = SCENARIO.replace("[prefix_cache]\nenabled = true\n", "")
    refused(
        path,
        (off,),
        r"requests\[0\]\.block_hashes: needs engine = \"batching\" with \[kv_cache\] and "
        r"\[prefix_cache\]: only a prefix cache shares the blocks they name",
    )
    # Without them the file runs, with no hits and no column.
    path.write_text(re.sub(r"block_hashes = \[.*\]\n", "", off), encoding="utf-8")
    assert "cached_prompt_tokens" not in run_scenario(load_scenario(path)).requests_frame()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("[kv_cache]\nblock_size_tokens = 4\ntotal_blocks = 20\n", ""),
            "prefix_cache: needs [kv_cache]",
        ),
        (("enabled = true", "enabled = 1"), "prefix_cache.enabled: must be true or false"),
        (("enabled = true", "size = 3"), "prefix_cache.size: unknown key"),
        (
            ("block_hashes = [1, 2, 3]", "block_hashes = 3"),
            "requests[0].block_hashes: must be an array",
        ),
        (('engine = "batching"', 'engine = "single_slot"'), 'only for engine = "batching"'),
    ],
)
def test_bad_prefix_cache_tables_are_named(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    path = tmp_path / "bad.toml"
    text = SCENARIO.replace(*edit)
    if "single_slot" in edit[1]:
        text = text.replace("[batching]\nmax_active_requests = 2\n", "")
        text = text.replace("[kv_cache]\nblock_size_tokens = 4\ntotal_blocks = 20\n", "")
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError, match=re.escape(message)):
        load_scenario(path)


# ---------------------------------------------------------------------- shared system prompts


def test_shared_prefixes_put_a_group_prefix_in_front_of_every_prompt() -> None:
    from simsim.workloads import Fixed, OpenLoopWorkload, PoissonArrivals, SharedPrefixes

    base = OpenLoopWorkload(PoissonArrivals(5.0), Fixed(10), Fixed(3), count=50)
    shared = OpenLoopWorkload(
        PoissonArrivals(5.0),
        Fixed(10),
        Fixed(3),
        count=50,
        shared_prefixes=SharedPrefixes([9, 16], block_size_tokens=4, weights=[1, 0]),
    )
    plain, prefixed = base.generate(7).requests, shared.generate(7).requests
    # The four draws are those of the workload without prefixes; only the prompt grows.
    assert [r.arrival_time_us for r in plain] == [r.arrival_time_us for r in prefixed]
    assert {r.prompt_token_count for r in prefixed} == {9 + 10}  # weight 0: group 1 never
    first = prefixed[0]
    # 19 tokens: blocks 0 and 1 are the prefix's (9 // 4 = 2), block 2 mixes: its own.
    assert first.block_hashes == (("g0", 0), ("g0", 1), ("r0", 2), ("r0", 3))
    assert shared.generate(7).requests[0].block_hashes == first.block_hashes
    with pytest.raises(ValueError, match="one non-negative weight per prefix"):
        SharedPrefixes([4, 8], block_size_tokens=4, weights=[1])
    with pytest.raises(ValueError, match="at least one shared prefix"):
        SharedPrefixes([], block_size_tokens=4)


def test_shared_prefixes_refuse_a_request_that_could_never_fit_before_any_hash() -> None:
    from simsim.workloads import Fixed, OpenLoopWorkload, PoissonArrivals, SharedPrefixes

    prefixes = SharedPrefixes([64], block_size_tokens=16, total_blocks=10)
    # 64 + 90 prompt and 6 output tokens: exactly the 10 blocks of the cache.
    fits = OpenLoopWorkload(PoissonArrivals(1.0), Fixed(90), Fixed(6), 3, shared_prefixes=prefixes)
    assert [len(r.block_hashes or ()) for r in fits.generate(0).requests] == [9, 9, 9]
    # One more output token: the engine would refuse it at submit; refused at generation,
    # with the engine's own words, before one block hash exists.
    grown = OpenLoopWorkload(
        PoissonArrivals(1.0), Fixed(90), Fixed(7), 3, first_request_id=5, shared_prefixes=prefixes
    )
    engine_says = "needs 11 KV blocks for its 154 prompt and 7 output tokens, more than the whole "
    engine_says += "cache (10 blocks of 16 tokens); it could never run"
    with pytest.raises(ValueError, match=rf"^request 5 {re.escape(engine_says)}$"):
        grown.generate(0)
    server = BatchingEngine(
        SimulatedBackend(COSTS), max_active_requests=1, kv_cache=KvCacheConfig(16, 10)
    )
    with pytest.raises(ValueError, match=rf"^request 5 {re.escape(engine_says)}$"):
        server.submit(Request(5, 0, 154, 7))
    with pytest.raises(ValueError, match="total_blocks must be >= 1, got 0"):
        SharedPrefixes([64], block_size_tokens=16, total_blocks=0)


WORKLOAD = """
[scenario]
engine = "batching"
[backend]
prefill_base_us = 2000
prefill_per_token_us = 20
decode_base_us = 8000
[batching]
max_active_requests = 8
[kv_cache]
block_size_tokens = 16
total_blocks = 2000
[prefix_cache]
enabled = true
[workload]
count = 60
arrivals = { process = "poisson", rate_per_s = 5.0 }
prompt_tokens = { distribution = "uniform", low = 16, high = 256 }
output_tokens = [8, 64]
shared_prefixes = { lengths = [1024, 512], weights = [3, 1] }
"""


def test_a_scenario_workload_with_shared_prefixes_hits_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simsim.cli import main

    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD, encoding="utf-8")
    frame = run_scenario(load_scenario(path)).requests_frame()
    summary = simsim.summarize(frame)["value"]
    assert summary["prefix_cache_hit_rate_requests"] > 0.9
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "prefix cache  " in capsys.readouterr().out
    path.write_text(
        WORKLOAD.replace("[kv_cache]\nblock_size_tokens = 16\ntotal_blocks = 2000\n", "").replace(
            "[prefix_cache]\nenabled = true\n", ""
        ),
        encoding="utf-8",
    )
    with pytest.raises(
        ScenarioError,
        match=r"workload\.shared_prefixes: needs engine = \"batching\" with \[kv_cache\]",
    ):
        load_scenario(path)
    path.write_text(WORKLOAD.replace("lengths = [1024, 512]", "lengths = []"), encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"shared_prefixes\.lengths: must be a non-empty"):
        load_scenario(path)
    # A KV cache alone shares nothing: the hashes would be made and silently ignored.
    path.write_text(WORKLOAD.replace("[prefix_cache]\nenabled = true\n", ""), encoding="utf-8")
    with pytest.raises(
        ScenarioError,
        match=r"workload\.shared_prefixes: needs engine = \"batching\" with \[kv_cache\] and "
        r"\[prefix_cache\]",
    ):
        load_scenario(path)


def test_a_shared_prefix_prompt_too_big_for_the_cache_is_refused_before_generation(
    tmp_path: Path,
) -> None:
    # Once: 8.5 s and 1.35 GB of block hashes for 60 requests, then the engine's refusal.
    path = tmp_path / "w.toml"
    path.write_text(
        WORKLOAD.replace('{ distribution = "uniform", low = 16, high = 256 }', "2_000_000"),
        encoding="utf-8",
    )
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)  # its generated requests are made when it is loaded
    assert raised.value.key == "workload"
    assert re.fullmatch(
        r"request 0 needs \d+ KV blocks for its 200(1024|0512) prompt and \d+ output tokens, more "
        r"than the whole cache \(2000 blocks of 16 tokens\); it could never run",
        raised.value.rule,
    )


def test_the_size_check_before_generation_uses_the_largest_cache_of_a_cluster(
    tmp_path: Path,
) -> None:
    # 1024 + 256 + 64 tokens need 84 blocks: more than [kv_cache]'s 80 (the prefill pool),
    # fewer than the decode pool's 2000. The check before generation refuses only what no
    # replica could hold; the replica that cannot is named by the engine's own check.
    text = WORKLOAD.replace("total_blocks = 2000", "total_blocks = 80").replace(
        '{ distribution = "uniform", low = 16, high = 256 }', "256"
    )
    text = text.replace("output_tokens = [8, 64]", "output_tokens = 64")
    text = text.replace("lengths = [1024, 512], weights = [3, 1]", "lengths = [1024]")
    text += """
[cluster.prefill]
replicas = 1
[cluster.decode]
replicas = 1
total_blocks = 2000
[cluster.transfer]
kv_bytes_per_token = 1
bandwidth_bytes_per_s = 1_000_000
"""
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as raised:
        check_scenario(load_scenario(path))
    assert raised.value.key == "request 0"
    assert raised.value.rule.endswith("(on replica 0)")


def _sizes(frame: pd.DataFrame) -> list[tuple[int, int, int]]:
    columns = ["arrival_time_us", "prompt_token_count", "max_output_tokens"]
    return [tuple(row) for row in frame[columns].itertuples(index=False)]


def test_a_disabled_prefix_cache_runs_the_same_requests_naming_no_blocks(
    tmp_path: Path,
) -> None:
    # [prefix_cache] enabled = false is the baseline to compare a cache against: the same
    # requests (shared prefixes included in their prompts), no hashes, nothing cached.
    on, off = tmp_path / "on.toml", tmp_path / "off.toml"
    on.write_text(WORKLOAD, encoding="utf-8")
    off.write_text(WORKLOAD.replace("enabled = true", "enabled = false"), encoding="utf-8")
    cached = run_scenario(load_scenario(on))
    baseline = run_scenario(load_scenario(off))
    assert isinstance(cached, simsim.BatchingEngine) and isinstance(baseline, simsim.BatchingEngine)
    assert not baseline.prefix_cache
    assert all(request.block_hashes is None for request in baseline.requests.values())
    assert _sizes(baseline.requests_frame()) == _sizes(cached.requests_frame())
    assert "cached_prompt_tokens" not in baseline.requests_frame().columns
    # The cache is what made the difference: the same prompts, computed whole.
    ttft = [
        simsim.summarize(s.requests_frame())["value"]["ttft_us_mean"] for s in (cached, baseline)
    ]
    assert ttft[0] < ttft[1]
    # [[requests]] block_hashes are checked, then left out, the same way.
    listed = WORKLOAD.split("[workload]")[0].replace("enabled = true", "enabled = false")
    off.write_text(
        listed + "[[requests]]\nrequest_id = 0\narrival_time_us = 0\nprompt_token_count = 32\n"
        "max_output_tokens = 2\nblock_hashes = [1, 2]\n",
        encoding="utf-8",
    )
    (request,) = run_scenario(load_scenario(off)).requests.values()
    assert request.block_hashes is None and request.state is simsim.RequestState.FINISHED


def test_disabled_conversations_are_the_same_turns_naming_no_blocks(tmp_path: Path) -> None:
    closed = """[workload]
kind = "closed_loop"
users = 3
requests_per_user = 4
think_time_us = 1_000_000
prompt_tokens = [20, 120]
output_tokens = [20, 200]
conversation = true
"""
    head = WORKLOAD.split("[workload]")[0]
    on, off = tmp_path / "on.toml", tmp_path / "off.toml"
    on.write_text(head + closed, encoding="utf-8")
    off.write_text(head.replace("enabled = true", "enabled = false") + closed, encoding="utf-8")
    cached, baseline = run_scenario(load_scenario(on)), run_scenario(load_scenario(off))
    assert all(request.block_hashes is None for request in baseline.requests.values())
    # Turn one of each user is the same; later turns resend the conversation (which grows
    # with the answers, so sizes agree while the answers do: here, every turn finishes).
    assert _sizes(baseline.requests_frame())[:3] == _sizes(cached.requests_frame())[:3]
    frames = (cached.requests_frame(), baseline.requests_frame())
    assert [set(f["state"]) for f in frames] == [{"FINISHED"}, {"FINISHED"}]
    # Ids follow submission order, which timing changes: compare the turns' sizes.
    columns = ["prompt_token_count", "max_output_tokens"]
    turns = [sorted(f[columns].itertuples(index=False)) for f in frames]
    assert len(turns[0]) == 12 and turns[0] == turns[1]
    assert max(prompt for prompt, _ in turns[1]) > 120  # later turns resend the conversation


def test_block_hashes_false_is_checked() -> None:
    from simsim.workloads import (
        ClosedLoopWorkload,
        Fixed,
        OpenLoopWorkload,
        PoissonArrivals,
        SharedPrefixes,
    )

    with pytest.raises(TypeError, match="block_hashes must be True or False, got 1"):
        SharedPrefixes([64], block_size_tokens=16, block_hashes=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_hashes=False is for conversations"):
        ClosedLoopWorkload(3, Fixed(1), Fixed(1), Fixed(1), requests_per_user=1, block_hashes=False)
    plain = SharedPrefixes([9, 16], block_size_tokens=4, weights=[1, 3], block_hashes=False)
    named = SharedPrefixes([9, 16], block_size_tokens=4, weights=[1, 3])
    workloads = [
        OpenLoopWorkload(PoissonArrivals(1.0), Fixed(5), Fixed(2), 20, shared_prefixes=prefixes)
        for prefixes in (plain, named)
    ]
    made = [workload.generate(seed=3).requests for workload in workloads]
    assert [r.prompt_token_count for r in made[0]] == [r.prompt_token_count for r in made[1]]
    assert all(r.block_hashes is None for r in made[0])
    assert all(r.block_hashes for r in made[1])


# ---------------------------------------------------------------------- conversations


def test_each_turn_resends_the_conversation_and_hits_its_earlier_turns(tmp_path: Path) -> None:
    path = tmp_path / "conversation.toml"
    path.write_text(
        WORKLOAD.split("[workload]")[0]
        + """[workload]
kind = "closed_loop"
users = 3
requests_per_user = 4
think_time_us = 1_000_000
prompt_tokens = [20, 120]
output_tokens = [20, 200]
conversation = true
""",
        encoding="utf-8",
    )
    scenario = load_scenario(path)
    engine = run_scenario(scenario)
    requests = sorted(engine.requests.values(), key=lambda r: r.request_id)
    by_user: dict[str, list[Request]] = {}
    for request in requests:
        assert request.block_hashes is not None
        user = request.block_hashes[0][0] if request.block_hashes else None
        assert user is not None
        by_user.setdefault(user, []).append(request)
    assert len(by_user) == 3 and all(len(turns) == 4 for turns in by_user.values())
    for turns in by_user.values():
        for before, after in itertools.pairwise(turns):
            context = before.prompt_token_count + before.generated_token_count
            new = after.prompt_token_count - context
            assert 20 <= new <= 120  # the drawn new message
            # Independent of the engine: the earlier turn's full blocks, prompt and
            # answer, are cached; at least one token of the new prompt is computed.
            shared = min(context // 16, (after.prompt_token_count - 1) // 16)
            assert after.cached_prompt_token_count == 16 * shared
        assert turns[0].cached_prompt_token_count == 0
    # Without a prefix cache nothing shares the turns' blocks (a KV cache alone neither).
    text = path.read_text(encoding="utf-8").replace("[prefix_cache]\nenabled = true\n", "")
    refused(
        path,
        (text, text.replace("[kv_cache]\nblock_size_tokens = 16\ntotal_blocks = 2000\n", "")),
        r"workload\.conversation: needs engine = \"batching\" with \[kv_cache\] and "
        r"\[prefix_cache\]",
    )


def test_the_iterations_figure_stacks_the_cached_blocks(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from simsim import plots

    server = engine()
    server.submit(Request(0, 0, 8, 2, block_hashes=chain("p", "q")))
    server.submit(Request(1, 1_000, 8, 2, block_hashes=chain("p", "r")))
    server.run()
    figure = plots.draw_iterations(server.iterations_frame())
    labels = [text.get_text() for text in figure.axes[1].get_legend().get_texts()]
    assert labels == ["in use", "cached prefix blocks (evictable)"]
    assert figure.axes[1].get_ylabel() == "KV blocks"
    plots.plt.close(figure)


def test_the_worked_timeline_of_the_docs() -> None:
    """docs/batching.md, "Prefix caching": the three requests, iteration by iteration."""
    server = BatchingEngine(
        SimulatedBackend(COSTS),
        max_active_requests=2,
        kv_cache=KvCacheConfig(block_size_tokens=4, total_blocks=6),
        prefix_cache=True,
    )
    server.submit(Request(0, 0, 12, 2, block_hashes=chain("s", "t", "a")))
    server.submit(Request(1, 1_000, 12, 2, block_hashes=chain("s", "t", "b")))
    server.submit(Request(2, 2_000, 13, 1, block_hashes=chain("x", "y", "z")))
    server.run()
    iterations = server.iterations_frame()
    assert iterations["start_us"].tolist() == [0, 220, 270, 1000, 1140, 1190, 2000, 2230]
    assert iterations["kv_blocks_cached"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert iterations["kv_blocks_in_use"].tolist() == [4] * 8
    frame = server.requests_frame()
    assert frame["cached_prompt_tokens"].tolist() == [0, 8, 0]
    assert frame["ttft_us"].tolist() == [270, 190, 280]


@settings(max_examples=100, deadline=None)
@given(
    rows=workloads(), blocks=st.integers(10, 30), policy=st.sampled_from(["prefill_first", "mixed"])
)
def test_a_cache_that_can_never_be_shared_changes_nothing_but_recompute(
    rows: list[tuple[int, int, int, tuple[str, ...]]], blocks: int, policy: str
) -> None:
    """Every request names its blocks, but no two share one: nobody hits at a first
    admission, and unless a preempted request found its own blocks again when readmitted,
    the run is the run without a cache (cached blocks are only ever evicted, never in
    the way)."""
    unique = [
        (arrival, prompt, output, tuple(f"{rid}:{key}" for key in keys))
        for rid, (arrival, prompt, output, keys) in enumerate(rows)
    ]
    # Without a cache nothing uses the hashes (and the server refuses them): left out.
    plain = _run(unique, prefix_cache=False, hashes=False, blocks=blocks, policy=policy)
    cached = _run(unique, prefix_cache=True, hashes=True, blocks=blocks, policy=policy)
    assert all(r.cached_prompt_token_count == 0 for r in cached.requests.values())
    if (plain.events_frame()["event_type"] == "REQUEST_PREEMPTED").any():
        event("preempted: compared at first admission only")
        return  # a recomputed request may hit its own cached prompt: a real difference
    event("compared whole")
    frame = cached.requests_frame()
    frame.pop("cached_prompt_tokens")
    assert plain.requests_frame().equals(frame)
    assert plain.events_frame().equals(cached.events_frame())


@pytest.mark.parametrize(
    ("hashes", "error", "message"),
    [
        ((1, 1, 2), ValueError, "repeats a hash"),
        ({1, 2}, TypeError, "must be a sequence of hashes"),
        (5, TypeError, "must be a sequence of hashes"),
        ("ab", TypeError, "must be a sequence of hashes"),
        ([[1]], TypeError, "must be hashable values"),
    ],
)
def test_bad_block_hashes_are_refused_when_the_request_is_made(
    hashes: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Request(0, 0, 12, 1, block_hashes=hashes)  # type: ignore[arg-type]


def test_a_sweep_keeps_hit_rates_between_0_and_1() -> None:
    from simsim.sweeps.stats import metric_range

    assert metric_range("prefix_cache_hit_rate_tokens") == (0.0, 1.0)
    assert metric_range("prefix_cache_hit_rate_requests") == (0.0, 1.0)
