"""Fit the physics cost model's coefficients on real vLLM runs: the documented procedure.

    python benchmarks/vllm_reference/fit.py --train ../shared/vllm-reference/train.csv \
        --out DIR [--iterations 4] [--workers 2] [--cv]

It needs SciPy (``pip install '.[test]'``). What it does (``docs/predict.md``, "Fitting"):

1. Take the experiments of ``train.csv`` whose every row is ``quality_flag == ok`` (the
   overloaded runs are for checking that overload is recognised, not for fitting step
   costs).
2. Simulate each with the current coefficients, recording every step's physical terms
   (:meth:`simsim.gpu.physics.PhysicsBackend.terms`). With the schedule held fixed, every
   request's time to first token and end-to-end latency is a sum of the steps it lived
   through (the one in progress at its arrival counted by the fraction it waited), so each
   latency is *linear* in the coefficients: the memory or compute term of each step
   (whichever bound it), the all-reduce terms, the per-step, per-layer and per-sequence
   overheads, and the request-level terms. Each stage row's mean, p90 and p99 of both
   become one linear equation (a percentile through the requests around it), divided by
   the measured value so that every equation is a relative error. The ITL mean is not
   fitted: the CSV derives it from the E2E and TTFT means (over re-tokenised output
   counts), so it is only checked.
3. Solve the bounded least-squares problem (scales between 1, the datasheet, and a
   physical limit; overheads non-negative; ``per_output_token_us`` held at 0 because
   every usable training run asks for about 250 output tokens, which makes it
   indistinguishable from the per-step terms), then re-simulate with the answer and keep
   it only if the simulated error fell (halving the step otherwise): a damped
   Gauss-Newton iteration on the real simulator, repeated ``--iterations`` times.
4. With ``--cv``: leave one experiment out. For each of the 16 experiments, fit on the
   others (the least squares of step 3 on their equations, starting from the
   full fit's simulations) and simulate the one left out with those coefficients; report
   its errors (and whether an overloaded one is recognised).

Writes ``DIR/coefficients.json`` and, with ``--cv``, ``DIR/cv_predictions.csv``; prints
the in-sample and cross-validated median absolute percentage errors per metric.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import lsq_linear

from simsim.gpu.physics import PhysicsBackend, PhysicsCoefficients, client_latencies
from simsim.gpu.reference import (
    METRICS,
    ReferenceCase,
    case_metrics,
    case_requests,
    error_summary,
    prediction_errors,
    read_cases,
)

NAMES = [spec.name for spec in fields(PhysicsCoefficients)]
# Bounds per coefficient, in PhysicsCoefficients' field order.
LOWER = {name: 0.0 for name in NAMES} | {
    "memory_scale": 1.0,
    "compute_scale": 1.0,
    "allreduce_scale": 1.0,
}
UPPER = {name: np.inf for name in NAMES} | {
    "memory_scale": 5.0,
    "compute_scale": 5.0,
    "allreduce_scale": 2.0,
    "at_completion_us": 5000.0,
}
START = PhysicsCoefficients(
    memory_scale=1.2,
    compute_scale=3.0,
    allreduce_scale=2.0,
    per_step_us=0.0,
    per_layer_us=40.0,
    per_sequence_us=10.0,
    before_queue_us=20000.0,
    per_output_token_us=0.0,
    at_completion_us=0.0,
    allreduce_latency_us=10.0,
)
# The measured ITL is derived from the measured E2E and TTFT means (over the re-tokenised
# output count, which is sometimes well below the tokens generated), so it is checked,
# not fitted: fitting it too would weigh E2E and TTFT twice, once inconsistently.
FITTED_METRICS = tuple(metric for metric in METRICS if metric != "itl_mean_ms")
# Columns of a step's basis vector, in NAMES order; request-level ones are added per metric.
_STEP_TERMS = (
    "memory_scale",
    "compute_scale",
    "allreduce_scale",
    "per_step_us",
    "per_layer_us",
    "per_sequence_us",
    "allreduce_latency_us",
)


class RecordingBackend(PhysicsBackend):
    """The physics backend, keeping every step's terms."""

    __slots__ = ("steps",)

    def step_us(self, prefills: Any, decodes: Any) -> int:
        self.steps.append(self.terms(prefills, decodes))
        return super().step_us(prefills, decodes)


def simulate(case: ReferenceCase, coefficients: PhysicsCoefficients) -> dict[str, Any]:
    """One experiment's requests (as a client sees them) and each request's step basis."""
    config = case.server(coefficients)
    backend = RecordingBackend(config.model, config.gpu, config.tp, coefficients=coefficients)
    backend.steps = []
    engine = config.engine(backend=backend)
    for spec in case_requests(case):
        engine.submit(spec)
    engine.run()
    frame = client_latencies(engine.requests_frame(), config.frontend)
    iterations = engine.iterations_frame()
    terms = np.array(backend.steps, dtype=float).reshape(-1, 6)
    c = coefficients
    memory_bound = c.memory_scale * terms[:, 0] >= c.compute_scale * terms[:, 1]
    basis = np.column_stack(
        [
            terms[:, 0] * memory_bound,
            terms[:, 1] * ~memory_bound,
            terms[:, 2],
            np.ones(len(terms)),
            terms[:, 3],
            terms[:, 4],
            terms[:, 5],
        ]
    )
    cumulative = np.vstack([np.zeros(basis.shape[1]), np.cumsum(basis, axis=0)])
    start = iterations["start_us"].to_numpy(float)
    end = iterations["end_us"].to_numpy(float)
    arrival = frame["arrival_time_us"].to_numpy(float)

    def lived_through(until: np.ndarray) -> np.ndarray:
        last = np.searchsorted(end, until, side="left")  # the step that ends at `until`
        first = np.searchsorted(end, arrival, side="right")  # in progress at arrival
        waited = (end[first] - np.maximum(arrival, start[first])) / np.maximum(
            end[first] - start[first], 1
        )
        return (
            cumulative[last + 1]
            - cumulative[first + 1]
            + np.clip(waited, 0, 1)[:, None] * basis[first]
        )

    return {
        "frame": frame,
        "ttft": lived_through(frame["first_token_time_us"].to_numpy(float)),
        "e2e": lived_through(frame["finish_time_us"].to_numpy(float)),
    }


def _row(values: np.ndarray, basis: np.ndarray, quantile: float | None) -> np.ndarray:
    if quantile is None:
        return basis.mean(axis=0)
    order = np.argsort(values)
    middle = int(quantile * len(values))
    half = max(1, len(values) // 200)
    return basis[order[max(middle - half, 0) : min(middle + half, len(values))]].mean(axis=0)


def equations(case: ReferenceCase, run: dict[str, Any]) -> dict[str, np.ndarray]:
    """Each metric of *case*'s stage as a row over the coefficients (milliseconds)."""
    frame = run["frame"]
    low, high = case.stage_window_us()
    chosen = ((frame["arrival_time_us"] >= low) & (frame["arrival_time_us"] < high)).to_numpy()
    tokens = float(frame["generated_token_count"].to_numpy(float)[chosen].mean())
    rows: dict[str, np.ndarray] = {}
    for name, column, extra in (
        ("ttft", "client_ttft_us", {"before_queue_us": 1.0}),
        (
            "e2e",
            "client_e2e_us",
            {"before_queue_us": 1.0, "per_output_token_us": tokens, "at_completion_us": 1.0},
        ),
    ):
        values = frame[column].to_numpy(float)[chosen]
        basis = run[name][chosen]
        for label, quantile in (("mean", None), ("p90", 0.90), ("p99", 0.99)):
            step = _row(values, basis, quantile)
            row = np.zeros(len(NAMES))
            for k, term in enumerate(_STEP_TERMS):
                row[NAMES.index(term)] = step[k]
            for term, weight in extra.items():
                row[NAMES.index(term)] = weight
            rows[f"{name}_{label}_ms"] = row / 1e3
    rows["itl_mean_ms"] = (rows["e2e_mean_ms"] - rows["ttft_mean_ms"]) / max(tokens - 1, 1)
    return rows


def system(cases: list[ReferenceCase], runs: dict[Any, dict[str, Any]], measured: pd.DataFrame):
    """The relative-error equations of every case's metrics: (X, case ids)."""
    by_id = measured.set_index(measured["case_id"].astype(str))
    rows, ids = [], []
    for case in cases:
        found = equations(case, runs[case.experiment])
        for metric in FITTED_METRICS:
            rows.append(found[metric] / float(by_id.loc[case.case_id, metric]))
            ids.append(case.case_id)
    return np.array(rows), ids


def _simulate_job(job: tuple[ReferenceCase, PhysicsCoefficients]) -> dict[str, Any]:
    return simulate(*job)


def simulate_all(cases, coefficients, pool) -> dict[Any, dict[str, Any]]:
    experiments = {case.experiment: case for case in cases}
    jobs = [(case, coefficients) for case in experiments.values()]
    return dict(zip(experiments, pool.map(_simulate_job, jobs), strict=True))


def solve(x: np.ndarray) -> PhysicsCoefficients:
    lower = np.array([LOWER[n] for n in NAMES])
    upper = np.array([UPPER[n] for n in NAMES])
    answer = lsq_linear(x, np.ones(len(x)), bounds=(lower, upper)).x
    return PhysicsCoefficients(**dict(zip(NAMES, answer.tolist(), strict=True)))


def loss(x: np.ndarray, c: PhysicsCoefficients) -> tuple[float, float]:
    residual = x @ np.array([getattr(c, n) for n in NAMES]) - 1
    return float(np.mean(residual**2)), float(np.median(np.abs(residual)))


def blend(a: PhysicsCoefficients, b: PhysicsCoefficients, weight: float) -> PhysicsCoefficients:
    return PhysicsCoefficients(
        **{n: getattr(a, n) + weight * (getattr(b, n) - getattr(a, n)) for n in NAMES}
    )


def fit(cases, measured, pool, iterations, start=START, log=print):
    coefficients = start
    runs = simulate_all(cases, coefficients, pool)
    x, _ = system(cases, runs, measured)
    current, median = loss(x, coefficients)
    log(f"start: mean squared relative error {current:.4f}, median {100 * median:.1f}%")
    for k in range(iterations):
        target = solve(x)
        for weight in (1.0, 0.5, 0.25):
            candidate = blend(coefficients, target, weight)
            candidate_runs = simulate_all(cases, candidate, pool)
            cx, _ = system(cases, candidate_runs, measured)
            value, median = loss(cx, candidate)
            log(f"iteration {k + 1} step {weight}: {value:.4f}, median {100 * median:.1f}%")
            if value < current:
                coefficients, runs, x, current = candidate, candidate_runs, cx, value
                break
        else:
            break
    return coefficients, runs, x


def predictions_of(cases, runs) -> pd.DataFrame:
    return pd.DataFrame([case_metrics(runs[case.experiment]["frame"], case) for case in cases])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cv", action="store_true")
    args = parser.parse_args(argv)
    measured = pd.read_csv(args.train)
    measured["case_id"] = measured["case_id"].astype(str)
    cases = read_cases(measured)
    flags = measured.set_index("case_id")["quality_flag"]
    experiments: dict[Any, list[ReferenceCase]] = {}
    for case in cases:
        experiments.setdefault(case.experiment, []).append(case)
    usable = [
        c
        for group in experiments.values()
        if all(flags[x.case_id] == "ok" for x in group)
        for c in group
        if c.stage_index >= 0
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.workers) as pool:
        coefficients, runs, _ = fit(usable, measured, pool, args.iterations)
        (out / "coefficients.json").write_text(json.dumps(asdict(coefficients), indent=2) + "\n")
        print(f"fitted in {time.perf_counter() - started:.0f} s: {coefficients}")
        all_runs = simulate_all(cases, coefficients, pool)
        in_sample = prediction_errors(predictions_of(cases, all_runs), measured)
        in_sample.to_csv(out / "in_sample_errors.csv", index=False)
        print("in-sample (rows with quality_flag ok):")
        print(error_summary(in_sample, in_sample["quality_flag"].eq("ok")).to_string(index=False))
        if args.cv:
            folds = []
            for key, group in experiments.items():
                rest = [c for c in usable if c.experiment != key]
                fold_x, _ = system(rest, runs, measured)
                folds.append((group[0], solve(fold_x)))
            held_out = [
                predictions_of(group, {key: run})
                for (key, group), run in zip(
                    experiments.items(), pool.map(_simulate_job, folds), strict=True
                )
            ]
            cv = prediction_errors(pd.concat(held_out, ignore_index=True), measured)
            cv.to_csv(out / "cv_errors.csv", index=False)
            print("leave-one-experiment-out (rows with quality_flag ok):")
            print(error_summary(cv, cv["quality_flag"].eq("ok")).to_string(index=False))
            flagged = cv[~cv["quality_flag"].eq("ok")]
            print(
                f"overloaded rows recognised: {int(flagged['overloaded'].sum())} of {len(flagged)}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
