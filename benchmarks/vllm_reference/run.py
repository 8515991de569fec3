"""Predict real vLLM runs from their settings and compare with what was measured.

    python benchmarks/vllm_reference/run.py --cases CSV --out DIR [--coefficients JSON]
        [--scenarios]

With ``--scenarios``, each row is also written as a scenario file
(``DIR/scenarios/case_<id>.toml``, ``engine = "vllm"``) that ``simsim run`` runs.

*CSV* has ``train.csv``'s input columns (``../shared/vllm-reference/README.md``); its
measured columns, if any, are never used for a prediction. Each experiment is simulated
once (all its stages) with the shipped coefficients of the physics cost model (or those
of ``--coefficients``, a JSON object of :class:`simsim.gpu.physics.PhysicsCoefficients`
fields; those it leaves out keep their shipped values). Writes ``DIR/predictions.csv``
(``case_id``, the seven latency metrics, ``overloaded``); where measured columns are
present also ``DIR/errors.csv`` (signed percentage errors per case) and
``DIR/summary.csv`` (median and mean absolute percentage error per metric over the rows
whose ``quality_flag`` is ``ok``), and prints the summary. Bad input is one line
(``run.py: error: ...``, exit status 2) before anything is simulated.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import pandas as pd

from simsim.gpu.physics import DEFAULT_COEFFICIENTS
from simsim.gpu.reference import (
    ReferenceCase,
    case_scenario,
    error_summary,
    predict_cases,
    prediction_errors,
    read_cases,
    scenario_toml,
)


def _fail(message: str) -> int:
    print(f"run.py: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", required=True, help="CSV with train.csv's input columns")
    parser.add_argument("--out", required=True, help="folder for the CSV files written")
    parser.add_argument(
        "--coefficients",
        help="JSON file of PhysicsCoefficients fields (others: the shipped values)",
    )
    parser.add_argument(
        "--scenarios",
        action="store_true",
        help="also write each row as a scenario file, DIR/scenarios/case_<id>.toml",
    )
    args = parser.parse_args(argv)
    coefficients = DEFAULT_COEFFICIENTS
    # Bad input is one line naming the file and the rule, before anything is simulated.
    try:
        if args.coefficients:
            fields = json.loads(Path(args.coefficients).read_text())
            coefficients = dataclasses.replace(DEFAULT_COEFFICIENTS, **fields)
    except (OSError, ValueError, TypeError) as error:
        return _fail(f"--coefficients {args.coefficients}: {error}")
    try:
        table = pd.read_csv(args.cases)
        cases = read_cases(table)
    except (OSError, ValueError) as error:
        return _fail(f"--cases {args.cases}: {error}")
    if args.scenarios:
        folder = Path(args.out) / "scenarios"
        folder.mkdir(parents=True, exist_ok=True)
        for case in cases:
            text = scenario_toml(case_scenario(case))
            (folder / f"case_{case.case_id}.toml").write_text(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    experiments = len({case.experiment for case in cases})
    done = []

    def progress(case: object) -> None:
        done.append(case)
        print(f"  experiment {len(done)}/{experiments}", file=sys.stderr, flush=True)

    def skipped(case: ReferenceCase, reason: str) -> None:
        print(f"run.py: case {case.case_id} not predicted: {reason}", file=sys.stderr)

    predictions = predict_cases(cases, coefficients, progress=progress, skipped=skipped)
    predictions.to_csv(out / "predictions.csv", index=False)
    elapsed = time.perf_counter() - started
    print(f"{len(cases)} cases, {experiments} experiments simulated in {elapsed:.1f} s")
    if any(column.endswith("_ms") for column in table.columns):
        errors = prediction_errors(predictions, table)
        errors.to_csv(out / "errors.csv", index=False)
        ok = errors["quality_flag"].eq("ok") if "quality_flag" in errors else None
        summary = error_summary(errors, ok)
        summary.to_csv(out / "summary.csv", index=False)
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        if "quality_flag" in errors:
            flagged = errors[~errors["quality_flag"].eq("ok")]
            hits = int(flagged["overloaded"].sum())
            print(f"overloaded runs recognised: {hits} of {len(flagged)} flagged rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
