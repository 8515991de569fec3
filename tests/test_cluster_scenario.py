"""Scenario files with a [cluster] table: parsing, errors, and runs equal to a hand-built
cluster (issue 16, point 5)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import simsim
from simsim.cli import main
from simsim.cluster import DisaggregatedCluster, KvTransferConfig
from simsim.run_folder import read_run_folder
from simsim.scenario import (
    ClusterSpec,
    PoolSpec,
    ScenarioError,
    check_scenario,
    parse_scenario,
    run_scenario,
)

COSTS = {
    "prefill_base_us": 1_000,
    "prefill_per_token_us": 20,
    "prefill_per_active_sequence_us": 50,
    "decode_base_us": 5_000,
    "decode_per_active_sequence_us": 100,
}


def document(**tables: Any) -> dict[str, Any]:
    """A batching scenario of 120 requests at 40 per second; *tables* replace or add."""
    base: dict[str, Any] = {
        "scenario": {"name": "c", "engine": "batching", "seed": 5},
        "backend": dict(COSTS),
        "batching": {"max_active_requests": 4, "max_batch_tokens": 256, "policy": "mixed"},
        "kv_cache": {"block_size_tokens": 16, "total_blocks": 96},
        "workload": {
            "count": 120,
            "rate_per_s": 40.0,
            "prompt_tokens": [16, 400],
            "output_tokens": [1, 40],
        },
    }
    base.update(copy.deepcopy(tables))
    return base


DISAGGREGATED: dict[str, Any] = {
    "prefill": {"replicas": 2, "max_active_requests": 2},
    "decode": {"replicas": 3, "router": "least_kv_cache", "total_blocks": 192},
    "transfer": {"kv_bytes_per_token": 65_536, "bandwidth_bytes_per_s": 10**10, "base_us": 150},
}


def backend() -> simsim.SimulatedBackend:
    return simsim.SimulatedBackend(simsim.SimulatedBackendConfig(**COSTS))


def batching(env: simsim.Environment, *, slots: int = 4, blocks: int = 96) -> simsim.BatchingEngine:
    return simsim.BatchingEngine(
        backend(),
        simsim.FcfsScheduler(),
        max_active_requests=slots,
        max_batch_tokens=256,
        policy="mixed",
        kv_cache=simsim.KvCacheConfig(16, blocks),
        env=env,
    )


def run_by_hand(cluster: simsim.Cluster, scenario: simsim.scenario.Scenario) -> simsim.Cluster:
    for spec in scenario.all_requests():
        cluster.submit(spec.to_request())
    cluster.run()
    return cluster


# ---------------------------------------------------------------------------- parsing


def test_a_cluster_table_gives_a_pool_with_the_documented_defaults() -> None:
    scenario = parse_scenario(document(cluster={"replicas": 3}))
    assert scenario.cluster == ClusterSpec(pool=PoolSpec(3, "round_robin"))
    assert scenario.cluster.replica_count == 3 and not scenario.cluster.disaggregated
    cluster = scenario.build()
    assert isinstance(cluster, simsim.Cluster) and not isinstance(cluster, DisaggregatedCluster)
    assert len(cluster.replicas) == 3 and cluster.refresh_interval_us == 0
    assert all(isinstance(r, simsim.BatchingEngine) for r in cluster.replicas)
    assert len({id(r._scheduler) for r in cluster.replicas}) == 3  # one scheduler each
    assert len({id(r.env) for r in cluster.replicas}) == 1


def test_router_options_reach_the_router() -> None:
    weighted = parse_scenario(
        document(
            cluster={"replicas": 2, "router": "weighted", "weights": {"queue": 2, "kv_cache": 0.5}}
        )
    ).build()
    assert isinstance(weighted, simsim.Cluster)
    assert dict(weighted.router.weights) == {"queue": 2.0, "kv_cache": 0.5}  # type: ignore[attr-defined]
    seeded = parse_scenario(
        document(
            cluster={
                "replicas": 2,
                "router": "power_of_two",
                "seed": 11,
                "refresh_interval_us": 500,
            }
        )
    ).build()
    assert isinstance(seeded, simsim.Cluster)
    assert seeded.router.seed == 11  # type: ignore[attr-defined]
    assert seeded.refresh_interval_us == 500


def test_a_random_router_is_seeded_from_the_scenario_unless_the_file_seeds_it() -> None:
    doc = document(cluster={"replicas": 3, "router": "random"})
    scenario = parse_scenario(doc)
    cluster = scenario.build()
    assert isinstance(cluster, simsim.Cluster)
    assert cluster.router.seed == 5  # type: ignore[attr-defined]
    # The file's seed fixes the draw whatever the scenario's seed (a sweep's replication).
    fixed = parse_scenario(document(cluster={"replicas": 3, "router": "random", "seed": 5}))
    routed = run_scenario(fixed.with_seed(6)).requests_frame()["replica"].tolist()
    assert routed == run_scenario(scenario).requests_frame()["replica"].tolist()
    floating = run_scenario(scenario.with_seed(6)).requests_frame()["replica"].tolist()
    assert floating != routed
    # The decode pool's router draws apart from the prefill pool's: seed + 1.
    disaggregated = copy.deepcopy(DISAGGREGATED)
    disaggregated["prefill"]["router"] = "random"
    disaggregated["decode"]["router"] = "random"
    split = parse_scenario(document(cluster=disaggregated)).build()
    assert isinstance(split, DisaggregatedCluster)
    assert (split.router.seed, split.decode_router.seed) == (5, 6)  # type: ignore[attr-defined]


def test_disaggregated_pools_take_their_overrides_and_the_transfer() -> None:
    scenario = parse_scenario(document(cluster=DISAGGREGATED))
    assert scenario.cluster is not None and scenario.cluster.disaggregated
    cluster = scenario.build()
    assert isinstance(cluster, DisaggregatedCluster)
    prefill, decode = cluster.prefill_replicas, cluster.decode_replicas
    assert [r.max_active_requests for r in prefill] == [2, 2]
    assert [r.max_active_requests for r in decode] == [4, 4, 4]
    assert {r.kv_cache.total_blocks for r in prefill if r.kv_cache} == {96}
    assert {r.kv_cache.total_blocks for r in decode if r.kv_cache} == {192}
    assert cluster.transfer == KvTransferConfig(65_536, 10**10, 150)
    assert repr(cluster.router) == "RoundRobinRouter()"
    assert repr(cluster.decode_router) == "LeastKvCacheRouter()"


ERRORS = [
    ({"replica": 2}, "cluster.replica", "did you mean 'replicas'"),
    ({}, "cluster.replicas", "missing required key"),
    # One rule, one message: 0 and a negative count break the same rule.
    ({"replicas": 0}, "cluster.replicas", "must be >= 1, got 0"),
    ({"replicas": -3}, "cluster.replicas", "must be >= 1, got -3"),
    (
        {**DISAGGREGATED, "prefill": {"replicas": -3}},
        "cluster.prefill.replicas",
        "must be >= 1, got -3",
    ),
    (
        {**DISAGGREGATED, "decode": {"replicas": 0}},
        "cluster.decode.replicas",
        "must be >= 1, got 0",
    ),
    # A size no fleet has is refused before a replica is built.
    (
        {"replicas": 1_000_000},
        "cluster.replicas",
        "must be at most 10,000 per pool (each replica is a whole server, built before the "
        "run), got 1,000,000",
    ),
    (
        {**DISAGGREGATED, "decode": {"replicas": 10_001}},
        "cluster.decode.replicas",
        "must be at most 10,000 per pool",
    ),
    ({"replicas": 2.0}, "cluster.replicas", "must be an integer"),
    (
        {"replicas": 2, "router": "least_outstandin"},
        "cluster.router",
        "did you mean 'least_outstanding'",
    ),
    ({"replicas": 2, "seed": 3}, "cluster.seed", "only for router 'random' or 'power_of_two'"),
    ({"replicas": 2, "weights": {"queue": 1}}, "cluster.weights", "only for router 'weighted'"),
    (
        {"replicas": 2, "router": "weighted", "weights": {"queu": 1}},
        "cluster.weights.queu",
        "did you mean 'queue'",
    ),
    (
        {"replicas": 2, "router": "weighted", "weights": {"queue": -1}},
        "cluster.weights",
        "must be a finite number >= 0",
    ),
    (
        {"replicas": 2, "router": "weighted", "weights": {"queue": 0}},
        "cluster.weights",
        "at least one weight must be above 0",
    ),
    ({"replicas": 2, "refresh_interval_us": -1}, "cluster.refresh_interval_us", "must be >= 0"),
    (
        {**DISAGGREGATED, "transfer": None},
        "cluster.transfer",
        "disaggregation needs [cluster.prefill], [cluster.decode] and [cluster.transfer] together",
    ),
    (
        {**DISAGGREGATED, "replicas": 4},
        "cluster.replicas",
        "give replicas, router and its options in each pool",
    ),
    (
        {**DISAGGREGATED, "decode": {"replicas": 1, "max_active_request": 4}},
        "cluster.decode.max_active_request",
        "did you mean 'max_active_requests'",
    ),
    (
        {**DISAGGREGATED, "prefill": {"replicas": 1, "max_batch_tokens": 1}},
        "cluster.prefill",
        "max_batch_tokens",
    ),
    (
        {**DISAGGREGATED, "transfer": {"kv_bytes_per_token": 1, "bandwidth_bytes_per_s": 0}},
        "cluster.transfer.bandwidth_bytes_per_s",
        "must be >= 1, got 0",
    ),
    (
        {**DISAGGREGATED, "transfer": {"kv_bytes_per_token": 1, "bandwidth_bytes_per_s": 25e9}},
        "cluster.transfer.bandwidth_bytes_per_s",
        "must be an integer, got float 25000000000.0 (write 25_000_000_000: whole numbers are "
        "TOML integers)",
    ),
    (
        {**DISAGGREGATED, "transfer": {"bandwidth_bytes_per_s": 10}},
        "cluster.transfer.kv_bytes_per_token",
        "missing required key",
    ),
]


@pytest.mark.parametrize(("table", "key", "rule"), ERRORS)
def test_errors_name_the_file_the_key_and_the_rule(
    table: dict[str, Any], key: str, rule: str
) -> None:
    table = {k: v for k, v in table.items() if v is not None}
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(document(cluster=table), source="my.toml")
    assert raised.value.source == "my.toml"
    assert raised.value.key == key
    assert rule in raised.value.rule


def test_a_pool_spec_from_python_keeps_the_files_replica_rule() -> None:
    with pytest.raises(ValueError, match=r"^replicas must be at most 10,000 per pool .* 10,001$"):
        PoolSpec(10_001, "round_robin")
    with pytest.raises(ValueError, match=r"^replicas must be >= 1, got 0$"):
        PoolSpec(0, "round_robin")
    assert PoolSpec(np.int64(3), "round_robin").replicas == 3


def test_disaggregation_needs_the_batching_engine() -> None:
    doc = document(cluster=DISAGGREGATED)
    doc["scenario"]["engine"] = "single_slot"
    for name in ("batching", "kv_cache"):
        del doc[name]
    with pytest.raises(
        ScenarioError,
        match=r"my.toml: cluster.prefill: disaggregated .* need engine = \"batching\"",
    ) as raised:
        parse_scenario(doc, source="my.toml")
    assert 'the engine is "single_slot"' in raised.value.rule


def test_a_pool_total_blocks_needs_a_kv_cache() -> None:
    doc = document(cluster={**DISAGGREGATED, "decode": {"replicas": 1, "total_blocks": 8}})
    del doc["kv_cache"]
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(doc)
    assert (raised.value.key, raised.value.rule) == (
        "cluster.decode.total_blocks",
        "needs [kv_cache]: there are no blocks to count",
    )


def test_a_cluster_must_be_a_table() -> None:
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(document(cluster=4))
    assert (raised.value.key, raised.value.rule) == ("cluster", "must be a table, got integer")


# ---------------------------------------------------------------------------- running


def test_a_cluster_scenario_runs_as_the_cluster_built_by_hand() -> None:
    scenario = parse_scenario(document(cluster={"replicas": 3, "router": "least_outstanding"}))
    ran = run_scenario(scenario)
    assert isinstance(ran, simsim.Cluster)
    env = simsim.Environment()
    by_hand = run_by_hand(
        simsim.Cluster([batching(env) for _ in range(3)], "least_outstanding"), scenario
    )
    pd.testing.assert_frame_equal(ran.requests_frame(), by_hand.requests_frame())
    pd.testing.assert_frame_equal(ran.events_frame(), by_hand.events_frame())
    pd.testing.assert_frame_equal(ran.routes_frame(), by_hand.routes_frame())
    assert set(ran.requests_frame()["replica"]) == {0, 1, 2}


def test_a_disaggregated_scenario_runs_as_the_cluster_built_by_hand() -> None:
    scenario = parse_scenario(document(cluster=DISAGGREGATED))
    ran = run_scenario(scenario)
    env = simsim.Environment()
    by_hand = run_by_hand(
        DisaggregatedCluster(
            [batching(env, slots=2) for _ in range(2)],
            [batching(env, blocks=192) for _ in range(3)],
            KvTransferConfig(65_536, 10**10, 150),
            decode_router="least_kv_cache",
        ),
        scenario,
    )
    frame = ran.requests_frame()
    pd.testing.assert_frame_equal(frame, by_hand.requests_frame())
    assert (frame["state"] == "FINISHED").all()
    assert set(frame["prefill_replica"]) == {0, 1} and set(frame["decode_replica"]) == {2, 3, 4}
    assert (frame["transfer_us"] >= 150).all()


def test_a_one_replica_cluster_runs_as_the_server_alone() -> None:
    alone = run_scenario(parse_scenario(document())).requests_frame()
    clustered = run_scenario(parse_scenario(document(cluster={"replicas": 1}))).requests_frame()
    assert (clustered.pop("replica") == 0).all()
    pd.testing.assert_frame_equal(alone, clustered)


def test_cancellations_and_patience_reach_the_replica_that_holds_the_request() -> None:
    doc = document(cluster={"replicas": 2})
    doc["workload"]["patience_us"] = [200_000, 400_000]
    doc["cancellations"] = [
        {"time_us": 1_000, "request_id": 0},
        {"time_us": 500_000, "request_id": 7},
    ]
    scenario = parse_scenario(doc)
    frame = run_scenario(scenario).requests_frame().set_index("request_id")
    states = frame["state"]
    assert states[0] == "CANCELLED" and frame.loc[0, "finish_time_us"] == 1_000
    assert (states == "CANCELLED").sum() > 2  # patience deadlines fired too
    assert set(states) == {"FINISHED", "CANCELLED"}


def test_closed_loop_users_drive_a_cluster() -> None:
    doc = document(cluster={"replicas": 2, "router": "least_outstanding"})
    doc["workload"] = {
        "kind": "closed_loop",
        "users": 6,
        "requests_per_user": 5,
        "think_time_us": [0, 50_000],
        "prompt_tokens": [16, 200],
        "output_tokens": [1, 20],
    }
    frame = run_scenario(parse_scenario(doc)).requests_frame()
    assert len(frame) == 30 and (frame["state"] == "FINISHED").all()
    assert set(frame["replica"]) == {0, 1}


def test_progress_counts_admissions_on_the_entry_replicas() -> None:
    doc = document(cluster=DISAGGREGATED)
    doc["workload"]["count"] = 2_000
    doc["workload"]["rate_per_s"] = 200.0
    calls: list[tuple[int, int]] = []
    run_scenario(parse_scenario(doc), progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (2_000, 2_000)
    middle = [done for done, _ in calls[:-1]]
    assert middle and middle == sorted(middle) and 0 < middle[0] < 2_000


def test_a_request_no_replica_can_hold_is_refused_before_the_run() -> None:
    doc = document(cluster={"replicas": 2})
    doc["requests"] = [
        {
            "request_id": 900,
            "arrival_time_us": 0,
            "prompt_token_count": 2_000,
            "max_output_tokens": 1,
        }
    ]
    with pytest.raises(ScenarioError) as raised:
        check_scenario(parse_scenario(doc, source="my.toml"))
    assert raised.value.key == "request 900"
    assert raised.value.rule.startswith("needs 126 KV blocks")
    assert raised.value.rule.endswith("(on replica 0)")


def test_build_engine_builds_one_server_and_refuses_a_cluster() -> None:
    plain = parse_scenario(document())
    assert isinstance(plain.build_engine(), simsim.BatchingEngine)
    assert isinstance(plain.build(), simsim.BatchingEngine)
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(document(cluster={"replicas": 2})).build_engine()
    assert raised.value.key == "cluster"
    assert "Scenario.build()" in raised.value.rule


def test_single_slot_replicas_make_a_cluster_too() -> None:
    doc = document(cluster={"replicas": 2})
    doc["scenario"]["engine"] = "single_slot_fast"
    for name in ("batching", "kv_cache"):
        del doc[name]
    full = copy.deepcopy(doc)
    full["scenario"]["engine"] = "single_slot"
    fast_frame = run_scenario(parse_scenario(doc)).requests_frame()
    pd.testing.assert_frame_equal(fast_frame, run_scenario(parse_scenario(full)).requests_frame())


# ---------------------------------------------------------------------------- the CLI


def toml_lines(table: dict[str, Any], prefix: str = "") -> list[str]:
    """*table* as TOML: scalars and arrays as JSON (which TOML reads alike), tables nested."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for key, value in table.items():
        if isinstance(value, dict):
            lines.append(f"[{prefix}{key}]")
            lines.extend(toml_lines(value, f"{prefix}{key}."))
    return lines


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text("\n".join(toml_lines(doc)) + "\n", encoding="utf-8")
    return path


def test_simsim_run_writes_the_clusters_frames_and_prints_each_replica(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, document(cluster={"replicas": 3, "router": "least_outstanding"}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "cluster       3 replicas, router least_outstanding\n" in printed
    lines = re.findall(r"^replica (\d)     (\d+) routed, (\d+) finished$", printed, re.MULTILINE)
    assert [int(i) for i, _, _ in lines] == [0, 1, 2]
    assert sum(int(routed) for _, routed, _ in lines) == 120
    folder = read_run_folder(tmp_path / "out")
    requests = folder.requests()
    counts = requests["replica"].value_counts().sort_index().tolist()
    assert counts == [int(routed) for _, routed, _ in lines]
    for table in ("events", "admissions", "iterations"):
        assert set(folder.table(table)["replica"]) == {0, 1, 2}
    # 12 slots in all: occupancy is over the cluster's slots.
    summary = folder.table("summary").set_index("metric")["value"]
    cluster = run_scenario(
        parse_scenario(document(cluster={"replicas": 3, "router": "least_outstanding"}))
    )
    expected = simsim.summarize(cluster.requests_frame(), slots=12)["value"]
    assert summary["utilization"] == pytest.approx(expected["utilization"])


def test_simsim_run_prints_the_pools_and_the_transfers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, document(cluster=DISAGGREGATED))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert (
        "cluster       2 prefill + 3 decode replicas, routers round_robin / least_kv_cache"
        in printed
    )
    assert re.search(
        r"^replica 0     prefill 60 routed, 60 handed to decode$", printed, re.MULTILINE
    )
    decoded = re.findall(
        r"^replica [234]     decode (\d+) routed, (\d+) finished$", printed, re.MULTILINE
    )
    assert len(decoded) == 3 and sum(int(done) for _, done in decoded) == 120
    assert re.search(r"^KV transfer   120 transfers, mean \d", printed, re.MULTILINE)
    requests = read_run_folder(tmp_path / "out").requests()
    for column in ("prefill_replica", "decode_replica", "transfer_us"):
        assert requests[column].notna().all()


def test_many_replicas_print_their_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, document(cluster={"replicas": 20}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "replica 0 " not in printed
    # round robin: 120 requests over 20 replicas, 6 each
    assert "per replica   6 to 6 routed, 6 to 6 finished (20 replicas)\n" in printed


def test_simsim_validate_describes_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, document(cluster={"replicas": 2}))
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out == (
        f"{path}: ok: scenario 'c', engine batching, cluster of 2 replicas, router round_robin, "
        "120 requests, 0 cancellations\n"
    )


def test_simsim_run_refuses_a_bad_cluster_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, document(cluster={"replicas": 2, "routr": "random"}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"simsim: error: {path}: cluster.routr: unknown key (did you mean 'router'?)"
    )
    assert not (tmp_path / "out" / "requests.csv").exists()


def test_simsim_run_counts_a_replica_that_got_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = document(cluster={"replicas": 3, "router": "round_robin"})
    doc["workload"]["count"] = 2  # replicas 0 and 1 get one each, replica 2 none
    path = write(tmp_path, doc)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^balance       replicas busy 0\.0% to \d", printed, re.MULTILINE)
    summary = read_run_folder(tmp_path / "out").table("summary").set_index("metric")["value"]
    assert (summary["replicas"], summary["replica_requests_min"]) == (3, 0)
    assert summary["replica_load_imbalance"] == pytest.approx(1.5)  # 1 of a fair 2/3
