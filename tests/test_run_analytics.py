"""What a run produced, from Python: ``results.run_tables`` and the server-load figures
``simsim run`` prints (issue 25, points 5 and 6), and the thin CLI around them.

Batch sizes and KV use are checked against hand-made iteration tables whose
time-weighted means are worked out next to them; the run recipe is checked on real
servers, and a sweep of ``examples/scenarios/batching.toml`` must now report the
occupancy rows that ``simsim run`` prints, so that a capacity search can target them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
from pathlib import Path

import pandas as pd
import pytest
from test_cluster_results import disaggregated, handed_off_and_kept, tiny_cluster

import simsim
from simsim import results
from simsim.cli import UsageError
from simsim.cli.app import COMMANDS
from simsim.cli.parser import build_parser
from simsim.cli.shared import check_seed
from simsim.sweeps.capacity import OCCUPANCY_TARGETS, target_metrics

BATCHING = Path(__file__).parent.parent / "examples" / "scenarios" / "batching.toml"
OCCUPANCY = ["mean_queue_length", "mean_active_requests", "utilization"]


def _iterations(rows: list[tuple[int, int, int, int, bool]]) -> pd.DataFrame:
    """(start, end, batch size, KV blocks in use, abandoned) per iteration."""
    columns = ["start_us", "end_us", "batch_size", "kv_blocks_in_use", "abandoned"]
    return pd.DataFrame(rows, columns=columns)


def _events(preemptions: int) -> pd.DataFrame:
    return pd.DataFrame({"event_type": ["REQUEST_ARRIVAL"] + ["REQUEST_PREEMPTED"] * preemptions})


# Three iterations ran: [0, 10) with 2 requests and 20 blocks, [10, 40) with 4 and 40,
# [40, 50) with 1 and 10; one was abandoned (it does not weigh). Over 50 us the batch
# is (2*10 + 4*30 + 1*10) / 50 = 3 requests and the KV cache holds
# (20*10 + 40*30 + 10*10) / 50 = 30 blocks of 100: 30% on average, 40% at the peak.
HAND = [(0, 10, 2, 20, False), (10, 40, 4, 40, False), (40, 50, 1, 10, False)]
ABANDONED = (50, 90, 9, 90, True)


def test_batch_summary_weighs_each_iteration_by_its_length() -> None:
    load = results.batch_summary(_iterations([*HAND, ABANDONED]), _events(2), kv_blocks=100)
    assert load.to_dict() == pytest.approx(
        {
            "iterations": 4,
            "preemptions": 2,
            "mean_batch_size": 3.0,
            "kv_cache_blocks": 100,
            "kv_cache_use_mean": 0.3,
            "kv_cache_use_peak": 0.4,
        }
    )


def test_batch_summary_of_a_cluster_takes_each_replica_s_own_cache() -> None:
    # Replica 0 (100 blocks) holds 20 over [0, 10); replica 1 (50 blocks) holds 40 over
    # [0, 30): shares 0.2 and 0.8, weighed 10 and 30: (2 + 24) / 40 = 0.65.
    iterations = _iterations([(0, 10, 1, 20, False), (0, 30, 3, 40, False)])
    iterations["replica"] = [0, 1]
    load = results.batch_summary(iterations, _events(0), kv_blocks={0: 100, 1: 50})
    assert load["kv_cache_blocks"] == 150
    assert load["kv_cache_use_mean"] == pytest.approx(0.65)
    assert load["kv_cache_use_peak"] == pytest.approx(0.8)
    assert load["mean_batch_size"] == pytest.approx((10 + 90) / 40)


def test_batch_summary_without_a_timed_iteration_has_no_means() -> None:
    load = results.batch_summary(_iterations([ABANDONED]), _events(0), kv_blocks=100)
    assert load["iterations"] == 1
    assert math.isnan(load["mean_batch_size"])
    assert math.isnan(load["kv_cache_use_mean"])
    assert "kv_cache_blocks" not in results.batch_summary(_iterations(HAND), _events(0))


def test_prefix_cache_summary_counts_tokens_and_requests() -> None:
    requests = pd.DataFrame(
        {"prompt_token_count": [100, 50, 50], "cached_prompt_tokens": [64, 0, 16]}
    )
    cache = results.prefix_cache_summary(requests)
    assert cache.to_dict() == pytest.approx(
        {
            "requests": 3,
            "hit_requests": 2,
            "prompt_tokens": 200,
            "cached_prompt_tokens": 80,
            "hit_rate_tokens": 0.4,
            "hit_rate_requests": 2 / 3,
        }
    )
    empty = results.prefix_cache_summary(requests.iloc[:0])
    assert math.isnan(empty["hit_rate_tokens"]) and math.isnan(empty["hit_rate_requests"])


def test_replica_requests_of_a_cluster_counts_an_idle_replica() -> None:
    frame = tiny_cluster().requests_frame()  # replicas 0, 1, 0, 1, 0; all finish
    table = results.replica_requests(frame, replicas=3)
    assert table["replica"].tolist() == [0, 1, 2]
    assert table["routed"].tolist() == [3, 2, 0]
    assert table["finished"].tolist() == [3, 2, 0]
    assert table["handed_off"].isna().all()
    assert set(table["pool"]) == {""}


def test_replica_requests_and_transfers_of_a_disaggregated_cluster() -> None:
    # Request 0 is handed from prefill replica 0 to decode replica 1 and finishes
    # there; request 1 (no output) finishes on the prefill replica.
    frame = handed_off_and_kept().requests_frame()
    table = results.replica_requests(frame, replicas=(1, 1))
    assert table["pool"].tolist() == ["prefill", "decode"]
    assert table["routed"].tolist() == [2, 1]
    assert table["finished"].tolist() == [1, 1]
    assert table["handed_off"].tolist()[0] == 1 and pd.isna(table["handed_off"].iloc[1])
    moved = results.transfer_summary(frame)
    assert moved.to_dict() == {
        "transfers": 1.0,
        "transfer_us_mean": 1_500.0,
        "transfer_us_max": 1_500.0,
    }
    assert results.transfer_summary(tiny_cluster().requests_frame())["transfers"] == 0


def test_latency_counts_say_whom_each_latency_covers() -> None:
    engine = simsim.SimulationEngine(
        simsim.SimulatedBackend(simsim.SimulatedBackendConfig(0, 1, 0, 10, 0))
    )
    for rid, output in enumerate([3, 1, 0, 2]):  # request 3 is cancelled while queued
        engine.submit(simsim.Request(rid, 0, 8, output))
    engine.run_next_timestamp()
    engine.cancel_request(3)
    engine.run()
    counts = results.latency_counts(engine.requests_frame())
    assert counts.to_dict() == {
        "queue_delay_us": 3,
        "ttft_us": 2,
        "e2e_latency_us": 3,
        "tpot_us": 1,
    }
    cluster = disaggregated()
    cluster.submit(simsim.Request(0, 0, 100, 3))
    cluster.run()
    assert results.latency_counts(cluster.requests_frame())["decode_queue_delay_us"] == 1


def test_run_tables_of_a_batching_engine_have_iterations_and_occupancy() -> None:
    engine = simsim.BatchingEngine(
        simsim.SimulatedBackend(simsim.SimulatedBackendConfig(0, 1, 0, 10, 0)),
        max_active_requests=4,
    )
    for rid in range(6):
        engine.submit(simsim.Request(rid, 5 * rid, 8, 3))
    engine.run()
    tables = results.run_tables(engine)
    assert list(tables) == ["requests", "events", "admissions", "iterations", "summary"]
    summary = tables["summary"].set_index("metric")["value"]
    expected = simsim.summarize(tables["requests"], slots=4)["value"]
    overload = list(results.OVERLOAD_METRICS)
    pd.testing.assert_series_equal(summary.drop(overload), expected)
    assert list(summary.index[-len(overload) :]) == overload
    assert summary["overloaded"] == 0
    assert results.server_slots(engine) == (4, None)


def test_run_summary_of_clusters_counts_their_slots_and_replicas() -> None:
    cluster = tiny_cluster()
    assert results.server_slots(cluster) == (2, 2)
    assert "iterations" not in results.run_tables(cluster)
    summary = results.run_summary(cluster)["value"]
    assert summary["replicas"] == 2
    assert summary["utilization"] == pytest.approx(summary["mean_active_requests"] / 2)
    split = disaggregated(prefill=2, decode=1)
    split.submit(simsim.Request(0, 0, 100, 3))
    split.run()
    assert results.server_slots(split) == ((8, 4), (2, 1))
    rows = results.run_summary(split)["value"]
    assert rows["prefill_replicas"] == 2 and "decode_utilization" in rows


def test_a_sweep_of_the_batching_example_reports_occupancy() -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        swept = simsim.sweep(BATCHING, {"workload.count": [40]}, replications=2, executor=pool)
    for metric in OCCUPANCY:
        assert metric in swept.runs.columns
        assert (swept.runs[metric] > 0).all()
    assert (swept.runs["utilization"] <= 1).all()


def test_a_capacity_search_can_target_utilization() -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        found = simsim.capacity_search(
            BATCHING,
            "workload.rate_per_s",
            low=1.0,
            high=40.0,
            tolerance=4.0,
            targets={"utilization": 0.5},
            replications=2,
            settings={"workload.count": 40},
            executor=pool,
        )
    assert found.status == "found"
    assert "utilization_mean" in found.evaluations.columns
    meets = found.evaluations[found.evaluations["verdict"] == "meets"]
    assert (meets["utilization_ci_high"] <= 0.5).all()


def test_occupancy_targets_are_accepted_and_a_model_without_them_is_named() -> None:
    checked, _ = target_metrics({"utilization": 0.8, "decode_mean_queue_length": 2})
    assert checked == {"utilization": 0.8, "decode_mean_queue_length": 2.0}
    assert set(OCCUPANCY) <= set(OCCUPANCY_TARGETS)
    with pytest.raises(ValueError, match="occupancy metric"):
        target_metrics({"utilisation": 0.8})

    def model(settings: dict[str, object], seed: int) -> pd.DataFrame:
        return results.requests_frame([simsim.Request(0, 0, 1, 1)])

    with pytest.raises(ValueError, match="the runs report no 'utilization'"):
        simsim.capacity_search(
            model,
            "x",
            low=1,
            high=4,
            targets={"utilization": 0.5},
            replications=2,
            executor=concurrent.futures.ThreadPoolExecutor(max_workers=1),
        )


# ---------------------------------------------------------------------- the CLI package


def test_every_command_is_dispatched_through_the_table() -> None:
    parser = build_parser()
    commands = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    )
    assert set(COMMANDS) == set(commands.choices)


def test_a_flag_error_is_a_usage_error_naming_the_flag() -> None:
    with pytest.raises(UsageError) as caught:
        check_seed(-1)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value) == "--seed: must be >= 0, got -1"
    assert (caught.value.flag, caught.value.rule) == ("--seed", "must be >= 0, got -1")
    check_seed(None)
    check_seed(2**63 - 1)


def test_the_library_figures_refuse_what_they_cannot_read_with_a_named_rule() -> None:
    iterations = pd.DataFrame(
        {
            "start_us": [0],
            "end_us": [10],
            "batch_size": [1],
            "kv_blocks_in_use": [1],
            "prefill_tokens": [0],
            "abandoned": [False],
        }
    )
    events = pd.DataFrame(columns=["timestamp_us", "sequence", "event_type", "request_id"])
    for bad, error in ((0, ValueError), (-3, ValueError), (1.5, TypeError)):
        with pytest.raises(error, match="kv_blocks"):
            results.batch_summary(iterations, events, kv_blocks=bad)
    with pytest.raises(ValueError, match=r"kv_blocks\[1\] must be >= 1"):
        results.batch_summary(iterations, events, kv_blocks={0: 4, 1: 0})
    plain = pd.DataFrame({"request_id": [0], "prompt_token_count": [4]})
    with pytest.raises(ValueError, match="needs a requests frame with cached_prompt_tokens"):
        results.prefix_cache_summary(plain)


def test_an_unknown_capacity_target_gets_a_guess() -> None:
    with pytest.raises(
        ValueError, match=r"unknown metric 'utilisation' \(did you mean 'utilization'\?\)"
    ):
        target_metrics({"utilisation": 0.8})


def test_the_serve_banner_names_the_engine_class_that_serves(tmp_path: Path) -> None:
    from simsim.cli.serve import served_as
    from simsim.scenario import load_scenario

    path = tmp_path / "fast.toml"
    path.write_text(
        '[scenario]\nengine = "single_slot_fast"\n[backend]\ndecode_base_us = 1\n'
        "[cluster]\nreplicas = 2\n"
    )
    scenario = load_scenario(path, require_requests=False)
    assert served_as(scenario, scenario.build_served()) == (
        "cluster of 2 replicas, router round_robin, engine SimulationEngine"
    )


def test_submit_names_both_kinds_it_takes() -> None:
    engine = simsim.SimulationEngine(
        simsim.SimulatedBackend(simsim.SimulatedBackendConfig(1, 1, 1, 1, 1))
    )
    with pytest.raises(
        TypeError, match=r"submit takes a simsim.Request or simsim.RequestSpec, got int"
    ):
        engine.submit(3)  # type: ignore[arg-type]


def test_server_kv_blocks_reads_each_replicas_cache_size() -> None:
    backend = simsim.SimulatedBackend(simsim.SimulatedBackendConfig(1, 1, 1, 1, 1))

    def batching(blocks: int, env: simsim.Environment) -> simsim.BatchingEngine:
        cache = simsim.KvCacheConfig(block_size_tokens=16, total_blocks=blocks)
        return simsim.BatchingEngine(backend, max_active_requests=2, kv_cache=cache, env=env)

    env = simsim.Environment()
    assert results.server_kv_blocks(batching(64, env)) == 64
    assert results.server_kv_blocks(simsim.SimulationEngine(backend)) is None
    assert results.server_kv_blocks(tiny_cluster()) is None  # single-slot replicas
    env = simsim.Environment()
    cluster = simsim.Cluster([batching(64, env), batching(32, env)])
    assert results.server_kv_blocks(cluster) == {0: 64, 1: 32}
