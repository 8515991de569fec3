"""Disaggregated prefill and decode: the hand-off, the KV transfer, hand-computed timelines."""

from __future__ import annotations

import pytest

import simsim
from simsim.cluster import DisaggregatedCluster, KvTransferConfig

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=1_000,
    prefill_per_token_us=20,
    prefill_per_active_sequence_us=0,
    decode_base_us=5_000,
    decode_per_active_sequence_us=100,
)
# 100 prompt tokens x 1,000 bytes at 1e8 bytes/s: 1,000 us, plus 500 us.
LINK = KvTransferConfig(kv_bytes_per_token=1_000, bandwidth_bytes_per_s=100_000_000, base_us=500)


def pools(
    prefill: int = 1, decode: int = 1, *, blocks: int = 64
) -> tuple[simsim.Environment, list[simsim.BatchingEngine], list[simsim.BatchingEngine]]:
    env = simsim.Environment()

    def engine() -> simsim.BatchingEngine:
        return simsim.BatchingEngine(
            simsim.SimulatedBackend(COSTS),
            max_active_requests=4,
            kv_cache=simsim.KvCacheConfig(16, blocks),
            env=env,
        )

    return env, [engine() for _ in range(prefill)], [engine() for _ in range(decode)]


def test_transfer_cost_formula() -> None:
    assert LINK.transfer_us(100, 1) == 1_500
    assert LINK.transfer_us(100, 2) == 2_500
    assert (
        KvTransferConfig(kv_bytes_per_token=1, bandwidth_bytes_per_s=3).transfer_us(1, 1) == 333_333
    )
    assert (
        KvTransferConfig(kv_bytes_per_token=1, bandwidth_bytes_per_s=2_000_000).transfer_us(1, 1)
        == 1
    )
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        KvTransferConfig(kv_bytes_per_token=1, bandwidth_bytes_per_s=0)


def test_one_request_timeline() -> None:
    _, prefill, decode = pools()
    cluster = DisaggregatedCluster(prefill, decode, LINK)
    cluster.submit(
        simsim.Request(0, arrival_time_us=0, prompt_token_count=100, max_output_tokens=3)
    )
    cluster.run()
    row = cluster.requests_frame().iloc[0]
    assert row["state"] == "FINISHED"
    # prefill 1,000 + 20 x 100 = 3,000; transfer 1,500; decode steps of 5,100
    assert (row["admit_time_us"], row["prefill_end_time_us"]) == (0, 3_000)
    assert (row["transfer_start_us"], row["transfer_end_us"], row["transfer_us"]) == (
        3_000,
        4_500,
        1_500,
    )
    assert row["first_token_time_us"] == 9_600
    assert row["ttft_us"] == 9_600  # the transfer is inside the TTFT
    assert row["finish_time_us"] == 19_800
    assert (row["prefill_replica"], row["decode_replica"]) == (0, 1)
    assert list(prefill[0].events_frame()["event_type"]) == ["REQUEST_ARRIVAL", "PREFILL_COMPLETE"]
    assert list(decode[0].events_frame()["event_type"]) == [
        "DECODE_STEP_COMPLETE",
        "DECODE_STEP_COMPLETE",
        "DECODE_STEP_COMPLETE",
        "REQUEST_COMPLETE",
    ]
    assert len(prefill[0].requests) == 0 and list(decode[0].requests) == [0]


def test_transfers_share_the_link() -> None:
    _, prefill, decode = pools()
    cluster = DisaggregatedCluster(prefill, decode, LINK)
    for rid in range(2):
        cluster.submit(
            simsim.Request(rid, arrival_time_us=0, prompt_token_count=100, max_output_tokens=2)
        )
    cluster.run()
    frame = cluster.requests_frame().set_index("request_id")
    # one prefill of both prompts: 1,000 + 20 x 200 = 5,000
    assert list(frame["prefill_end_time_us"]) == [5_000, 5_000]
    # the second transfer starts with the first in flight: 500 + 2 x 1,000
    assert list(frame["transfer_end_us"]) == [6_500, 7_500]
    # request 0 decodes alone from 6,500 (5,100); then both decode together (5,200)
    assert list(frame["first_token_time_us"]) == [11_600, 16_800]
    assert list(frame["finish_time_us"]) == [16_800, 21_900]  # then 1 alone: 5,100
    transfers = cluster.transfers_frame()
    assert list(transfers["duration_us"]) == [1_500, 2_500]


def test_decode_memory_is_reserved_before_the_transfer() -> None:
    # the decode replica holds 8 blocks of 16 tokens: a 100-token prompt takes 7 with
    # its next token, so the second request waits for the first to finish
    env, prefill, _ = pools(blocks=64)
    small = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=4,
        kv_cache=simsim.KvCacheConfig(16, 8),
        env=env,
    )
    cluster = DisaggregatedCluster(prefill, [small], LINK)
    for rid in range(2):
        cluster.submit(
            simsim.Request(rid, arrival_time_us=0, prompt_token_count=100, max_output_tokens=1)
        )
    cluster.run()
    frame = cluster.requests_frame().set_index("request_id")
    assert frame.loc[0, "transfer_start_us"] == 5_000
    # request 0: transfer to 6,500, one decode step to 11,600; then request 1's starts
    assert frame.loc[0, "finish_time_us"] == 11_600
    assert frame.loc[1, "transfer_start_us"] == 11_600
    assert frame.loc[1, "transfer_us"] == 1_500


def test_cancel_while_queued_for_transfer_and_during_it() -> None:
    env, prefill, _decode = pools()
    small = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=1,
        kv_cache=simsim.KvCacheConfig(16, 64),
        env=env,
    )
    cluster = DisaggregatedCluster(prefill, [small], LINK)
    for rid in range(3):
        cluster.submit(
            simsim.Request(rid, arrival_time_us=0, prompt_token_count=100, max_output_tokens=2)
        )
    # one prefill of the three ends at 1,000 + 20 x 300 = 7,000; at 7,500 request 0 is
    # in its transfer (7,000-8,500), 1 and 2 queue for theirs
    env.timeout(7_500).callbacks.append(
        lambda _: (cluster.cancel_request(0), cluster.cancel_request(1))
    )
    cluster.run()
    frame = cluster.requests_frame().set_index("request_id")
    assert list(frame["state"]) == ["CANCELLED", "CANCELLED", "FINISHED"]
    assert list(frame["finish_time_us"])[:2] == [7_500, 7_500]
    # request 2's transfer starts at once, alone on the link
    assert frame.loc[2, "transfer_start_us"] == 7_500
    assert frame.loc[2, "transfer_us"] == 1_500
    assert frame["transfer_us"].isna().tolist() == [True, True, False]
    assert small.kv_blocks_in_use == 0


def test_zero_output_requests_end_on_the_prefill_replica() -> None:
    _, prefill, decode = pools()
    cluster = DisaggregatedCluster(prefill, decode, LINK)
    cluster.submit(simsim.Request(0, arrival_time_us=0, prompt_token_count=10, max_output_tokens=0))
    cluster.run()
    row = cluster.requests_frame().iloc[0]
    assert row["state"] == "FINISHED" and row["finish_time_us"] == 1_200
    assert row["prefill_replica"] == 0 and row["decode_replica"] is pd_na()


def pd_na() -> object:
    import pandas as pd

    return pd.NA


def test_pools_must_be_batching_engines() -> None:
    env, prefill, _ = pools()
    with pytest.raises(TypeError, match="decode\\[0\\] is a SimulationEngine"):
        DisaggregatedCluster(
            prefill, [simsim.SimulationEngine(simsim.SimulatedBackend(COSTS), env=env)], LINK
        )


def test_a_transfer_cancelled_midway_still_held_the_decode_replica() -> None:
    env, prefill, _ = pools()
    small = simsim.BatchingEngine(
        simsim.SimulatedBackend(COSTS),
        max_active_requests=1,
        kv_cache=simsim.KvCacheConfig(16, 64),
        env=env,
    )
    cluster = DisaggregatedCluster(prefill, [small], LINK)
    for rid in range(3):
        cluster.submit(
            simsim.Request(rid, arrival_time_us=0, prompt_token_count=100, max_output_tokens=2)
        )
    env.timeout(7_500).callbacks.append(
        lambda _: (cluster.cancel_request(0), cluster.cancel_request(1))
    )
    cluster.run()
    frame = cluster.requests_frame().set_index("request_id")
    assert list(frame["handoff_time_us"]) == [7_000, 7_000, 7_000]
    # request 0 was admitted (its transfer started) at 7,000; request 1 never was
    assert frame["decode_admit_time_us"].tolist()[:2] == [7_000, pd_na()]
    assert frame.loc[2, "decode_admit_time_us"] == 7_500
    # the decode replica held request 0 over [7,000, 7,500), then request 2 over
    # [7,500, 19,200): busy 12,200 of the 19,200 us window
    summary = simsim.summarize(cluster.requests_frame(), replicas=(1, 1))["value"]
    assert summary["decode_replica_utilization_max"] == pytest.approx(12_200 / 19_200)
    assert frame.loc[2, "finish_time_us"] == 19_200


def test_a_prefill_replica_takes_requests_only_through_its_cluster() -> None:
    _, prefill, decode = pools()
    DisaggregatedCluster(prefill, decode, LINK)
    with pytest.raises(ValueError, match="is a replica of <DisaggregatedCluster of 2 replicas>"):
        prefill[0].submit(
            simsim.Request(0, arrival_time_us=0, prompt_token_count=10, max_output_tokens=2)
        )


def test_a_transfer_past_the_clock_is_refused_naming_the_request() -> None:
    _, prefill, decode = pools()
    huge = KvTransferConfig(kv_bytes_per_token=2**40, bandwidth_bytes_per_s=1)
    cluster = DisaggregatedCluster(prefill, decode, huge)
    cluster.submit(
        simsim.Request(0, arrival_time_us=0, prompt_token_count=100, max_output_tokens=2)
    )
    with pytest.raises(OverflowError, match="request 0's KV transfer at 3000 us"):
        cluster.run()
    assert cluster.failed and decode[0].failed  # refused before its link counted it
    assert decode[0]._link._in_flight == 0  # type: ignore[union-attr]


def test_transfer_config_holds_plain_ints() -> None:
    import numpy as np

    config = KvTransferConfig(np.int64(1_000), np.int64(10**8), base_us=np.int64(5))  # type: ignore[arg-type]
    assert type(config.base_us) is int and type(config.transfer_us(10, 1)) is int


def test_a_prefill_replica_needs_room_for_the_prompt_and_one_token_only() -> None:
    env = simsim.Environment()

    def engine(blocks: int) -> simsim.BatchingEngine:
        return simsim.BatchingEngine(
            simsim.SimulatedBackend(COSTS),
            max_active_requests=2,
            kv_cache=simsim.KvCacheConfig(16, blocks),
            env=env,
        )

    # 100 prompt tokens and the first token need 7 blocks of 16: the prefill replica's 8
    # are enough, though the whole request (up to 13 blocks) must fit on the decode replica
    cluster = DisaggregatedCluster([engine(8)], [engine(13)], LINK)
    cluster.submit(
        simsim.Request(0, arrival_time_us=0, prompt_token_count=100, max_output_tokens=100)
    )
    with pytest.raises(ValueError, match="replica 1: request 1 needs 14 KV blocks"):
        cluster.submit(
            simsim.Request(1, arrival_time_us=0, prompt_token_count=100, max_output_tokens=109)
        )
    with pytest.raises(ValueError, match=r"replica 0: request 2 needs 9 KV blocks .* 1 output"):
        cluster.submit(
            simsim.Request(2, arrival_time_us=0, prompt_token_count=129, max_output_tokens=5)
        )
    cluster.run()
    assert cluster.requests_frame()["state"].tolist() == ["FINISHED"]


def test_admission_control_stands_before_the_prefill_router() -> None:
    _, prefill, decode = pools()
    control = simsim.AdmissionControl({"*": simsim.Limit(rate_per_s=0, burst=2)})
    cluster = DisaggregatedCluster(prefill, decode, LINK, admission=control)
    for rid in range(3):
        cluster.submit(
            simsim.Request(rid, arrival_time_us=0, prompt_token_count=100, max_output_tokens=2)
        )
    cluster.run()
    frame = cluster.requests_frame()
    assert frame["state"].tolist() == ["FINISHED", "FINISHED", "CANCELLED"]
    assert frame["rejection"].tolist()[2] == "rate_limited"
    assert frame["prefill_replica"].isna().tolist() == [False, False, True]
    assert list(cluster.routes_frame()["request_id"]) == [0, 1, 0, 1]  # prefill, then decode
