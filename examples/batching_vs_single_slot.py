"""Continuous batching against the single slot, across arrival rates.

The same Poisson workload (the same seed, so the same requests) is offered at rising
rates to two servers with the same cost model: the original single-slot server, and a
continuous-batching server with 16 slots, chunked prefill ("mixed", 512 tokens per
iteration) and a paged KV cache. A decode step costs a little more per request in the
batch, so batching trades a slightly slower step for many more tokens per step.

Run it:  python examples/batching_vs_single_slot.py [--out FOLDER] [--no-plot]
It prints a table and, when matplotlib is installed, draws the trade-off to
FOLDER/batching_vs_single_slot.png (FOLDER is created if needed; default:
simsim-results/examples, beside the folder ``simsim run`` writes by default).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

import simsim
from simsim import workloads

COSTS = simsim.SimulatedBackendConfig(
    prefill_base_us=2_000,
    prefill_per_token_us=50,
    prefill_per_active_sequence_us=100,
    decode_base_us=8_000,
    decode_per_active_sequence_us=300,
)
DEFAULT_OUT = Path("simsim-results") / "examples"
FIGURE = "batching_vs_single_slot.png"
RATES_PER_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
REQUESTS = 300


def make_engine(server: str) -> simsim.SimulationEngine | simsim.BatchingEngine:
    """A fresh server of the named kind with the shared cost model."""
    backend = simsim.SimulatedBackend(COSTS)
    if server == "single slot":
        return simsim.SimulationEngine(backend)
    return simsim.BatchingEngine(
        backend,
        max_active_requests=16,
        max_batch_tokens=512,
        policy="mixed",
        kv_cache=simsim.KvCacheConfig(block_size_tokens=16, total_blocks=512),
    )


def run(server: str, rate_per_s: float, seed: int = 5) -> dict[str, float]:
    """Offer REQUESTS requests at *rate_per_s* to *server*; return its key figures."""
    workload = workloads.OpenLoopWorkload(
        arrivals=workloads.PoissonArrivals(rate_per_s),
        prompt_tokens=workloads.Uniform(64, 512),
        output_tokens=workloads.Uniform(32, 256),
        count=REQUESTS,
    )
    engine = make_engine(server)
    workload.submit_to(engine, seed)
    engine.run()
    summary = simsim.summarize(engine.requests_frame())["value"]
    return {
        "rate_per_s": rate_per_s,
        "server": server,  # type: ignore[dict-item]
        "tokens_per_s": summary["throughput_tokens_per_s"],
        "ttft_p50_ms": summary["ttft_us_p50"] / 1000,
        "e2e_p90_ms": summary["e2e_latency_us_p90"] / 1000,
    }


def plot(table: pd.DataFrame, path: Path) -> bool:
    """Draw throughput and p90 latency against the offered rate; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for server, rows in table.groupby("server", sort=False):
        left.plot(rows["rate_per_s"], rows["tokens_per_s"], "o-", label=server)
        right.plot(rows["rate_per_s"], rows["e2e_p90_ms"] / 1000, "o-", label=server)
    left.set(ylabel="throughput (tokens/s)")
    right.set(ylabel="p90 e2e latency (s)", yscale="log")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(RATES_PER_S, [f"{rate:g}" for rate in RATES_PER_S])
        ax.minorticks_off()
        ax.set_xlabel("offered load (requests/s)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("Batching vs single slot (simulated from the cost model, not measured)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(out: Path | None = DEFAULT_OUT) -> pd.DataFrame:
    """Sweep the rates for both servers, print the table, draw the plot into *out*.

    *out* is a folder, created if needed; ``None`` draws nothing.
    """
    rows = [run(server, rate) for rate in RATES_PER_S for server in ("single slot", "batching")]
    table = pd.DataFrame(rows)
    print(f"{REQUESTS} requests per run; times simulated from the cost model")
    print(f"{'rate/s':>7}  {'server':<12}{'tokens/s':>10}{'p50 TTFT':>12}{'p90 e2e':>12}")
    for row in rows:
        print(
            f"{row['rate_per_s']:>7.2f}  {row['server']:<12}{row['tokens_per_s']:>10.1f}"
            f"{row['ttft_p50_ms'] / 1000:>11.2f}s{row['e2e_p90_ms'] / 1000:>11.2f}s"
        )
    if out is not None and plot(table, Path(out) / FIGURE):
        print(f"plot: {Path(out) / FIGURE}")
    return table


def parse_args(argv: Sequence[str] | None = None) -> Path | None:
    """The folder for the figure from the command line (``None`` with ``--no-plot``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="folder for the figure (default: %(default)s)"
    )
    parser.add_argument("--no-plot", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    if args.no_plot:
        return None
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a folder")  # before the runs, not after
    return Path(args.out)


if __name__ == "__main__":
    main(parse_args())
