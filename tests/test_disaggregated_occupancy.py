"""A disaggregated cluster's occupancy, per pool (issue 24, point 4).

A request queues for a prefill slot from its arrival to its admission, holds that slot
until its hand-off, queues for a decode slot from the hand-off to its admission on the
decode replica, and holds that slot until its end. ``summarize(frame, slots=(prefill,
decode))``, ``results.occupancy_series`` and the table ``simsim run`` prints read the
same intervals, so they report the same numbers; the wait for a decode slot is
queueing, never slot time.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_cluster_scenario import document, write
from test_disaggregation import COSTS, LINK

import simsim
from simsim.cli import main
from simsim.cluster import DisaggregatedCluster
from simsim.run_folder import read_run_folder

OCCUPANCY_ROWS = ["mean_queue_length", "mean_active_requests", "utilization"]


def backed_up() -> DisaggregatedCluster:
    """One prefill replica of 4 slots and one decode replica of 1 slot; two requests of
    100 prompt tokens and 2 output tokens at 0.

    Both prefill together over [0, 5,000) and are handed off at 5,000. The decode slot
    takes request 0 (transfer 1,500, two steps of 5,100: it ends at 16,700); request 1
    waits for it over [5,000, 16,700), then holds it over [16,700, 28,400).
    """
    env = simsim.Environment()

    def replica(slots: int) -> simsim.BatchingEngine:
        return simsim.BatchingEngine(
            simsim.SimulatedBackend(COSTS),
            max_active_requests=slots,
            kv_cache=simsim.KvCacheConfig(16, 64),
            env=env,
        )

    cluster = DisaggregatedCluster([replica(4)], [replica(1)], LINK)
    for rid in range(2):
        cluster.submit(simsim.Request(rid, 0, 100, 2))
    cluster.run()
    return cluster


def test_the_wait_for_a_decode_slot_is_queueing_not_slot_time() -> None:
    frame = backed_up().requests_frame()
    assert frame["handoff_time_us"].tolist() == [5_000, 5_000]
    assert frame["decode_admit_time_us"].tolist() == [5_000, 16_700]
    assert frame["finish_time_us"].tolist() == [16_700, 28_400]
    assert frame["queue_delay_us"].tolist() == [0, 0]
    assert frame["decode_queue_delay_us"].tolist() == [0, 11_700]
    assert frame.columns[-1] == "decode_queue_delay_us"  # appended after the others
    summary = simsim.summarize(frame, slots=(4, 1))["value"]
    window = 28_400
    prefill = [0.0, 10_000 / window, 10_000 / window / 4]  # both held [0, 5,000)
    decode = [11_700 / window, 23_400 / window, 23_400 / window]
    both = [prefill[0] + decode[0], prefill[1] + decode[1], (10_000 + 23_400) / window / 5]
    names = [f"{pool}{row}" for pool in ("", "prefill_", "decode_") for row in OCCUPANCY_ROWS]
    assert [summary[name] for name in names] == pytest.approx(both + prefill + decode)
    # the rows follow the latency and SLO rows, in that order, before the balance rows
    rows = list(summary.index)
    assert rows[rows.index("mean_queue_length") : rows.index("prefill_replicas")] == names
    # the decode wait gets its own statistics, after queue_delay_us's
    assert summary["decode_queue_delay_us_mean"] == 5_850
    assert summary["decode_queue_delay_us_p99"] == pytest.approx(11_583)
    assert rows.index("decode_queue_delay_us_mean") == rows.index("queue_delay_us_p99") + 1


def test_occupancy_series_has_a_queue_and_slots_per_pool() -> None:
    series = simsim.results.occupancy_series(backed_up().requests_frame())
    assert list(series.columns) == [
        "time_us",
        "queue_length",
        "occupancy",
        "prefill_queue_length",
        "prefill_occupancy",
        "decode_queue_length",
        "decode_occupancy",
    ]
    assert series.to_numpy().tolist() == [
        [0, 0, 2, 0, 2, 0, 0],
        [5_000, 1, 1, 0, 0, 1, 1],
        [16_700, 0, 1, 0, 0, 0, 1],
        [28_400, 0, 0, 0, 0, 0, 0],
    ]


def test_a_disaggregated_frame_takes_one_slot_count_per_pool() -> None:
    frame = backed_up().requests_frame()
    with pytest.raises(TypeError, match=r"slots must be a pair \(prefill slots, decode slots\)"):
        simsim.summarize(frame, slots=5)
    with pytest.raises(ValueError, match=r"slots\[1\] \(decode slots\) must be >= 1, got 0"):
        simsim.summarize(frame, slots=(4, 0))
    with pytest.raises(TypeError, match=r"slots\[0\] \(prefill slots\) must be an int"):
        simsim.summarize(frame, slots=(4.0, 1))
    plain = frame.drop(columns=["prefill_replica", "decode_replica"])
    with pytest.raises(TypeError, match=r"slots must be an int .* got \(4, 1\); a pair is for"):
        simsim.summarize(plain, slots=(4, 1))
    # A list is a pair as well as a tuple is, for slots and replicas alike.
    pd.testing.assert_frame_equal(
        simsim.summarize(frame, slots=[4, 1], replicas=[1, 1]),
        simsim.summarize(frame, slots=(4, 1), replicas=(1, 1)),
    )


def test_a_backed_up_decode_pool_prints_honest_occupancy_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 prefill replicas of 4 slots, 1 decode replica of 2 slots: decode is the bottleneck.
    doc = document(
        cluster={
            "prefill": {"replicas": 2},
            "decode": {"replicas": 1, "max_active_requests": 2},
            "transfer": {"kv_bytes_per_token": 1_000, "bandwidth_bytes_per_s": 10**9},
        }
    )
    doc["workload"]["count"] = 60
    path = write(tmp_path, doc)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    folder = read_run_folder(tmp_path / "out")
    summary = folder.table("summary").set_index("metric")["value"]
    requests = folder.requests()
    # summarize on the folder's table, with the pools' slots, is what simsim run wrote
    again = simsim.summarize(requests, slots=(8, 2), replicas=(2, 1))["value"]
    overload = list(simsim.results.OVERLOAD_METRICS)  # run_summary's rows after summarize's
    pd.testing.assert_series_equal(again, summary.drop(overload), check_names=False)
    for pool, slots in (("prefill_", 8), ("decode_", 2)):
        assert 0 <= summary[f"{pool}utilization"] <= 1
        # the figure's counts never pass the pool's slots, and their time averages
        # over the window are summarize's rows
        series = simsim.results.occupancy_series(requests)
        assert series[f"{pool}occupancy"].max() <= slots
        start = int(requests["arrival_time_us"].min())
        end = int(requests["finish_time_us"].max())
        for column, row in (("queue_length", "mean_queue_length"), ("occupancy", "")):
            row = row or "mean_active_requests"
            assert time_average(series, f"{pool}{column}", start, end) == pytest.approx(
                summary[f"{pool}{row}"], rel=1e-12
            )
        # and the table printed says the same
        name = pool.rstrip("_")
        line = re.search(rf"^occupancy     {name} (.*)$", printed, re.MULTILINE)
        assert line is not None
        assert line[1] == (
            f"{summary[f'{pool}utilization']:.1%} of slot time busy, "
            f"{summary[f'{pool}mean_active_requests']:.2f} requests in slots and "
            f"{summary[f'{pool}mean_queue_length']:.2f} queued on average"
        )
    assert summary["decode_mean_queue_length"] > 1  # the wait shows as a queue
    decode_wait = re.search(r"^decode queue +(\S+ m?s)", printed, re.MULTILINE)
    assert decode_wait is not None
    assert decode_wait[1] == f"{summary['decode_queue_delay_us_mean'] / 1000:.1f} ms"
    assert re.search(r"^prefill queue +\S+ m?s", printed, re.MULTILINE)
    assert "\nqueue delay " not in printed


def time_average(series: pd.DataFrame, column: str, start: int, end: int) -> float:
    """The time average of a step series' *column* over ``[start, end)``."""
    times = np.append(series["time_us"].to_numpy(dtype=np.int64), end)
    times = np.clip(times, start, end).astype("float64")
    values = series[column].to_numpy(dtype="float64")
    return float((values * np.diff(times)).sum() / (end - start))
