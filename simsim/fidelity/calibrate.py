"""``simsim calibrate``: probe a real server and fit a :class:`~simsim.FittedBackend` to it.

Three steps, each usable alone:

1. :func:`probe_plan` lists the probes: prompt lengths x output lengths x concurrency
   levels, each repeated; :func:`run_probes` sends them to an OpenAI-compatible server
   one probe at a time (a probe of concurrency *n* sends *n* equal requests at once) and
   returns a probes table, one row per request with every token's arrival time.
2. :func:`fit_backend` fits the cost model to a probes table: decode steps from the
   token gaps while every request of a probe is decoding, then the prefill from the
   time to first token, through the first-token mapping (:func:`prefill_target_us`).
3. :func:`backend_toml` writes the ``[backend]`` table a scenario file can use.

The probes table can be saved and fitted again later without the server
(``--probes-out`` and ``--from-probes``), which is how the test suite checks the
committed llama.cpp recordings.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np
import pandas as pd

from simsim.backend import FittedBackendConfig
from simsim.fidelity.fit import LinearFit, fit_nonnegative
from simsim.scenario.engine_kinds import ENGINE_KINDS
from simsim.wording import counted

if TYPE_CHECKING:
    from simsim.scenario import Scenario

__all__ = [
    "ENGINES",
    "PROBE_COLUMNS",
    "Calibration",
    "Probe",
    "backend_toml",
    "decode_observations",
    "fit_backend",
    "measured_decode_observations",
    "prefill_observations",
    "prefill_target_us",
    "probe_plan",
    "probe_row",
    "probes_frame",
    "run_probes",
    "workload_ranges",
]

Engine = Literal["single_slot", "batching"]
ENGINES: Final = tuple(
    name for name, kind in ENGINE_KINDS.items() if kind.prices_context and kind.takes_backend
)
"""The servers a calibration can be for: the built-in engine kinds that price each step
from its context (a fitted backend needs it) with a scenario's ``[backend]`` table,
``single_slot`` (one request at a time) and ``batching`` (continuous batching); not
``vllm``, which prices its steps with the physics model of its own GPUs."""

PROBE_COLUMNS: Final = (
    "probe",
    "prompt_tokens",
    "output_tokens",
    "concurrency",
    "repeat",
    "member",
    "sent_us",
    "token_times_us",
    "generated_tokens",
    "error",
)
"""The probes table: one row per request; times are microseconds from the probe's start.

``token_times_us`` is every token's arrival time, space-separated (one CSV cell)."""

GAP_WINDOW: Final = 8
"""Consecutive token gaps of one request summarised (by their median) as one observation."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe: *concurrency* requests of these sizes sent together."""

    probe: int
    prompt_tokens: int
    output_tokens: int
    concurrency: int
    repeat: int


def probe_plan(
    *,
    prompts: Sequence[int],
    outputs: Sequence[int],
    concurrency: Sequence[int] = (1,),
    repeats: int = 3,
) -> list[Probe]:
    """Every combination, repeated; repeats are interleaved (all probes once, then again),
    so a slow spell of the server spreads over the configurations instead of hitting one.
    """
    for name, values, least in (("prompts", prompts, 1), ("outputs", outputs, 2)):
        if not values or any(type(v) is not int or v < least for v in values):
            raise ValueError(f"{name} must be integers >= {least}, got {list(values)!r}")
    if not concurrency or any(type(v) is not int or v < 1 for v in concurrency):
        raise ValueError(f"concurrency must be integers >= 1, got {list(concurrency)!r}")
    if type(repeats) is not int or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    plan: list[Probe] = []
    for repeat in range(repeats):
        for level in sorted(set(concurrency)):
            for prompt in sorted(set(prompts)):
                for output in sorted(set(outputs)):
                    plan.append(Probe(len(plan), prompt, output, level, repeat))
    return plan


def workload_ranges(scenario: Scenario) -> tuple[list[int], list[int], int]:
    """Probe sizes that cover *scenario*'s requests: prompts, outputs and slots.

    Prompt lengths at the 0th, 25th, 50th, 75th and 100th percentiles of the requests'
    prompts (at least 1 token), the median output length (at least
    ``2 * GAP_WINDOW + 1`` tokens, so each request yields two decode observations), and
    the batching server's slots (1 for the single slot). Raises ``ValueError`` when the
    scenario lists no requests (a closed-loop workload makes its requests as it runs).
    """
    specs = scenario.all_requests()
    if not specs:
        raise ValueError(
            f"{scenario.source} lists no requests to take probe sizes from "
            "(a closed-loop workload makes them while it runs)"
        )
    prompts = np.array([spec.prompt_token_count for spec in specs])
    outputs = np.array([spec.max_output_tokens for spec in specs])
    quartiles = np.percentile(prompts, [0, 25, 50, 75, 100], method="nearest")
    sizes = sorted({max(1, int(value)) for value in quartiles})
    output = max(int(np.median(outputs)), 2 * GAP_WINDOW + 1)
    slots = 1 if scenario.batching is None else scenario.batching.max_active_requests
    return sizes, [output], slots


# ---------------------------------------------------------------------- probing


def run_probes(
    url: str,
    plan: Sequence[Probe],
    *,
    model: str | None = None,
    options: Any = None,
    pause_s: float = 0.05,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Send *plan* to the server at *url*, one probe at a time; the probes table.

    *options* is a :class:`~simsim.fidelity.replay.ReplayOptions` (prompt token ids,
    banned tokens, extra body fields), as for ``simsim replay``. Between probes the
    client waits *pause_s* so that the server is idle when the next one starts. A
    failed request is recorded with its ``error``, never raised.
    """
    return asyncio.run(
        _run_probes(url, plan, model=model, options=options, pause_s=pause_s, progress=progress)
    )


async def _run_probes(
    url: str,
    plan: Sequence[Probe],
    *,
    model: str | None,
    options: Any,
    pause_s: float,
    progress: Callable[[int, int], None] | None,
) -> pd.DataFrame:
    import simsim.fidelity.replay as replay  # needs httpx: imported on first use

    options = replay.ReplayOptions() if options is None else options
    seed = options.prompt_seed
    rng = np.random.default_rng(seed)
    endpoint = replay.completions_url(url)
    rows: list[dict[str, Any]] = []
    async with replay.replay_client(options.timeout_s) as client:
        name = model or await replay.first_model(client, url)
        for done, probe in enumerate(plan):
            bodies = [
                options.body(
                    name,
                    replay.prompt_token_ids(probe.prompt_tokens, rng, options.token_ids),
                    probe.output_tokens,
                )
                for _ in range(probe.concurrency)
            ]
            zero = time.perf_counter_ns()
            results = await asyncio.gather(
                *(replay.stream_completion(client, endpoint, body, zero_ns=zero) for body in bodies)
            )
            rows.extend(
                probe_row(
                    probe,
                    member,
                    sent_us=result.sent_us,
                    token_times_us=result.token_times_us,
                    generated_tokens=result.generated_token_count,
                    error=result.error or "",
                )
                for member, result in enumerate(results)
            )
            if progress is not None:
                progress(done + 1, len(plan))
            await asyncio.sleep(pause_s)
    return probes_frame(rows)


def probe_row(
    probe: Probe,
    member: int,
    *,
    sent_us: int,
    token_times_us: Sequence[int],
    generated_tokens: int,
    error: str = "",
) -> dict[str, Any]:
    """One row of the probes table: request *member* of *probe* and what it measured."""
    return {
        "probe": probe.probe,
        "prompt_tokens": probe.prompt_tokens,
        "output_tokens": probe.output_tokens,
        "concurrency": probe.concurrency,
        "repeat": probe.repeat,
        "member": member,
        "sent_us": sent_us,
        "token_times_us": " ".join(map(str, token_times_us)),
        "generated_tokens": generated_tokens,
        "error": error,
    }


def probes_frame(rows: Sequence[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """A probes table (:data:`PROBE_COLUMNS`) from rows or a frame read back from CSV.

    Raises ``ValueError`` naming the missing columns.
    """
    frame = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    missing = [name for name in PROBE_COLUMNS if name not in frame.columns]
    if missing:
        raise ValueError(
            f"a probes table needs the columns {list(PROBE_COLUMNS)}; missing {missing}"
        )
    frame = frame[list(PROBE_COLUMNS)]
    for name in ("probe", "prompt_tokens", "output_tokens", "concurrency", "repeat", "member"):
        frame[name] = frame[name].astype("int64")
    frame["sent_us"] = frame["sent_us"].astype("int64")
    frame["generated_tokens"] = frame["generated_tokens"].astype("int64")
    frame["token_times_us"] = frame["token_times_us"].fillna("").astype(str)
    frame["error"] = frame["error"].fillna("").astype(str)
    return frame.reset_index(drop=True)


def _times(cell: str) -> list[int]:
    return [int(value) for value in cell.split()]


# ---------------------------------------------------------------------- the mapping


def prefill_target_us(measured_ttft_us: float, first_decode_step_us: float) -> float:
    """The first-token mapping: what simsim's prefill must cost for a measured TTFT.

    A real server (vLLM, llama.cpp, SGLang) samples the first output token from the
    prefill itself, so its time to first token is the prefill; simsim's first token
    comes from the first decode step after the prefill. For simsim to reproduce a
    measured TTFT, its prefill must cost the measured TTFT minus one decode step over
    the prompt. This is the only place the two lifecycles are reconciled: replay and
    compare put measured and simulated TTFT (arrival to first token) side by side as
    they are, and a request of N output tokens takes one prefill plus N decode steps in
    simsim against one prefill plus N - 1 on the real server, the prefill shorter by
    exactly the step it lacks.
    """
    return measured_ttft_us - first_decode_step_us


# ---------------------------------------------------------------------- fitting


def decode_observations(probes: pd.DataFrame, window: int = GAP_WINDOW) -> pd.DataFrame:
    """Decode-step observations: the token gaps while every request of a probe decodes.

    For each probe without errors, the steady window runs from the last request's first
    token to the first request's last token; in it each request's gaps are decode steps
    of ``concurrency`` sequences. Each run of *window* consecutive gaps of one request
    becomes one observation: the gaps' median, with the summed context of the batch
    (``concurrency`` times the request's mean context, the requests being equal).
    Columns: ``probe, concurrency, context_sum, gap_us``.
    """
    records: list[dict[str, Any]] = []
    for _, group in probes_frame(probes).groupby("probe", sort=True):
        if (group["error"] != "").any():
            continue
        members = [_times(cell) for cell in group["token_times_us"]]
        if any(len(times) < 2 for times in members):
            continue
        start = max(times[0] for times in members)
        end = min(times[-1] for times in members)
        prompt = int(group["prompt_tokens"].iloc[0])
        level = int(group["concurrency"].iloc[0])
        for times in members:
            # Gap k (1-based) ends token k + 1, decoded over prompt + k tokens.
            steady = [
                (times[k] - times[k - 1], prompt + k)
                for k in range(1, len(times))
                if times[k - 1] >= start and times[k] <= end
            ]
            for first in range(0, len(steady) - window + 1, window):
                chunk = steady[first : first + window]
                records.append(
                    {
                        "probe": int(group["probe"].iloc[0]),
                        "concurrency": level,
                        "context_sum": level * float(np.mean([c for _, c in chunk])),
                        "gap_us": float(np.median([g for g, _ in chunk])),
                    }
                )
    return pd.DataFrame(records, columns=["probe", "concurrency", "context_sum", "gap_us"])


CONTEXT_BIN: Final = 256
"""Width in tokens of the summed-context bins that group a measured run's decode gaps."""


def measured_decode_observations(
    requests: pd.DataFrame, tokens: pd.DataFrame, *, context_bin: int = CONTEXT_BIN
) -> pd.DataFrame:
    """Decode-step observations from a measured run (``simsim replay``'s two tables).

    A gap between two tokens of one request is a pure decode step when no request of the
    run is between its send and its first token during it (nobody is queued or
    prefilling); the batch is then every request between its first and its last token,
    and its summed context is their prompts plus the tokens each had received when the
    gap began. Such gaps are grouped by batch size and by summed context in bins of
    *context_bin* tokens; each group becomes one observation (the median gap, the mean
    context), so a stray slow step does not pull the fit. Same columns as
    :func:`decode_observations` (``probe`` is -1). This is the server decoding the
    workload's own mix, with the cache states the workload leaves behind, which equal
    probes from an idle server need not reproduce.
    """
    ends = requests.set_index("request_id")
    times = {
        int(group["request_id"].iloc[0]): group.sort_values("token_index")["time_us"].to_numpy(
            dtype=np.int64
        )
        for _, group in tokens.groupby("request_id")
    }
    ids = np.array(sorted(times), dtype=np.int64)
    sent = ends.loc[ids, "arrival_time_us"].to_numpy(dtype=np.int64)
    prompts = ends.loc[ids, "prompt_token_count"].to_numpy(dtype=np.int64)
    first = np.array([times[rid][0] for rid in ids], dtype=np.int64)
    last = np.array([times[rid][-1] for rid in ids], dtype=np.int64)
    # Everyone that ever waited for a first token, also requests that never got one.
    waiting = ends[~ends.index.isin(ids) & ends["arrival_time_us"].notna()]
    other_sent = waiting["arrival_time_us"].to_numpy(dtype=np.int64)
    other_end = waiting["finish_time_us"].fillna(np.iinfo(np.int64).max).to_numpy(np.int64)
    rows: list[tuple[int, float, float]] = []
    for rid in ids:
        own = times[int(rid)]
        for k in range(1, len(own)):
            start, end = int(own[k - 1]), int(own[k])
            if ((sent < end) & (first > start)).any() or (
                (other_sent < end) & (other_end > start)
            ).any():
                continue  # someone queued or prefilled during the gap
            decoding = (first <= start) & (last >= end)
            context = sum(
                int(prompts[j]) + int(np.searchsorted(times[int(ids[j])], start, side="right"))
                for j in np.flatnonzero(decoding)
            )
            rows.append((int(decoding.sum()), float(context), float(end - start)))
    gaps = pd.DataFrame(rows, columns=["concurrency", "context_sum", "gap_us"])
    if gaps.empty:
        return pd.DataFrame(columns=["probe", "concurrency", "context_sum", "gap_us"])
    gaps["bin"] = (gaps["context_sum"] // context_bin).astype(int)
    grouped = gaps.groupby(["concurrency", "bin"], sort=True).agg(
        context_sum=("context_sum", "mean"), gap_us=("gap_us", "median")
    )
    observations = grouped.reset_index()[["concurrency", "context_sum", "gap_us"]]
    observations.insert(0, "probe", -1)
    return observations


def prefill_observations(probes: pd.DataFrame) -> pd.DataFrame:
    """Time-to-first-token observations, one per probe without errors.

    ``ttft_us`` is the last request's first token minus the first send (the requests of
    a probe go out together and, on a batching server, prefill together). Columns:
    ``probe, prompt_tokens, output_tokens, concurrency, ttft_us``.
    """
    records: list[dict[str, Any]] = []
    for _, group in probes_frame(probes).groupby("probe", sort=True):
        if (group["error"] != "").any():
            continue
        members = [_times(cell) for cell in group["token_times_us"]]
        if any(not times for times in members):
            continue
        records.append(
            {
                "probe": int(group["probe"].iloc[0]),
                "prompt_tokens": int(group["prompt_tokens"].iloc[0]),
                "output_tokens": int(group["output_tokens"].iloc[0]),
                "concurrency": int(group["concurrency"].iloc[0]),
                "ttft_us": float(max(t[0] for t in members) - int(group["sent_us"].min())),
            }
        )
    columns = ["probe", "prompt_tokens", "output_tokens", "concurrency", "ttft_us"]
    return pd.DataFrame(records, columns=columns)


@dataclass(frozen=True)
class Calibration:
    """A fitted cost model and the evidence for it."""

    engine: str
    config: FittedBackendConfig
    decode_fit: LinearFit
    prefill_fit: LinearFit
    probe_summary: pd.DataFrame
    """One row per probe configuration: measured medians and spreads over the repeats,
    what the fitted model predicts, and the relative residual."""

    def report(self) -> str:
        """The probes, the coefficients and the fit quality as text."""
        lines = [
            f"probes ({self.engine}): measured median over repeats, spread = (max - min) / "
            "median, predicted by the fitted model",
            _summary_table(self.probe_summary),
            "",
            f"decode fit:  R^2 = {self.decode_fit.r_squared:.4f}, largest residual "
            f"{_largest_residual(self.decode_fit)} of the observation, over "
            f"{counted(len(self.decode_fit.observed), 'observation')}",
            f"prefill fit: R^2 = {self.prefill_fit.r_squared:.4f}, largest residual "
            f"{_largest_residual(self.prefill_fit)} of the observation, over "
            f"{counted(len(self.prefill_fit.observed), 'probe')}",
            "(R^2 is near 0 when the observations hardly vary: then read the residuals)",
            "",
            "[backend] kind = fitted",
        ]
        lines += [f"  {name} = {value:.6g}" for name, value in self.config.as_dict().items()]
        return "\n".join(lines)


def fit_backend(
    probes: pd.DataFrame,
    engine: Engine = "single_slot",
    *,
    decode: pd.DataFrame | None = None,
) -> Calibration:
    """Fit a :class:`~simsim.FittedBackendConfig` to a probes table (6 significant digits).

    Decode first: ``gap = decode_base + decode_per_sequence * concurrency +
    decode_per_context_token * context_sum`` (the per-sequence term only for the
    batching server: with one request at a time it cannot be told from the base).
    Then the prefill, on :func:`prefill_target_us` of each probe's TTFT with the fitted
    decode step of its batch: ``prefill_base + prefill_per_token * n * prompt +
    prefill_per_token_squared * n * prompt**2 (+ prefill_per_sequence * n)`` for *n*
    requests of one prompt length prefilled together. Every coefficient is >= 0.
    *decode*, when given, replaces the probes' decode observations (for example
    :func:`measured_decode_observations` of a replayed workload: decode calibrated at
    the workload's own batches and contexts). Raises ``ValueError`` when there is too
    little to fit.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    batching = engine == "batching"
    probes = probes_frame(probes)
    if not batching and (probes["concurrency"] > 1).any():
        raise ValueError(
            f"the probes send up to {int(probes['concurrency'].max())} requests at once, "
            "which describes a batching server: fit them with engine 'batching'"
        )
    failed = int((probes["error"] != "").sum())
    why = (
        f"{failed} of {counted(len(probes), 'probe request')} failed (see their error column)"
        if failed
        else "the probes lack error-free requests of more than "
        f"{GAP_WINDOW} tokens (raise the output lengths)"
    )
    probe_decode = decode_observations(probes)  # also what the summary shows
    if decode is None:
        decode = probe_decode
    elif failed == len(probes) > 1:
        why = f"every one of the {counted(failed, 'probe request')} failed (see their error column)"
    elif failed == len(probes) == 1:
        why = "the one probe request failed (see its error column)"
    if len(decode) < 2:
        raise ValueError(f"{counted(len(decode), 'decode observation')}: {why}")
    decode_columns: dict[str, Any] = {"decode_base_us": np.ones(len(decode))}
    if batching:
        decode_columns["decode_per_sequence_us"] = decode["concurrency"].to_numpy(float)
    decode_columns["decode_per_context_token_us"] = decode["context_sum"].to_numpy(float)
    decode_fit = fit_nonnegative(decode_columns, decode["gap_us"].to_numpy(float))

    prefill = prefill_observations(probes)
    lengths = prefill["prompt_tokens"].nunique()
    if lengths < 2:
        hint = why if prefill.empty else "probe more prompt lengths"
        raise ValueError(
            f"{counted(len(prefill), 'probe')} with a first token, at "
            f"{counted(lengths, 'prompt length')}: at least two prompt lengths are needed to "
            f"see how the prefill grows with the prompt ({hint})"
        )
    n = prefill["concurrency"].to_numpy(float)
    p = prefill["prompt_tokens"].to_numpy(float)
    first_steps = [
        decode_fit.predict(
            {
                "decode_base_us": 1.0,
                "decode_per_sequence_us": k,
                "decode_per_context_token_us": k * q,
            }
        )
        for k, q in zip(n, p, strict=True)
    ]
    targets = [
        prefill_target_us(ttft, step)
        for ttft, step in zip(prefill["ttft_us"], first_steps, strict=True)
    ]
    prefill_columns: dict[str, Any] = {
        "prefill_base_us": np.ones(len(prefill)),
        "prefill_per_token_us": n * p,
        "prefill_per_token_squared_us": n * p * p,
    }
    if batching:
        prefill_columns["prefill_per_sequence_us"] = n
    prefill_fit = fit_nonnegative(prefill_columns, targets)

    values = {name: 0.0 for name in FittedBackendConfig.__dataclass_fields__}
    for fit in (decode_fit, prefill_fit):
        values.update(zip(fit.names, fit.coefficients, strict=True))
    config = FittedBackendConfig(**{name: _significant(value) for name, value in values.items()})
    summary = _probe_summary(prefill, probe_decode, config)
    return Calibration(engine, config, decode_fit, prefill_fit, summary)


def _probe_summary(
    prefill: pd.DataFrame, decode: pd.DataFrame, config: FittedBackendConfig
) -> pd.DataFrame:
    """Per configuration: measured TTFT and gap (median, spread), predicted, residual."""
    from simsim.backend import FittedBackend

    backend = FittedBackend(config)
    keys = ["prompt_tokens", "output_tokens", "concurrency"]
    gaps = decode.merge(prefill[["probe", "prompt_tokens", "output_tokens"]], on="probe")
    rows = []
    for _, group in prefill.groupby(keys, sort=True):
        prompt, output, level = (int(group[name].iloc[0]) for name in keys)
        ttft = group["ttft_us"].to_numpy(float)
        own_gaps = gaps[
            (gaps["prompt_tokens"] == prompt)
            & (gaps["output_tokens"] == output)
            & (gaps["concurrency"] == level)
        ]["gap_us"].to_numpy(float)
        first = backend.step_us([], [prompt] * level)
        predicted_ttft = backend.step_us([(prompt, 0)] * level, []) + first
        middle = prompt + output // 2
        predicted_gap = backend.step_us([], [middle] * level)
        measured_gap = float(np.median(own_gaps)) if len(own_gaps) else math.nan
        rows.append(
            {
                "prompt_tokens": prompt,
                "output_tokens": output,
                "concurrency": level,
                "repeats": len(group),
                "ttft_ms": float(np.median(ttft)) / 1000,
                "ttft_spread": _spread(ttft),
                "ttft_predicted_ms": predicted_ttft / 1000,
                "ttft_residual": (float(np.median(ttft)) - predicted_ttft) / predicted_ttft
                if predicted_ttft
                else math.nan,
                "gap_ms": measured_gap / 1000,
                "gap_spread": _spread(own_gaps),
                "gap_predicted_ms": predicted_gap / 1000,
                "gap_residual": (measured_gap - predicted_gap) / predicted_gap
                if predicted_gap
                else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _largest_residual(fit: LinearFit) -> str:
    """The largest |observed - predicted| / observed, as a percentage."""
    shares = [
        abs(residual) / abs(observed)
        for residual, observed in zip(fit.residuals, fit.observed, strict=True)
        if observed
    ]
    return f"{100 * max(shares):.1f}%" if shares else "-"


def _spread(values: np.ndarray) -> float:
    if len(values) == 0:
        return math.nan
    middle = float(np.median(values))
    return float(values.max() - values.min()) / middle if middle else math.nan


def _summary_table(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "(no probes)"
    shown = summary.copy()
    for name in ("ttft_spread", "ttft_residual", "gap_spread", "gap_residual"):
        shown[name] = shown[name].map(lambda x: "-" if math.isnan(x) else f"{100 * x:+.1f}%")
    for name in ("ttft_ms", "ttft_predicted_ms", "gap_ms", "gap_predicted_ms"):
        shown[name] = shown[name].map(lambda x: "-" if math.isnan(x) else f"{x:.3f}")
    return shown.to_string(index=False)


# ---------------------------------------------------------------------- output


def backend_toml(
    calibration: Calibration, *, url: str | None = None, model: str | None = None
) -> str:
    """The ``[backend]`` table of *calibration*, with comments saying where it came from."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    source = f" against {url}" if url else ""
    named = f" (model {model})" if model else ""
    lines = [
        f"# Fitted by simsim calibrate{source}{named} on {when}, for engine "
        f'"{calibration.engine}".',
        f"# decode fit R^2 = {calibration.decode_fit.r_squared:.4f}, "
        f"prefill fit R^2 = {calibration.prefill_fit.r_squared:.4f}. A fitted model describes",
        "# this server on the probed sizes; check it on your workload with simsim compare.",
        "[backend]",
        'kind = "fitted"',
    ]
    lines += [f"{name} = {value!r}" for name, value in calibration.config.as_dict().items()]
    return "\n".join(lines) + "\n"


def _significant(value: float) -> float:
    """*value* to 6 significant digits: plenty for a fit, and readable in a file."""
    return float(f"{value:.6g}")
