"""Sweeps and capacity search over cluster keys (issue 16, point 5): ``cluster.replicas``,
``cluster.router``, ``cluster.decode.replicas`` vary like any other scenario key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from test_cluster_scenario import DISAGGREGATED, document

import simsim
from simsim.scenario import ScenarioError, parse_scenario, run_scenario
from simsim.sweeps.grid import apply_settings
from simsim.sweeps.spec import load_sweep

TTFT_P99_TARGET_US = 200_000


def small(**tables: Any) -> dict[str, Any]:
    doc = document(**tables)
    doc["workload"]["count"] = 200
    return doc


def test_a_sweep_over_replicas_and_routers_runs_each_points_cluster() -> None:
    doc = small(cluster={"replicas": 1})
    grid: dict[str, list[Any]] = {
        "cluster.replicas": [1, 3],
        "cluster.router": ["round_robin", "least_outstanding"],
    }
    result = simsim.sweep(doc, grid, replications=2, seed=3, workers=1)
    runs = result.runs
    assert len(runs) == 8 and result.axes == ("cluster.replicas", "cluster.router")
    # A run is the point's scenario run with the run's seed.
    row = runs.iloc[-1]
    settings = {"cluster.replicas": 3, "cluster.router": "least_outstanding"}
    assert dict(row[list(settings)]) == settings
    scenario = parse_scenario(apply_settings(doc, {**settings, "scenario.seed": int(row["seed"])}))
    frame = run_scenario(scenario).requests_frame()
    assert set(frame["replica"]) == {0, 1, 2}
    summary = simsim.summarize(frame)["value"]
    assert row["ttft_us_p99"] == summary["ttft_us_p99"]
    # Three replicas take the same load with a much shorter tail than one.
    p99 = runs.groupby("cluster.replicas")["ttft_us_p99"].max()
    assert p99[3] < p99[1] / 5


def test_a_sweep_over_the_decode_pool_of_a_disaggregated_cluster() -> None:
    result = simsim.sweep(
        small(cluster=DISAGGREGATED),
        {"cluster.decode.replicas": [1, 2]},
        replications=2,
        workers=1,
    )
    assert list(result.runs["cluster.decode.replicas"]) == [1, 1, 2, 2]
    assert (result.runs["count_FINISHED"] == 200).all()


def test_the_fewest_replicas_found_by_capacity_search_match_a_direct_sweep() -> None:
    doc = small(cluster={"replicas": 1, "router": "least_outstanding"})
    settings = {"workload.rate_per_s": 60.0}
    found = simsim.capacity_search(
        doc,
        "cluster.replicas",
        low=1,
        high=6,
        find="min",
        targets={"ttft_us_p99": TTFT_P99_TARGET_US},
        settings=settings,
        replications=3,
        max_replications=3,
        seed=4,
        workers=1,
    )
    # The same runs, every value: the case "settings" gives the search's seeds.
    direct = simsim.sweep(
        doc,
        {"cluster.replicas": list(range(1, 7))},
        cases={"settings": settings},
        replications=3,
        seed=4,
        workers=1,
    )
    p99 = direct.summary[direct.summary["metric"] == "ttft_us_p99"].set_index("cluster.replicas")
    meets = (p99["ci_high"] <= TTFT_P99_TARGET_US) & (p99["count"] == 3)
    fewest = min(int(value) for value in p99.index if meets[value])
    assert found.status == "found" and found.value == fewest
    assert found.interval == (fewest - 1, fewest)
    assert not meets[fewest - 1]
    probed = found.evaluations.set_index("value")["ttft_us_p99_mean"]
    assert len(probed) >= 3
    means = dict(zip(p99.index, p99["mean"], strict=True))
    for value, mean in probed.items():
        assert mean == pytest.approx(means[value], rel=1e-12)


def test_a_sweep_file_searches_a_cluster_key(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(
        f'[sweep]\nscenario = "{Path(__file__).parent.parent}/examples/scenarios/cluster.toml"\n'
        "replications = 2\n"
        '[capacity]\nparameter = "cluster.replicas"\nlow = 1\nhigh = 4\nfind = "min"\n'
        "[capacity.targets]\nttft_us_p99 = 2_000_000\n"
        '[grid]\n"cluster.router" = ["round_robin", "least_kv_cache"]\n',
        encoding="utf-8",
    )
    spec = load_sweep(path)
    assert spec.capacity is not None and spec.capacity.integer
    assert spec.capacity.parameter == "cluster.replicas"
    assert spec.grid == {"cluster.router": ["round_robin", "least_kv_cache"]}


@pytest.mark.parametrize(
    ("body", "key", "rule"),
    [
        ('[grid]\n"cluster.replicas" = [0, 2]\n', "cluster.replicas", "must be >= 1, got 0"),
        ('[grid]\n"cluster.router" = ["fastest"]\n', "cluster.router", "unknown value 'fastest'"),
        (
            '[capacity]\nparameter = "cluster.replicas"\nlow = 0\nhigh = 4\nfind = "min"\n'
            "[capacity.targets]\nttft_us_p99 = 1\n",
            "cluster.replicas",
            "must be >= 1, got 0",
        ),
    ],
)
def test_a_sweep_file_refuses_a_bad_cluster_value_before_running(
    tmp_path: Path, body: str, key: str, rule: str
) -> None:
    path = tmp_path / "sweep.toml"
    scenario = Path(__file__).parent.parent / "examples" / "scenarios" / "cluster.toml"
    path.write_text(f'[sweep]\nscenario = "{scenario}"\nreplications = 2\n{body}', encoding="utf-8")
    with pytest.raises(ScenarioError) as raised:
        load_sweep(path)
    assert raised.value.key == key
    assert rule in raised.value.rule
    assert str(scenario) in raised.value.source


def test_sweep_runs_keep_the_replica_count_as_an_integer_axis() -> None:
    result = simsim.sweep(small(), {"cluster.replicas": [2]}, replications=2, workers=1)
    assert pd.api.types.is_integer_dtype(result.runs["cluster.replicas"])
    assert pd.api.types.is_integer_dtype(result.summary["cluster.replicas"])


def test_a_resumed_capacity_search_over_a_cluster_keeps_every_metric(tmp_path: Path) -> None:
    # The search's runs come back from its folder: the load-balance rows with them.
    options: dict[str, Any] = {
        "low": 1,
        "high": 4,
        "find": "min",
        "targets": {"ttft_us_p99": TTFT_P99_TARGET_US},
        "settings": {"workload.rate_per_s": 60.0, "workload.count": 60},
        "replications": 2,
        "max_replications": 2,
        "seed": 2,
        "workers": 1,
        "out": tmp_path,
    }
    doc = small(cluster={"replicas": 1})
    first = simsim.capacity_search(doc, "cluster.replicas", **options)
    assert "replica_load_imbalance" in first.runs.columns
    resumed = simsim.capacity_search(doc, "cluster.replicas", **options)
    pd.testing.assert_frame_equal(resumed.runs, first.runs)
    pd.testing.assert_frame_equal(resumed.evaluations, first.evaluations)
