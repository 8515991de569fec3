"""The fidelity pipeline: measure llama-server, fit simsim to it, predict held-out workloads.

For each server configuration (``--parallel 1`` against simsim's ``single_slot``
engine, ``--parallel 4`` against ``batching``):

1. **setup**: build llama-server and write the model (``setup.sh``; cached).
2. **calibrate**: start the server, ``simsim calibrate --url URL --engine E --workload
   calib.toml --out backend-probes.toml --probes-out probes.csv``: probes at the
   calibration workload's sizes, and the table fitted to them alone.
3. **replay**: play every workload twice against a freshly started server each time
   (``simsim replay W.toml --url URL --out measured/W-runN``): two measurements of the
   same requests, whose difference is the server's own run-to-run noise.
4. **fit**: ``simsim calibrate --from-probes probes.csv --measured measured/calib-run1
   --out backend.toml``: the prefill from the probes, the decode steps from the
   calibration workload's own token gaps (decode calibrated at the batches and contexts
   a workload has; the held-out workloads are never used).
5. **simulate**: the workload file with its placeholder ``[backend]`` replaced by the
   fitted one (``scenarios/W.toml``), run by ``simsim run`` into ``simulated/W``.
6. **compare**: ``simsim compare`` measured run 1 against the simulation, and run 1
   against run 2 (the noise floor), into ``compare/``; then ``summary.json``,
   ``summary.csv`` and ``summary.md`` across everything.

Everything lands in ``benchmarks/fidelity/results/CONFIG/`` (``--results`` moves it).
Each stage reads what the earlier ones wrote, so they run one at a time as well::

    python benchmarks/fidelity/run.py                        # every stage, both configs
    python benchmarks/fidelity/run.py --stage replay --config single_slot --workloads rate
    python benchmarks/fidelity/run.py --stage compare        # only re-reads the folders

The ``simsim`` commands run as subprocesses of this python (``python -m simsim``); their
command lines are built in one place each (``calibrate_command``, ``replay_command``).
Requests carry ``llama.REQUEST_EXTRAS`` (``--extra-body``) for exact lengths.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from llama import REQUEST_EXTRAS, cache_dir, llama_server, model_path  # noqa: E402

STAGES = ("setup", "calibrate", "replay", "fit", "simulate", "compare")
WORKLOADS = ("calib", "rate", "lengths", "bursty")
"""``calib`` is the calibration-range workload (replayed too: an in-sample check); the
other three are held out: another rate, another length mix, bursty arrivals."""
REPEATS = 2
"""Measured runs per workload: two give the run-to-run noise."""
COMPARISONS_FILE = "comparisons.json"
"""Each configuration's comparison records; the summary gathers every configuration's."""
"""Measured runs per workload: two give the run-to-run noise."""


@dataclass(frozen=True)
class ServerConfig:
    """One llama-server configuration and the simsim engine that models it."""

    name: str
    parallel: int
    engine: str

    @property
    def workload_dir(self) -> Path:
        """Where its workload files are."""
        return HERE / "workloads" / self.name


CONFIGS = {
    config.name: config
    for config in (
        ServerConfig("single_slot", 1, "single_slot"),
        ServerConfig("batching", 4, "batching"),
    )
}


def simsim(*args: str) -> list[str]:
    """A ``simsim`` command line run by this python, so the simsim of its environment."""
    return [sys.executable, "-m", "simsim", *args]


def calibrate_command(url: str, engine: str, out: Path, workload: Path) -> list[str]:
    """The calibration command: probes at the calibration workload's sizes, kept beside."""
    return simsim(
        "calibrate",
        "--url",
        url,
        "--engine",
        engine,
        "--workload",
        str(workload),
        "--out",
        str(out),
        "--probes-out",
        str(out.with_name("probes.csv")),
        "--extra-body",
        json.dumps(REQUEST_EXTRAS),
    )


def replay_command(scenario: Path, url: str, out: Path) -> list[str]:
    """The replay command for one measured run."""
    return simsim(
        "replay",
        str(scenario),
        "--url",
        url,
        "--out",
        str(out),
        "--extra-body",
        json.dumps(REQUEST_EXTRAS),
    )


def run_logged(command: Sequence[str], log: Path) -> None:
    """Run *command*, its output shown and kept in *log*; a failure stops the pipeline."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print("$", shlex.join(command), flush=True)
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    log.write_text(result.stdout + result.stderr)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(
            f"run.py: exit status {result.returncode} from: {shlex.join(command)} (log: {log})"
        )
    print(f"  ({time.monotonic() - started:.1f} s; log {log})", flush=True)


def with_backend(scenario_text: str, backend_text: str, source: str) -> str:
    """*scenario_text* with its ``[backend]`` table replaced by *backend_text*'s.

    The workload files carry a placeholder ``[backend]`` (a scenario needs one to be
    valid); the fitted table from ``simsim calibrate`` takes its place, so the simulated
    scenario is the measured one in everything but the cost model.
    """
    backend = tomllib.loads(backend_text)
    if set(backend) != {"backend"}:
        raise ValueError(f"{source}: expected only a [backend] table, found {sorted(backend)}")
    lines = scenario_text.splitlines(keepends=True)
    header = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\"]+)\s*\]\]?")
    out: list[str] = []
    inside = replaced = False
    for line in lines:
        match = header.match(line)
        if match:
            inside = match.group(1) == "backend"
            if inside:
                out.append(backend_text.rstrip("\n") + "\n\n")
                replaced = True
        if not inside:
            out.append(line)
    if not replaced:
        raise ValueError(f"{source}: the scenario has no [backend] table to replace")
    result = "".join(out)
    tomllib.loads(result)  # still one valid document
    return result


class Pipeline:
    """The stages for one server configuration, writing under ``results/CONFIG``."""

    def __init__(self, config: ServerConfig, results: Path, workloads: Sequence[str]) -> None:
        self.config = config
        self.folder = results / config.name
        self.workloads = tuple(workloads)

    def workload_file(self, workload: str) -> Path:
        """The workload's scenario file (placeholder backend)."""
        return self.config.workload_dir / f"{workload}.toml"

    def measured(self, workload: str, run: int) -> Path:
        """The folder of one measured run."""
        return self.folder / "measured" / f"{workload}-run{run}"

    def simulated(self, workload: str) -> Path:
        """The folder of the simulation of a workload."""
        return self.folder / "simulated" / workload

    @property
    def backend_file(self) -> Path:
        """The fitted ``[backend]`` table the simulations use (the fit stage's)."""
        return self.folder / "backend.toml"

    @property
    def probes_backend_file(self) -> Path:
        """The table fitted to the probes alone (the calibrate stage's)."""
        return self.folder / "backend-probes.toml"

    def fit(self) -> None:
        """Refit: prefill from the probes, decode from the calibration workload's run 1."""
        probes = self.folder / "probes.csv"
        if not probes.is_file():
            raise SystemExit(f"run.py: no {probes}: run --stage calibrate first")
        run_logged(
            simsim(
                "calibrate",
                "--from-probes",
                str(probes),
                "--measured",
                str(self.measured("calib", 1)),
                "--engine",
                self.config.engine,
                "--out",
                str(self.backend_file),
            ),
            self.folder / "logs" / "fit.log",
        )

    def server_log(self, name: str) -> Path:
        """Where llama-server's own output for one stage goes."""
        return self.folder / "logs" / f"llama-server-{name}.log"

    def calibrate(self) -> None:
        """Fit the cost model against a freshly started server."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with llama_server(
            model_path(), parallel=self.config.parallel, log_path=self.server_log("calibrate")
        ) as url:
            run_logged(
                calibrate_command(
                    url, self.config.engine, self.probes_backend_file, self.workload_file("calib")
                ),
                self.folder / "logs" / "calibrate.log",
            )

    def replay(self) -> None:
        """Measure every workload REPEATS times, each on a freshly started server."""
        for workload in self.workloads:
            for run in range(1, REPEATS + 1):
                name = f"{workload}-run{run}"
                with llama_server(
                    model_path(), parallel=self.config.parallel, log_path=self.server_log(name)
                ) as url:
                    run_logged(
                        replay_command(
                            self.workload_file(workload), url, self.measured(workload, run)
                        ),
                        self.folder / "logs" / f"replay-{name}.log",
                    )

    def simulate(self) -> None:
        """Run every workload through simsim with the fitted backend."""
        if not self.backend_file.is_file():
            raise SystemExit(f"run.py: no {self.backend_file}: run --stage fit first")
        backend_text = self.backend_file.read_text()
        for workload in self.workloads:
            source = self.workload_file(workload)
            scenario = self.folder / "scenarios" / f"{workload}.toml"
            scenario.parent.mkdir(parents=True, exist_ok=True)
            scenario.write_text(
                f"# {source.relative_to(HERE)} with the [backend] fitted by simsim calibrate\n"
                + with_backend(source.read_text(), backend_text, str(source))
            )
            run_logged(
                simsim("run", str(scenario), "--out", str(self.simulated(workload))),
                self.folder / "logs" / f"simulate-{workload}.log",
            )

    def compare(self) -> list[dict[str, Any]]:
        """Compare measured with simulated, and run 1 with run 2; the summary records."""
        from simsim.fidelity.compare import compare_runs

        records: list[dict[str, Any]] = []
        for workload in self.workloads:
            pairs = {
                "simulated": (self.measured(workload, 1), self.simulated(workload)),
                "noise": (self.measured(workload, 1), self.measured(workload, 2)),
            }
            for kind, (first, second) in pairs.items():
                missing = [str(path) for path in (first, second) if not path.is_dir()]
                if missing:
                    print(f"  skipped {workload} {kind}: no {', '.join(missing)}")
                    continue
                out = self.folder / "compare" / f"{workload}-{kind}"
                run_logged(
                    simsim("compare", str(first), str(second), "--out", str(out)),
                    out.with_suffix(".txt"),
                )
                comparison = compare_runs(first, second)
                records.append(
                    {
                        "config": self.config.name,
                        "workload": workload,
                        "comparison": kind,
                        "a": str(first.relative_to(self.folder.parent)),
                        "b": str(second.relative_to(self.folder.parent)),
                        "errors": _records(comparison.errors),
                        "percentiles": _records(comparison.percentiles),
                    }
                )
        (self.folder / COMPARISONS_FILE).write_text(json.dumps(records, indent=2) + "\n")
        return records


def _records(frame: Any) -> list[dict[str, Any]]:
    """A DataFrame as JSON-ready records (its index kept as columns)."""
    reset = frame.reset_index() if frame.index.name or any(frame.index.names) else frame
    records: list[dict[str, Any]] = json.loads(reset.to_json(orient="records"))
    return records


def _markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)\n"
    columns = list(rows[0])

    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(column)) for column in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_summary(results: Path) -> None:
    """``summary.json``, ``summary.csv`` (error rows) and ``summary.md`` of every config.

    Gathers each configuration's ``comparisons.json``, so comparing one configuration
    again keeps the other's numbers in the summary.
    """
    records: list[dict[str, Any]] = []
    for name in CONFIGS:
        path = results / name / COMPARISONS_FILE
        if path.is_file():
            records += json.loads(path.read_text())
    conditions = {
        "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "server": _server_version(),
        "cache": str(cache_dir()),
    }
    (results / "summary.json").write_text(
        json.dumps({"conditions": conditions, "comparisons": records}, indent=2) + "\n"
    )
    flat = [
        {key: record[key] for key in ("config", "workload", "comparison")} | row
        for record in records
        for row in record["errors"]
    ]
    if flat:
        import pandas as pd

        pd.DataFrame(flat).to_csv(results / "summary.csv", index=False)
    parts = ["# Fidelity against llama-server\n", f"Conditions: `{json.dumps(conditions)}`\n"]
    parts.append(
        "`simulated` compares measured run 1 with simsim's prediction; `noise` compares "
        "measured run 1 with run 2 of the same requests (the server's own run-to-run "
        "difference).\n"
    )
    for record in records:
        parts.append(f"## {record['config']} / {record['workload']} / {record['comparison']}\n")
        parts.append(f"{record['a']} vs {record['b']}\n")
        parts.append("Per-request errors:\n\n" + _markdown(record["errors"]))
        parts.append("Percentiles:\n\n" + _markdown(record["percentiles"]))
    (results / "summary.md").write_text("\n".join(parts))
    print(f"wrote {results / 'summary.json'}, summary.csv and summary.md")


def _server_version() -> str:
    from llama import server_binary

    binary = server_binary()
    try:
        result = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            check=False,
            env={"LD_LIBRARY_PATH": str(binary.parent)},
        )
    except OSError as error:
        return f"unavailable ({error})"
    return (
        (result.stdout + result.stderr).strip().splitlines()[0]
        if result.returncode == 0
        else "unavailable"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and run the chosen stages."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=(*STAGES, "all"), default="all")
    parser.add_argument("--config", choices=(*CONFIGS, "all"), default="all")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, of {', '.join(WORKLOADS)}",
    )
    parser.add_argument("--results", type=Path, default=HERE / "results", help="output folder")
    args = parser.parse_args(argv)
    workloads = [name for name in args.workloads.split(",") if name]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; the workloads are {', '.join(WORKLOADS)}")
    stages = STAGES if args.stage == "all" else (args.stage,)
    configs = list(CONFIGS.values()) if args.config == "all" else [CONFIGS[args.config]]

    if "setup" in stages:
        run_logged(["bash", str(HERE / "setup.sh")], cache_dir() / "setup.log")
    for config in configs:
        pipeline = Pipeline(config, args.results, workloads)
        print(
            f"== {config.name}: llama-server --parallel {config.parallel} vs simsim {config.engine}"
        )
        if "calibrate" in stages:
            pipeline.calibrate()
        if "replay" in stages:
            pipeline.replay()
        if "fit" in stages:
            pipeline.fit()
        if "simulate" in stages:
            pipeline.simulate()
        if "compare" in stages:
            pipeline.compare()
    if "compare" in stages:
        write_summary(args.results)


if __name__ == "__main__":
    main()
