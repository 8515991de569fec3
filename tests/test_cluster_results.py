"""Per-replica load balance in ``summarize`` and ``replica_summary`` (issue 16, results).

Hand-worked utilisations come from tiny clusters built here, their timelines written out
next to them; frames without replica columns must summarise exactly as before clusters
existed (``tests/golden/summarize_without_replicas.json`` holds that output, written by
the ``summarize`` of commit 572185a from the frames :func:`legacy_cases` builds).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import EASY_CONFIG
from test_disaggregation import LINK, pools

import simsim
from simsim.cluster import Cluster, DisaggregatedCluster
from simsim.results import replica_summary, requests_frame
from simsim.run_folder import read_run_folder, write_run_folder

GOLDEN = Path(__file__).parent / "golden" / "summarize_without_replicas.json"

EASY = EASY_CONFIG  # prefill = 100 + 2 * prompt tokens, decode step = 10 (microseconds)


def _requests(count: int, seed: int, gap_us: int, *, shared: bool = False) -> list[simsim.Request]:
    rng = random.Random(seed)
    now = 0
    requests = []
    for rid in range(count):
        now += round(rng.expovariate(1 / gap_us))
        prompt = rng.randint(8, 64)
        hashes = None
        if shared:  # two families of prompts sharing their first block
            family = rid % 2
            hashes = [(family, 0), *((rid, k) for k in range(1, prompt // 16))]
        requests.append(
            simsim.Request(
                rid,
                arrival_time_us=now,
                prompt_token_count=prompt,
                max_output_tokens=rng.randint(0, 6),
                block_hashes=hashes,
            )
        )
    return requests


def legacy_cases() -> Iterator[tuple[str, pd.DataFrame, dict[str, Any]]]:
    """(name, frame, summarize keyword arguments) for frames without replica columns."""
    single = simsim.SimulationEngine(simsim.SimulatedBackend(EASY))
    for request in _requests(12, seed=3, gap_us=150):
        single.submit(request)
    single.run_next_timestamp()
    single.cancel_request(11)  # still to arrive
    while single.run_next_timestamp() is not None:
        if single.now_us >= 600 and single.requests[5].state.name == "WAITING":
            single.cancel_request(5)  # queued
    batching = simsim.BatchingEngine(
        simsim.SimulatedBackend(EASY),
        max_active_requests=3,
        kv_cache=simsim.KvCacheConfig(16, 40),
        prefix_cache=True,
    )
    for request in _requests(20, seed=5, gap_us=60, shared=True):
        batching.submit(request)
    batching.run()
    frames = {
        "single": single.requests_frame(),
        "batching": batching.requests_frame(),
        "empty": single.requests_frame().iloc[0:0],
    }
    arguments: dict[str, dict[str, Any]] = {
        "plain": {},
        "slots_slos": {"slots": 3, "ttft_slo_us": 400, "tpot_slo_us": 12},
        "window": {"warmup_us": 300, "until_us": 1_500, "percentiles": (50, 99.9), "slots": 1},
    }
    for frame_name, frame in frames.items():
        for argument_name, kwargs in arguments.items():
            if frame_name == "empty" and "warmup_us" in kwargs:
                continue
            yield f"{frame_name}/{argument_name}", frame, kwargs


def _summary_text(frame: pd.DataFrame, kwargs: dict[str, Any]) -> str:
    return str(simsim.summarize(frame, **kwargs).to_csv())


def _write_golden() -> None:  # run once, with the summarize of commit 572185a
    golden = {name: _summary_text(frame, kwargs) for name, frame, kwargs in legacy_cases()}
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------- unchanged output


def test_summarize_is_unchanged_for_frames_without_replica_columns() -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    cases = list(legacy_cases())
    assert sorted(name for name, _, _ in cases) == sorted(golden)
    for name, frame, kwargs in cases:
        assert _summary_text(frame, kwargs) == golden[name], name


def test_a_cluster_frame_adds_rows_after_the_same_ones() -> None:
    frame = tiny_cluster().requests_frame()
    for kwargs in ({}, {"slots": 1, "ttft_slo_us": 300}, {"warmup_us": 300}):
        with_replicas = simsim.summarize(frame, **kwargs)
        without = simsim.summarize(frame.drop(columns="replica"), **kwargs)
        assert list(with_replicas.index[: len(without)]) == list(without.index)
        pd.testing.assert_frame_equal(with_replicas.iloc[: len(without)], without)
        assert list(with_replicas.index[len(without) :]) == BALANCE_ROWS


# ---------------------------------------------------------------------- a tiny cluster

BALANCE_ROWS = [
    "replicas",
    "replica_requests_min",
    "replica_requests_max",
    "replica_load_imbalance",
    "replica_utilization_min",
    "replica_utilization_mean",
    "replica_utilization_max",
    "replica_utilization_spread",
]

# Two single-slot replicas, round robin (prefill = 100 + 2 * prompt, decode step = 10):
#   request: arrival, prompt, output -> replica: admit, prefill end, finish
#   0:         0,     50,     2      -> 0:       0,   200,         220
#   1:        10,      0,     1      -> 1:      10,   110,         120
#   2:       300,      0,     0      -> 0:     300,   400,         400 (no output)
#   3:       320,     25,     1      -> 1:     320,   470,         480
#   4:       330,      0,     1      -> 0:     400,   500,         510
# Window [0, 510): replica 0 holds [0, 220) + [300, 510) = 430 us, replica 1
# [10, 120) + [320, 480) = 270 us.
TINY = [(0, 50, 2), (10, 0, 1), (300, 0, 0), (320, 25, 1), (330, 0, 1)]


def tiny_cluster() -> Cluster:
    env = simsim.Environment()
    replicas = [simsim.SimulationEngine(simsim.SimulatedBackend(EASY), env=env) for _ in range(2)]
    cluster = Cluster(replicas, "round_robin")
    for rid, (arrival, prompt, output) in enumerate(TINY):
        cluster.submit(simsim.Request(rid, arrival, prompt, output))
    cluster.run()
    return cluster


def _rows(summary: pd.DataFrame, names: list[str]) -> list[float]:
    return [float(summary.loc[name, "value"]) for name in names]


def test_the_tiny_cluster_runs_as_worked_out() -> None:
    frame = tiny_cluster().requests_frame()
    assert list(frame["replica"]) == [0, 1, 0, 1, 0]
    assert list(frame["admit_time_us"]) == [0, 10, 300, 320, 400]
    assert list(frame["finish_time_us"]) == [220, 120, 400, 480, 510]


def test_hand_computed_load_balance_of_the_tiny_cluster() -> None:
    summary = simsim.summarize(tiny_cluster().requests_frame())
    assert _rows(summary, BALANCE_ROWS) == pytest.approx(
        [2, 2, 3, 3 / 2.5, 270 / 510, 350 / 510, 430 / 510, 160 / 510]
    )


def test_replica_summary_of_the_tiny_cluster() -> None:
    table = replica_summary(tiny_cluster().requests_frame())
    assert list(table.columns) == [
        "replica",
        "requests",
        "finished",
        "prompt_tokens",
        "generated_tokens",
        "utilization",
        "ttft_us_mean",
        "ttft_us_p99",
        "e2e_latency_us_mean",
        "e2e_latency_us_p99",
    ]
    assert list(table["replica"]) == [0, 1]
    assert list(table["requests"]) == [3, 2]
    assert list(table["finished"]) == [3, 2]
    assert list(table["prompt_tokens"]) == [50, 25]
    assert list(table["generated_tokens"]) == [3, 2]
    assert list(table["utilization"]) == pytest.approx([430 / 510, 270 / 510])
    # TTFT: replica 0 has requests 0 (210) and 4 (180; 2 has no first token), replica 1
    # requests 1 (110) and 3 (160); e2e adds request 2 (100) on replica 0.
    assert list(table["ttft_us_mean"]) == pytest.approx([195, 135])
    assert list(table["ttft_us_p99"]) == pytest.approx([180 + 0.99 * 30, 110 + 0.99 * 50])
    assert list(table["e2e_latency_us_mean"]) == pytest.approx([(220 + 100 + 180) / 3, 135])
    assert table["e2e_latency_us_p99"][1] == pytest.approx(110 + 0.99 * 50)


def test_the_window_selects_requests_and_cuts_the_utilisation() -> None:
    frame = tiny_cluster().requests_frame()
    # [300, 500): requests 2, 3, 4 arrived in it; replica 0 holds [300, 500) (request 4
    # cut at 500), replica 1 [320, 480); the earlier requests hold nothing in it.
    summary = simsim.summarize(frame, warmup_us=300, until_us=500)
    assert _rows(summary, BALANCE_ROWS) == pytest.approx([2, 1, 2, 2 / 1.5, 0.8, 0.9, 1.0, 0.2])
    # [0, 200): only requests 0 and 1 arrived; replica 0 [0, 200), replica 1 [10, 120).
    table = replica_summary(frame, until_us=200)
    assert list(table["requests"]) == [1, 1]
    assert list(table["utilization"]) == pytest.approx([1.0, 110 / 200])


def test_replicas_counts_a_replica_that_received_nothing() -> None:
    frame = tiny_cluster().requests_frame()
    summary = simsim.summarize(frame, replicas=3)
    assert _rows(summary, BALANCE_ROWS) == pytest.approx(
        [3, 0, 3, 3 / (5 / 3), 0, 700 / 510 / 3, 430 / 510, 430 / 510]
    )
    table = replica_summary(frame, replicas=3)
    assert list(table["replica"]) == [0, 1, 2]
    assert table.loc[2, "requests"] == 0 and table.loc[2, "utilization"] == 0
    assert math.isnan(table.loc[2, "ttft_us_mean"])


def test_bad_replicas_and_non_cluster_frames_are_refused() -> None:
    frame = tiny_cluster().requests_frame()
    with pytest.raises(ValueError, match=r"replica holds \[1\], outside the replicas 0\.\.0"):
        simsim.summarize(frame, replicas=1)
    with pytest.raises(ValueError, match="replicas must be an int >= 1"):
        simsim.summarize(frame, replicas=(1, 1))
    with pytest.raises(ValueError, match=r"no replica column .* replicas=2 does not apply"):
        simsim.summarize(frame.drop(columns="replica"), replicas=2)
    with pytest.raises(ValueError, match="no replica column"):
        replica_summary(frame.drop(columns="replica"))
    with pytest.raises(ValueError, match="replica must hold replica indices"):
        replica_summary(frame.assign(replica=frame["replica"] - 1))


def _hand_frame(rows: list[tuple[int, int | None, int | None, int]]) -> pd.DataFrame:
    """Requests (arrival, admit, finish, replica): finished if a finish time is given."""
    requests = []
    for rid, (arrival, admit, finish, _) in enumerate(rows):
        done = finish is not None
        requests.append(
            simsim.Request(
                rid,
                arrival,
                10,
                1,
                state=simsim.RequestState.FINISHED if done else simsim.RequestState.DECODING,
                generated_token_count=1 if done else 0,
                admit_time_us=admit,
                prefill_end_time_us=None if admit is None else admit + 1,
                first_token_time_us=finish,
                finish_time_us=finish,
            )
        )
    frame = requests_frame(requests)
    frame["replica"] = pd.array([row[3] for row in rows], dtype="Int64")
    return frame


def test_utilisation_is_the_union_of_overlapping_holds() -> None:
    # Replica 0 (batching, say): [0, 50), [20, 40), [30, 90), [120, 150) -> 90 + 30 us;
    # replica 1 still runs a request admitted at 100 (cut at the window's end, 150).
    frame = _hand_frame(
        [(0, 0, 50, 0), (5, 20, 40, 0), (6, 30, 90, 0), (100, 120, 150, 0), (100, 100, None, 1)]
    )
    table = replica_summary(frame)
    assert list(table["utilization"]) == pytest.approx([120 / 150, 50 / 150])


# ---------------------------------------------------------------------- disaggregation


def disaggregated(prefill: int = 1, decode: int = 1) -> DisaggregatedCluster:
    """test_disaggregation's pools and link: prefill = 1,000 + 20 * prompt tokens, a
    decode step 5,000 + 100 per sequence, a 100-token transfer 1,500 us."""
    _, prefill_pool, decode_pool = pools(prefill, decode)
    return DisaggregatedCluster(prefill_pool, decode_pool, LINK)


def handed_off_and_kept() -> DisaggregatedCluster:
    """A disaggregated run of two requests: request 0 prefills on replica 0 over
    [0, 3,000), its KV cache moves to replica 1 over [3,000, 4,500), and it decodes
    there until 19,800; request 1 (no output) finishes on replica 0 at its prefill's
    end: [20,000, 23,000)."""
    cluster = disaggregated()
    cluster.submit(simsim.Request(0, 0, 100, 3))
    cluster.submit(simsim.Request(1, 20_000, 100, 0))
    cluster.run()
    return cluster


def test_hand_computed_disaggregated_load_balance() -> None:
    # handed_off_and_kept(): window [0, 23,000).
    frame = handed_off_and_kept().requests_frame()
    assert list(frame["finish_time_us"]) == [19_800, 23_000]
    assert list(frame["transfer_start_us"].astype(object)) == [3_000, pd.NA]
    summary = simsim.summarize(frame)
    names = [f"{pool}_{row}" for pool in ("prefill", "decode") for row in BALANCE_ROWS]
    assert list(summary.index[-len(names) :]) == names
    prefill = [1, 2, 2, 1, 6_000 / 23_000, 6_000 / 23_000, 6_000 / 23_000, 0]
    decode = [1, 1, 1, 1, 16_800 / 23_000, 16_800 / 23_000, 16_800 / 23_000, 0]
    assert _rows(summary, names) == pytest.approx(prefill + decode)
    table = replica_summary(frame)
    assert list(table["pool"]) == ["prefill", "decode"]
    assert list(table["replica"]) == [0, 1]
    assert list(table["requests"]) == [2, 1]
    assert list(table["generated_tokens"]) == [3, 3]


def test_disaggregated_pools_from_replicas_and_the_window() -> None:
    cluster = disaggregated(prefill=2, decode=2)
    for rid in range(4):
        cluster.submit(simsim.Request(rid, rid * 1_000, 100, 2))
    cluster.run()
    frame = cluster.requests_frame()
    assert set(frame["prefill_replica"]) == {0, 1} and set(frame["decode_replica"]) <= {2, 3}
    table = replica_summary(frame, replicas=(2, 3), warmup_us=1_000)
    assert list(table["pool"]) == ["prefill"] * 2 + ["decode"] * 3
    assert list(table["replica"]) == [0, 1, 2, 3, 4]
    assert int(table["requests"].sum()) == 2 * 3  # requests 1, 2, 3, once per pool
    summary = simsim.summarize(frame, replicas=(2, 2))
    assert summary.loc["prefill_replicas", "value"] == 2
    assert summary.loc["decode_replicas", "value"] == 2
    with pytest.raises(ValueError, match=r"decode_replica holds \[2\], outside .* 3\.\.4"):
        simsim.summarize(frame, replicas=(3, 2))
    with pytest.raises(ValueError, match="a pair of ints >= 1"):
        simsim.summarize(frame, replicas=4)
    with pytest.raises(ValueError, match="lacks \\['transfer_start_us'\\]"):
        simsim.summarize(frame.drop(columns="transfer_start_us"))


# ---------------------------------------------------------------------- run folders


def cluster_tables(cluster: Cluster) -> dict[str, pd.DataFrame]:
    return {
        "requests": cluster.requests_frame(),
        "events": cluster.events_frame(),
        "admissions": cluster.admissions_frame(),
        "summary": simsim.summarize(cluster.requests_frame()).reset_index(),
    }


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_cluster_tables_read_back_with_their_dtypes(tmp_path: Path, fmt: str) -> None:
    plain = tiny_cluster()
    split = disaggregated(prefill=2, decode=1)
    for rid in range(4):
        split.submit(simsim.Request(rid, rid * 1_000, 100, rid % 3))
    split.submit(simsim.Request(9, 50_000, 10, 2))
    split.cancel_request(9)  # never routed: <NA> in every replica column
    split.run()
    for cluster in (plain, split):
        frames = cluster_tables(cluster)
        if isinstance(cluster, DisaggregatedCluster):
            frames["iterations"] = cluster.iterations_frame()
            assert frames["requests"]["transfer_us"].isna().sum() == 3  # 0 outputs, cancelled
        write_run_folder(tmp_path, frames, format=fmt)  # type: ignore[arg-type]
        folder = read_run_folder(tmp_path)
        for name, frame in frames.items():
            pd.testing.assert_frame_equal(folder.table(name), frame, check_dtype=True)


def test_a_pool_that_got_no_request_summarizes_with_zero_counts() -> None:
    env = simsim.Environment()
    costs = simsim.SimulatedBackendConfig(1_000, 20, 0, 5_000, 0)
    cluster = simsim.Cluster(
        [simsim.SimulationEngine(simsim.SimulatedBackend(costs), env=env) for _ in range(2)]
    )
    cluster.submit(simsim.Request(0, 100, 10, 2))
    cluster.cancel_request(0)  # before its arrival: never routed
    cluster.run()
    summary = simsim.summarize(cluster.requests_frame(), replicas=2)["value"]
    assert (summary["replicas"], summary["replica_requests_max"]) == (2, 0)
    table = replica_summary(cluster.requests_frame(), replicas=2)
    assert table["requests"].tolist() == [0, 0] and table["finished"].tolist() == [0, 0]
    # a disaggregated run whose requests all end on the prefill replica
    _env, prefill, decode = pools(1, 2)
    split = simsim.DisaggregatedCluster(prefill, decode, LINK)
    split.submit(simsim.Request(0, 0, 10, 0))
    split.run()
    summary = simsim.summarize(split.requests_frame(), replicas=(1, 2))["value"]
    assert (summary["decode_replicas"], summary["decode_replica_requests_max"]) == (2, 0)
    assert replica_summary(split.requests_frame(), replicas=(1, 2))["finished"].tolist() == [
        1,
        0,
        0,
    ]
