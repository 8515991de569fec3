"""The cluster benchmark runs (a quick version) and reports what it promises."""

from __future__ import annotations

import pytest
from helpers import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "cluster.py"


def test_cluster_benchmark_quick_run(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(SCRIPT, "benchmark_cluster")
    results, pairs = module.main(["--quick", "--routers", "round_robin", "least_outstanding"])
    routers = [r.router for r in results]
    assert routers == ["round_robin", "least_outstanding", "least_outstanding"]
    fresh, stale = results[1], results[2]
    assert (fresh.refresh_interval_us, stale.refresh_interval_us) == (0, module.STALE_REFRESH_US)
    for r in results:
        # One decision per request; the replicas' events are the arrivals (each routed
        # inside its own event) and the iterations' ends, as on one batching engine.
        assert r.decisions == r.requests
        assert r.replica_events == r.requests + r.iterations
        assert r.events == r.replica_events + r.decisions
        assert 0 < r.snapshot_s + r.route_s <= r.routing_s < r.cpu_s
    # Fresh snapshots are taken before every decision, stale ones at most every 10 ms.
    assert fresh.refreshes == fresh.decisions
    assert 0 < stale.refreshes < stale.decisions
    for small, large in pairs:
        assert (small.router, small.requests * 10) == (large.router, large.requests)
    out = capsys.readouterr().out
    assert "| router | refresh us |" in out and "events/s" in out
    assert "| round_robin |" in out and "ratio" in out
