"""A fleet of batching replicas at scale: wall time and peak memory against requests and
replicas, and the million-request run.

The fleet is ``benchmarks/cluster.py``'s: ``BatchingEngine`` replicas (16 slots, mixed
policy, a paged KV cache, the linear cost model) behind one router on one environment,
fed one Poisson stream at 10 requests/s per replica (about ten requests in a batch),
prompts of 64 to 512 tokens and outputs of 32 to 128. Each run is one child process, so
that its peak resident memory (``ru_maxrss``, the whole process: Python, NumPy, pandas
and simsim included) is its own; the wall time covers building the fleet, submitting
every request, running to the end and making the request table.

Three tables:

- **side by side**: the same fleet with stretches and step by step
  (``stretches=False``), at ``--compare`` requests, alternated in this run;
- **requests**: 64 replicas, 1e3 to 1e6 requests (``--sizes``);
- **replicas**: 1e5 requests on 1 to 256 replicas (``--replicas``).

The growth columns divide the time per request (or per routed request) by the smallest
run's: flat means linear in the requests; see ``docs/performance.md``, "Fleets".

Run it:  python benchmarks/fleet.py [--quick] [--plot docs/performance_fleet.png]
Times are wall times on this machine (other programs share it: run it when it is
quiet); the simulated times come from the cost model, never from measured hardware.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import simsim

# The fleet of benchmarks/cluster.py: its cost model, batch size, load and workload.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster import fleet, workload

REQUEST_SIZES = (1_000, 10_000, 100_000, 1_000_000)
REPLICA_COUNTS = (1, 4, 16, 64, 256)


@dataclass(frozen=True)
class Run:
    """One fleet run, measured in its own process."""

    requests: int
    replicas: int
    router: str
    stretches: bool
    wall_s: float
    peak_rss_mb: float
    events: int
    tokens: int

    @property
    def us_per_request(self) -> float:
        return self.wall_s * 1e6 / self.requests

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s


def simulate(
    requests: int, replicas: int, router: str, stretches: bool | None, seed: int = 0
) -> Run:
    """Build and run the fleet here (call it in a child process: see :func:`measure`)."""
    arrivals, prompts, outputs = workload(requests, replicas, seed)
    started = time.perf_counter()
    env = simsim.Environment()
    # None: the engine's own default (a baseline from before stretches has no keyword).
    engines = fleet(env, replicas, **({} if stretches is None else {"stretches": stretches}))
    seeded = {"seed": seed} if router in ("random", "power_of_two") else {}
    cluster = simsim.Cluster(engines, simsim.cluster.make_router(router, **seeded))
    for request_id in range(requests):
        cluster.submit(
            simsim.Request(
                request_id, arrivals[request_id], prompts[request_id], outputs[request_id]
            )
        )
    cluster.run()
    frame = cluster.requests_frame()
    wall_s = time.perf_counter() - started
    if not (frame["state"] == "FINISHED").all():
        raise RuntimeError("not every request finished")
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return Run(
        requests=requests,
        replicas=replicas,
        router=router,
        stretches=bool(stretches is None or stretches),
        wall_s=wall_s,
        peak_rss_mb=peak_kb / 1024,
        events=sum(engine.processed_event_count for engine in engines),
        tokens=int(sum(outputs)),
    )


def measure(
    requests: int,
    replicas: int,
    router: str = "round_robin",
    stretches: bool | None = True,
    simsim_path: Path | None = None,
) -> Run:
    """:func:`simulate` in a fresh child process (this script with ``--child``), for its
    own peak memory; with *simsim_path*, on the simsim found there (a checkout of
    another commit: see ``--baseline``)."""
    spec = json.dumps([requests, replicas, router, stretches])
    environ = dict(os.environ)
    if simsim_path is not None:
        environ["PYTHONPATH"] = str(simsim_path)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", spec],
        check=True,
        capture_output=True,
        text=True,
        env=environ,
    )
    return Run(**json.loads(done.stdout.splitlines()[-1]))


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """A temporary git worktree of *revision* of this repository (removed after)."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="simsim-baseline-") as folder:
        path = Path(folder) / "tree"
        subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "--detach", str(path), revision],
            check=True,
            capture_output=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(root), "worktree", "remove", "--force", str(path)],
                check=False,
                capture_output=True,
            )


def growth_table(runs: Sequence[Run], by: str) -> str:
    """Wall time and memory against *by* (``requests`` or ``replicas``), as Markdown."""
    base = runs[0]
    lines = [
        "| requests | replicas | wall s | requests/s | us/request "
        f"| growth (us/request, against {getattr(base, by):,} {by}) | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        lines.append(
            f"| {run.requests:,} | {run.replicas} | {run.wall_s:.2f} "
            f"| {run.requests_per_s:,.0f} | {run.us_per_request:.1f} "
            f"| {run.us_per_request / base.us_per_request:.2f} | {run.peak_rss_mb:,.0f} |"
        )
    return "\n".join(lines)


def compare_table(pairs: Sequence[tuple[Run, Run]]) -> str:
    """Step by step against stretches, per router, as Markdown."""
    lines = [
        "| router | requests | replicas | step by step s | stretches s | ratio "
        "| requests/s with stretches |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for slow, fast in pairs:
        lines.append(
            f"| {fast.router} | {fast.requests:,} | {fast.replicas} | {slow.wall_s:.2f} "
            f"| {fast.wall_s:.2f} | {slow.wall_s / fast.wall_s:.2f}x "
            f"| {fast.requests_per_s:,.0f} |"
        )
    return "\n".join(lines)


def plot(by_requests: Sequence[Run], by_replicas: Sequence[Run], path: Path) -> None:
    """Wall time and peak memory against requests and replicas (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    x = [run.requests for run in by_requests]
    left.loglog(x, [run.wall_s for run in by_requests], "o-", label="wall s")
    left.loglog(x, [run.peak_rss_mb / 1e3 for run in by_requests], "s--", label="peak RSS GB")
    left.set_xlabel(f"requests ({by_requests[0].replicas} replicas)")
    left.legend()
    left.grid(True, which="both", alpha=0.3)
    x = [run.replicas for run in by_replicas]
    right.semilogx(x, [run.us_per_request for run in by_replicas], "o-", label="us per request")
    right.set_xlabel(f"replicas ({by_replicas[0].requests:,} requests)")
    right.legend()
    right.grid(True, which="both", alpha=0.3)
    figure.suptitle("simsim batching fleet: cost against requests and replicas (this machine)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(REQUEST_SIZES))
    parser.add_argument("--replicas", type=int, nargs="+", default=list(REPLICA_COUNTS))
    parser.add_argument("--fleet", type=int, default=64, help="replicas of the requests table")
    parser.add_argument(
        "--per-replica-table", type=int, default=100_000, help="requests of the replicas table"
    )
    parser.add_argument("--compare", type=int, default=20_000, help="requests side by side")
    parser.add_argument("--plot", type=Path, help="write the scaling plot here")
    parser.add_argument("--quick", action="store_true", help="a small run for the smoke test")
    parser.add_argument(
        "--baseline",
        metavar="REVISION",
        help="also run the side-by-side fleet on this git revision's simsim (a temporary "
        "worktree), alternated with today's: its figures re-measured in the same run",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one run, printed as JSON
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(dataclasses.asdict(simulate(*json.loads(args.child)))))
        return 0
    if args.quick:
        args.sizes, args.replicas, args.fleet = [200, 1_000], [1, 4], 4
        args.per_replica_table, args.compare = 1_000, 500
    pairs = []
    for router in ("round_robin", "power_of_two"):
        slow = measure(args.compare, args.fleet, router, stretches=False)
        fast = measure(args.compare, args.fleet, router)
        pairs.append((slow, fast))
    print(f"Step by step and with stretches, side by side ({args.fleet} replicas)")
    print(compare_table(pairs))
    if args.baseline is not None:
        with checkout(args.baseline) as tree:
            versus = []
            for router in ("round_robin", "power_of_two"):
                before = measure(args.compare, args.fleet, router, None, simsim_path=tree)
                after = measure(args.compare, args.fleet, router)
                versus.append((before, after))
        print()
        print(f"Revision {args.baseline} (left) against this tree, alternated, same run")
        print(compare_table(versus).replace("step by step s", f"{args.baseline} s"))
    by_requests = [measure(size, args.fleet) for size in args.sizes]
    print()
    print(f"Requests through {args.fleet} replicas (round robin)")
    print(growth_table(by_requests, "requests"))
    by_replicas = [measure(args.per_replica_table, count) for count in args.replicas]
    print()
    print(f"{args.per_replica_table:,} requests on more replicas (round robin)")
    print(growth_table(by_replicas, "replicas"))
    if args.plot is not None:
        plot(by_requests, by_replicas, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
