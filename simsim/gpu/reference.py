"""Real vLLM runs as simsim cases: predict them, and compare with what was measured.

A *case* is one row of a table with the input columns of ``train.csv`` (the vLLM
reference set's README explains them): a server (model, GPU, TP, replicas, vLLM's
settings), an inference-perf workload (``shared_prefix`` data under ``constant`` load in
stages) and the stage the row describes (``stage_index = -1``: the whole run). Rows of
one experiment share everything but the stage, so each experiment is simulated once and
each row reads its stage's requests (those that arrived during the stage).

Predictions never read a measured column. :func:`predict_cases` gives, per case, the
latencies a client sees (the engine's plus the frontend's overheads: see
:func:`simsim.gpu.physics.client_latencies`), ``itl_mean_ms`` as the CSV defines it
(``(e2e_mean - ttft_mean) / (mean output tokens - 1)``) and ``overloaded``;
:func:`prediction_errors` compares them with the measured columns where present.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simsim.cluster import Cluster
from simsim.gpu.deployment import client_metrics
from simsim.gpu.memory import DoesNotFitError
from simsim.gpu.models import load_model
from simsim.gpu.physics import PhysicsCoefficients, client_latencies
from simsim.gpu.vllm import VllmConfig
from simsim.overload import overload_check
from simsim.request import RequestSpec
from simsim.workloads import Fixed, OpenLoopWorkload, SharedPrefixes
from simsim.workloads.arrivals import Stage, StagedArrivals

__all__ = [
    "INPUT_COLUMNS",
    "METRICS",
    "SEED",
    "ReferenceCase",
    "case_metrics",
    "case_requests",
    "case_scenario",
    "case_workload",
    "error_summary",
    "predict_cases",
    "prediction_errors",
    "read_cases",
    "scenario_toml",
    "simulate_case",
]

INPUT_COLUMNS = (
    "case_id",
    "model",
    "hardware",
    "tp",
    "dp",
    "precision",
    "max_num_batched_tokens",
    "max_num_seqs",
    "gpu_mem_util",
    "stage_index",
    "all_stage_rates_rps",
    "all_stage_durations_s",
    "system_prompt_len",
    "question_len",
    "output_len",
    "num_unique_system_prompts",
    "num_users_per_system_prompt",
)
"""The columns a case is read from; any other column (measurements) is ignored."""

METRICS = (
    "e2e_mean_ms",
    "e2e_p90_ms",
    "e2e_p99_ms",
    "ttft_mean_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "itl_mean_ms",
)
"""The predicted latencies, named as ``train.csv`` names the measured ones."""

_BLOCK_TOKENS = 16
SEED = 0
"""The seed every case's workload is drawn from (one run per experiment, as measured)."""


@dataclass(frozen=True, slots=True)
class ReferenceCase:
    """One row's inputs: the server, the workload and the stage it describes."""

    case_id: str
    model: str
    hardware: str
    tp: int
    dp: int
    precision: str | None
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_mem_util: float
    stage_index: int
    stage_rates_rps: tuple[float, ...]
    stage_durations_s: tuple[float, ...]
    system_prompt_len: int
    question_len: int
    output_len: int
    num_unique_system_prompts: int
    num_users_per_system_prompt: int

    @property
    def experiment(self) -> tuple[Any, ...]:
        """Everything but the case id and the stage: rows with the same experiment are
        simulated once."""
        return tuple(
            getattr(self, name) for name in self.__slots__ if name not in ("case_id", "stage_index")
        )

    def server(self, coefficients: PhysicsCoefficients | None = None) -> VllmConfig:
        """The vLLM replica this case ran (its precision: FP8 when the row says so)."""
        model = load_model(self.model, precision=self.precision)
        return VllmConfig(
            model,
            self.hardware,
            self.tp,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            gpu_mem_util=self.gpu_mem_util,
            coefficients=coefficients,
        )

    def stage_window_us(self) -> tuple[int, int]:
        """The arrival window of this row's stage in microseconds (the whole run for -1)."""
        starts = np.concatenate([[0.0], np.cumsum(self.stage_durations_s)])
        if self.stage_index < 0:
            return 0, round(starts[-1] * 1e6)
        return round(starts[self.stage_index] * 1e6), round(starts[self.stage_index + 1] * 1e6)


def _cell(row: pd.Series, name: str) -> Any:
    value = row.get(name)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _numbers(text: object, name: str, case_id: object) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in str(text).split(";"))
    except ValueError:
        raise ValueError(
            f"case {case_id}: {name} must be ';'-separated numbers, got {text!r}"
        ) from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"case {case_id}: {name} must be positive numbers, got {text!r}")
    return values


def _integer(row: pd.Series, name: str, case_id: object) -> int:
    value = _cell(row, name)
    if value is None:
        raise ValueError(f"case {case_id}: {name} is empty; it must be a whole number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number.is_integer():
        raise ValueError(f"case {case_id}: {name} must be a whole number, got {value!r}")
    return int(number)


def _precision(text: object) -> str | None:
    """``FP8`` when the row's precision says so; otherwise the model's own."""
    if text is None:
        return None
    return "fp8" if "FP8" in str(text).upper() else None


def read_cases(table: pd.DataFrame | str) -> list[ReferenceCase]:
    """The cases of *table* (a frame or a CSV path with ``train.csv``'s input columns).

    Every row is checked before any is simulated: a value that is not what its column
    holds, or a server that cannot be built (unknown model or GPU, a ``tp`` that does not
    split the heads, a model that does not fit), is a ``ValueError`` naming the case."""
    frame = pd.read_csv(table) if isinstance(table, str) else table
    missing = [name for name in INPUT_COLUMNS if name not in frame.columns and name not in ("dp",)]
    if missing:
        raise ValueError(f"the cases lack the input column(s) {', '.join(missing)}")
    cases = []
    for number, (_, row) in enumerate(frame.iterrows(), start=1):
        case_id = _cell(row, "case_id")
        if case_id is None or not str(case_id).strip():
            raise ValueError(f"row {number} of the cases: case_id is empty")
        rates = _numbers(row["all_stage_rates_rps"], "all_stage_rates_rps", case_id)
        durations = _numbers(row["all_stage_durations_s"], "all_stage_durations_s", case_id)
        if len(rates) != len(durations):
            raise ValueError(
                f"case {case_id}: {len(rates)} stage rates but {len(durations)} durations"
            )
        stage = _integer(row, "stage_index", case_id)
        if not -1 <= stage < len(rates):
            raise ValueError(f"case {case_id}: stage_index {stage} is not -1 or a stage's index")
        util = _cell(row, "gpu_mem_util")
        dp = _cell(row, "dp")
        cases.append(
            ReferenceCase(
                case_id=str(case_id),
                model=str(row["model"]),
                hardware=str(row["hardware"]),
                tp=_integer(row, "tp", case_id),
                dp=1 if dp is None else _integer(row, "dp", case_id),
                precision=_precision(_cell(row, "precision")),
                max_num_batched_tokens=_integer(row, "max_num_batched_tokens", case_id),
                max_num_seqs=_integer(row, "max_num_seqs", case_id),
                gpu_mem_util=0.9 if util is None else float(util),
                stage_index=stage,
                stage_rates_rps=rates,
                stage_durations_s=durations,
                system_prompt_len=_integer(row, "system_prompt_len", case_id),
                question_len=_integer(row, "question_len", case_id),
                output_len=_integer(row, "output_len", case_id),
                num_unique_system_prompts=_integer(row, "num_unique_system_prompts", case_id),
                num_users_per_system_prompt=_integer(row, "num_users_per_system_prompt", case_id),
            )
        )
        try:
            cases[-1].server()
        except DoesNotFitError:
            pass  # a prediction, not bad input: predict_cases says so for its rows
        except ValueError as error:
            raise ValueError(f"case {case_id}: {error}") from None
        try:
            case_workload(cases[-1])
        except ValueError as error:
            raise ValueError(f"case {case_id}: {error}") from None
    return cases


def case_workload(case: ReferenceCase) -> OpenLoopWorkload:
    """The experiment's workload as inference-perf made it: ``shared_prefix`` data (users
    who take turns, each repeating its question behind its group's system prompt, in
    16-token blocks) under the ``constant`` load's stages, whose gaps inference-perf draws
    at random and rescales to fill each stage (``gaps="exponential"``)."""
    stages = [
        Stage(rate, round(duration * 1e6))
        for rate, duration in zip(case.stage_rates_rps, case.stage_durations_s, strict=True)
    ]
    return OpenLoopWorkload(
        arrivals=StagedArrivals(stages, gaps="exponential"),
        prompt_tokens=Fixed(case.question_len),
        output_tokens=Fixed(case.output_len),
        shared_prefixes=SharedPrefixes(
            [case.system_prompt_len] * case.num_unique_system_prompts,
            _BLOCK_TOKENS,
            users_per_prefix=case.num_users_per_system_prompt,
        ),
    )


def case_requests(case: ReferenceCase, seed: int = SEED) -> tuple[RequestSpec, ...]:
    """The experiment's requests (:func:`case_workload`) from *seed*."""
    return case_workload(case).generate(seed).requests


def simulate_case(
    case: ReferenceCase, coefficients: PhysicsCoefficients | None = None
) -> pd.DataFrame:
    """The requests frame of *case*'s whole experiment (every stage), as a client sees it
    (``client_ttft_us``, ``client_e2e_us``), with ``dp`` replicas behind a least-outstanding
    router when ``dp > 1``."""
    config = case.server(coefficients)
    if case.dp == 1:
        server: Any = config.engine()
    else:
        server = Cluster([config.engine() for _ in range(case.dp)], "least_outstanding")
    for spec in case_requests(case):
        server.submit(spec)
    server.run()
    return client_latencies(server.requests_frame(), config.frontend)


def case_metrics(frame: pd.DataFrame, case: ReferenceCase) -> dict[str, Any]:
    """*case*'s predicted row from its experiment's *frame* (:func:`simulate_case`): the
    :data:`METRICS` of the requests that arrived during its stage (the client's latencies,
    as :func:`simsim.gpu.deployment.client_metrics` measures them) and ``overloaded``, the
    overload check of that window."""
    low, high = case.stage_window_us()
    arrived = frame["arrival_time_us"]
    rows = frame[(arrived >= low) & (arrived < high)]
    overload = overload_check(frame, start_us=low, end_us=high)
    figures = client_metrics(rows, np.zeros(0), overload, (90.0, 99.0))
    # The CSV's ITL, (e2e_mean - ttft_mean) / (mean output tokens - 1), never over 0.
    tokens = rows["generated_token_count"].to_numpy(float)
    itl = (figures["e2e_mean_ms"] - figures["ttft_mean_ms"]) / max(tokens.mean() - 1, 1)
    return {
        "case_id": case.case_id,
        **{metric: figures[metric] for metric in METRICS if metric != "itl_mean_ms"},
        "itl_mean_ms": itl,
        "overloaded": bool(overload.overloaded),
    }


def predict_cases(
    cases: Sequence[ReferenceCase],
    coefficients: PhysicsCoefficients | None = None,
    *,
    progress: Callable[[ReferenceCase], None] | None = None,
    skipped: Callable[[ReferenceCase, str], None] | None = None,
) -> pd.DataFrame:
    """One row of predicted metrics per case (:data:`METRICS`, ``overloaded``), in order.

    A case whose server cannot run (the model does not fit in its GPUs' memory, as
    :func:`~simsim.gpu.memory.memory_plan` sizes it, or a request needs more KV blocks
    than a replica holds) gets NaN metrics instead of stopping the others; *skipped*,
    if given, is called with each such case and the reason.
    """
    frames: dict[tuple[Any, ...], pd.DataFrame | str] = {}
    rows = []
    for case in cases:
        key = case.experiment
        if key not in frames:
            if progress is not None:
                progress(case)
            try:
                frames[key] = simulate_case(case, coefficients)
            except ValueError as error:  # does not fit; a request larger than the cache
                frames[key] = str(error)
        frame = frames[key]
        if isinstance(frame, str):
            if skipped is not None:
                skipped(case, frame)
            rows.append({"case_id": case.case_id, **dict.fromkeys(METRICS, math.nan)})
            rows[-1]["overloaded"] = False
            continue
        rows.append(case_metrics(frame, case))
    return pd.DataFrame(rows, columns=["case_id", *METRICS, "overloaded"])


def prediction_errors(predictions: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """Per case and metric, the signed percentage error of *predictions* against the
    measured columns of *measured* (rows matched by ``case_id``; metrics it lacks are left
    out), with ``quality_flag`` when present."""
    present = [m for m in METRICS if m in measured.columns]
    keep = ["case_id", *present] + (["quality_flag"] if "quality_flag" in measured else [])
    real = measured[keep].astype({"case_id": str})
    both = predictions.astype({"case_id": str}).merge(
        real, on="case_id", suffixes=("", "_measured")
    )
    out = both[["case_id", "overloaded"]].copy()
    for metric in present:
        out[f"{metric}_error_pct"] = 100 * (both[metric] / both[f"{metric}_measured"] - 1)
    if "quality_flag" in both:
        out["quality_flag"] = both["quality_flag"]
    return out


def error_summary(errors: pd.DataFrame, rows: Iterable[bool] | None = None) -> pd.DataFrame:
    """Median and mean absolute percentage error per metric over *errors*' rows (all, or
    those *rows* selects)."""
    chosen = errors if rows is None else errors[list(rows)]
    table = []
    for column in [c for c in chosen.columns if c.endswith("_error_pct")]:
        absolute = chosen[column].abs()
        table.append(
            {
                "metric": column.removesuffix("_error_pct"),
                "median_ape_pct": float(absolute.median()),
                "mean_ape_pct": float(absolute.mean()),
                "cases": int(absolute.count()),
            }
        )
    return pd.DataFrame(table, columns=["metric", "median_ape_pct", "mean_ape_pct", "cases"])


def case_scenario(case: ReferenceCase) -> dict[str, Any]:
    """*case*'s experiment as a scenario document (a TOML file's tables as a dict; write it
    with :func:`scenario_toml`): ``engine = "vllm"`` with the row's server settings, and
    the row's workload under ``data = "shared_prefix"`` and staged arrivals with
    inference-perf's random gaps, drawn from :data:`SEED`. Running it gives the requests
    :func:`simulate_case` simulates."""
    vllm: dict[str, Any] = {
        "model": case.model,
        "gpu": case.hardware,
        "tp": case.tp,
        "max_num_seqs": case.max_num_seqs,
        "max_num_batched_tokens": case.max_num_batched_tokens,
        "gpu_mem_util": case.gpu_mem_util,
    }
    if case.precision is not None:
        vllm["precision"] = case.precision
    stages = [
        {"rate_per_s": rate, "duration_s": duration}
        for rate, duration in zip(case.stage_rates_rps, case.stage_durations_s, strict=True)
    ]
    document: dict[str, Any] = {
        "scenario": {"name": f"case {case.case_id}", "engine": "vllm", "seed": SEED},
        "vllm": vllm,
        "workload": {
            "data": "shared_prefix",
            "num_unique_system_prompts": case.num_unique_system_prompts,
            "num_users_per_system_prompt": case.num_users_per_system_prompt,
            "system_prompt_len": case.system_prompt_len,
            "question_len": case.question_len,
            "output_len": case.output_len,
            "ignore_eos": True,
            "arrivals": {"process": "staged", "stages": stages, "gaps": "exponential"},
        },
    }
    if case.dp > 1:
        document["cluster"] = {"replicas": case.dp, "router": "least_outstanding"}
    return document


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def scenario_toml(document: dict[str, Any]) -> str:
    """A scenario document of :func:`case_scenario` as TOML text (one table per key)."""
    parts = []
    for table, keys in document.items():
        lines = [f"[{table}]"] + [f"{key} = {_toml_value(v)}" for key, v in keys.items()]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
