"""How close two runs are: per-request errors and percentile errors of TTFT, TPOT and E2E.

:func:`compare_runs` takes two runs, A (the reference: a measurement, usually) and B (a
simulation of the same workload, usually), each a results folder (``simsim run --out``
or ``simsim replay --out``), a :class:`~simsim.run_folder.RunFolder` or a requests
DataFrame (:data:`simsim.results.REQUEST_COLUMNS`), and returns a :class:`Comparison`.
Nothing in it assumes which side is measured: given two measurements of the same
workload it reports the server's run-to-run noise in the same terms.

Two kinds of error, over the three latencies of the requests table (``ttft_us``,
``tpot_us``, ``e2e_latency_us``; microseconds):

- **Per request.** Requests are matched by ``request_id``. A metric counts for a request
  when both sides have it: TTFT when both produced a first token, TPOT and E2E when both
  ``FINISHED`` (TPOT also needs 2+ tokens on both sides). Its absolute percentage error
  is ``|B - A| / A``; a request whose A value is 0 has none (it is excluded and counted
  as ``excluded_zero_reference``). The median and p90 of these errors are reported with
  the number of requests used and of each kind left out.
- **Per distribution.** Each side's percentiles (p50, p90, p99 unless told otherwise)
  of each metric, over that side's own requests with the metric (matched or not, as
  :func:`simsim.summarize` computes them), and the signed relative error
  ``(B - A) / A`` (``NaN`` when A's percentile is 0 or either side has no value).

Percentiles use linear interpolation, as :func:`simsim.summarize` does, so a side's
percentiles here equal its summary's. Errors are fractions (``0.1`` is 10%).

:meth:`Comparison.write` writes the comparison's tables, a JSON summary and (with
matplotlib, the ``plot`` extra) two figures; ``simsim compare A B --out DIR`` calls it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd

from simsim.results import REQUEST_COLUMNS, _check_percentiles, percentile_label
from simsim.run_folder import RunFolder, read_run_folder
from simsim.wording import counted

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "METRICS",
    "OUTPUT_FILES",
    "Comparison",
    "RunInput",
    "compare_runs",
    "draw_comparison_cdfs",
    "draw_comparison_scatter",
]

RunInput = str | os.PathLike[str] | RunFolder | pd.DataFrame
"""What :func:`compare_runs` accepts for a side: a results folder's path, the folder
read with :func:`simsim.run_folder.read_run_folder`, or a requests DataFrame."""

METRICS: Final[Mapping[str, str]] = {
    "ttft_us": "TTFT",
    "tpot_us": "TPOT",
    "e2e_latency_us": "E2E",
}
"""The compared columns of the requests table and their short names."""

# A metric counts for a request only if the request is in this state on a side (None:
# any state with the value, i.e. a first token was produced).
_NEEDS_STATE: Final[Mapping[str, str | None]] = {
    "ttft_us": None,
    "tpot_us": "FINISHED",
    "e2e_latency_us": "FINISHED",
}

OUTPUT_FILES: Final[Mapping[str, str]] = {
    "per_request": "compare_per_request.csv",
    "errors": "compare_errors.csv",
    "percentiles": "compare_percentiles.csv",
    "summary": "compare.json",
    "cdf": "compare_cdf.png",
    "scatter": "compare_scatter.png",
}
"""The files :meth:`Comparison.write` writes into its folder (figures only with matplotlib)."""

_APE_QUANTILES: Final = (("median", 0.5), ("p90", 0.9))


def _stem(metric: str) -> str:
    """``ttft_us`` -> ``ttft``: the per-request error columns are fractions, not times."""
    return metric.removesuffix("_us")


@dataclass(frozen=True)
class Comparison:
    """Two runs compared: A (the reference) and B, request by request and by percentile.

    - ``labels``: the two sides' names (folder names, ``"A"``/``"B"`` for DataFrames, or
      what the caller gave).
    - ``request_counts``: requests in A, in B, in both (``matched``), only in A, only in B,
      and ``different_sizes``: matched requests whose prompt or output length differs
      (not 0 means the runs are not of one workload; the table warns).
    - ``per_request``: one row per request id in either run, in id order: ``request_id``,
      ``a_state``, ``b_state`` (``NaN`` on the side that lacks the request), then per
      metric ``a_<metric>``, ``b_<metric>`` (the values, ``<NA>`` where a side has none)
      and ``<stem>_ape``, the absolute percentage error ``|B - A| / A`` (``<NA>`` where
      the request is excluded), e.g. ``a_ttft_us``, ``b_ttft_us``, ``ttft_ape``.
    - ``errors``: one row per metric (index ``metric``): ``label``, ``used`` (requests
      whose error counts), ``excluded_unmatched`` (in one run only),
      ``excluded_missing`` (matched, but a side lacks the value: no first token, not
      finished, or one token only for TPOT), ``excluded_zero_reference`` (A's value is
      0), and ``median_ape``, ``p90_ape`` (``NaN`` when ``used`` is 0). ``used`` plus the
      three exclusions is the number of distinct request ids in the two runs.
    - ``percentiles``: one row per (metric, percentile): ``metric``, ``label``,
      ``percentile`` (``"p50"``...), ``a_count``, ``b_count`` (each side's requests with
      the metric), ``a_us``, ``b_us`` (the percentiles, microseconds) and
      ``signed_error`` = ``(b_us - a_us) / a_us``.
    """

    labels: tuple[str, str]
    request_counts: Mapping[str, int]
    per_request: pd.DataFrame
    errors: pd.DataFrame
    percentiles: pd.DataFrame

    def __str__(self) -> str:
        return self.table()

    def table(self) -> str:
        """The comparison as a text table for a terminal; times in milliseconds."""
        a, b = self.labels
        counts = self.request_counts
        lines = [
            f"A (reference): {a}, {counted(counts['a'], 'request')}",
            f"B:             {b}, {counted(counts['b'], 'request')}",
            f"matched by request_id: {counts['matched']} "
            f"({counts['only_a']} only in A, {counts['only_b']} only in B)",
        ]
        if counts.get("different_sizes"):
            lines.append(
                f"WARNING: {counted(counts['different_sizes'], 'matched request')} "
                f"{'differs' if counts['different_sizes'] == 1 else 'differ'} in prompt or "
                "output length: these runs are not of the same workload"
            )
        lines += [
            "",
            "per-request error |B - A| / A",
            f"{'':8}{'median':>9}{'p90':>9}{'used':>8}   excluded",
        ]
        for row in self.errors.to_dict("records"):
            left_out = [
                f"{int(row[column])} {why}"
                for column, why in (
                    ("excluded_missing", "missing on a side"),
                    ("excluded_zero_reference", "A = 0"),
                    ("excluded_unmatched", "unmatched"),
                )
                if row[column]
            ]
            lines.append(
                f"{row['label']:<8}{_percent(row['median_ape']):>9}{_percent(row['p90_ape']):>9}"
                f"{int(row['used']):>8}   {', '.join(left_out) or 'none'}"
                + ("" if row["used"] else f"  (no request has a {row['label']} in both)")
            )
        lines += [
            "",
            "distributions (each side over its own requests; ms)",
            f"{'':12}{'A':>12}{'B':>12}{'(B - A) / A':>14}",
        ]
        for row in self.percentiles.to_dict("records"):
            lines.append(
                f"{row['label'] + ' ' + row['percentile']:<12}"
                f"{_ms(row['a_us']):>12}{_ms(row['b_us']):>12}"
                f"{_percent(row['signed_error'], signed=True):>14}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary: labels, request counts, per-request and percentile errors.

        Times in microseconds, errors as fractions; a missing number is ``None``.
        """
        per_request: dict[str, Any] = {}
        for metric, row in self.errors.to_dict("index").items():
            per_request[str(metric)] = {
                key: _json_number(row[key]) for key in self.errors.columns if key != "label"
            }
        distributions: dict[str, Any] = {metric: {} for metric in METRICS}
        for row in self.percentiles.to_dict("records"):
            distributions[row["metric"]][row["percentile"]] = {
                key: _json_number(row[key])
                for key in ("a_count", "b_count", "a_us", "b_us", "signed_error")
            }
        return {
            "labels": {"a": self.labels[0], "b": self.labels[1]},
            "requests": {key: int(value) for key, value in self.request_counts.items()},
            "per_request_error": per_request,
            "percentiles": distributions,
        }

    def write(self, folder: str | os.PathLike[str], *, figures: bool = True) -> list[Path]:
        """Write the tables (CSV), the JSON summary and, with *figures*, two PNG figures.

        The files are :data:`OUTPUT_FILES`; *folder* is created if needed. Figures need
        matplotlib (``pip install 'simsim[plot]'``): without it, ``ImportError`` before
        anything is written. Returns the paths written.
        """
        draw: list[tuple[str, Callable[[], Figure]]] = []
        if figures:
            # Imported first, so a missing matplotlib stops the write before any file.
            try:
                from simsim import plots
            except ImportError as error:
                if (error.name or "").split(".")[0] != "matplotlib":
                    raise
                raise ImportError(
                    "the comparison's figures need matplotlib, which is not installed: "
                    "pip install 'simsim[plot]' (or write(..., figures=False))",
                    name=error.name,
                ) from error

            draw = [
                (OUTPUT_FILES["cdf"], lambda: draw_comparison_cdfs(self)),
                (OUTPUT_FILES["scatter"], lambda: draw_comparison_scatter(self)),
            ]
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for name in ("per_request", "errors", "percentiles"):
            path = target / OUTPUT_FILES[name]
            frame: pd.DataFrame = getattr(self, name)
            frame.to_csv(path, index=name == "errors")
            written.append(path)
        path = target / OUTPUT_FILES["summary"]
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        written.append(path)
        if draw:
            written += plots._save_figures(draw, target)
        return written


_SIZES = ("prompt_token_count", "max_output_tokens")


def compare_runs(
    measured: RunInput,
    simulated: RunInput,
    *,
    percentiles: Sequence[float] = (50, 90, 99),
    labels: tuple[str, str] | None = None,
) -> Comparison:
    """Compare run B (*simulated*) with run A (*measured*, the reference); see the module.

    Either argument may be any run: two simulations, or two measurements of one workload
    (then the errors are the run-to-run noise, A being the first run). Each is a results
    folder's path, a :class:`~simsim.run_folder.RunFolder` or a requests DataFrame.
    *percentiles* (numbers strictly between 0 and 100) chooses the distribution rows;
    *labels* names the two sides (default: the folders' names, or ``"A"`` and ``"B"``).

    Raises ``ValueError`` naming the side and the rule for a requests table that lacks
    columns, is empty, repeats a request id, has a negative latency, or shares no request
    id with the other side; ``FileNotFoundError`` for a folder that is not a run's.
    """
    for letter, run in (("A", measured), ("B", simulated)):
        if not isinstance(run, pd.DataFrame | RunFolder | str | os.PathLike):
            raise TypeError(
                f"{letter}: expected a results folder, a RunFolder or a requests DataFrame, "
                f"got {type(run).__name__}"
            )
    checked = _check_percentiles(percentiles)
    names = _labels(measured, simulated, labels)
    sides = tuple(
        letter if name == letter else f"{letter} ({name})"
        for letter, name in zip("AB", names, strict=True)
    )
    a = _requests(measured, sides[0])
    b = _requests(simulated, sides[1])
    a_ids, b_ids = set(a["request_id"].tolist()), set(b["request_id"].tolist())
    matched_ids = a_ids & b_ids
    if not matched_ids:
        raise ValueError(
            f"{sides[0]} and {sides[1]} share no request_id, so no request can be "
            f"compared (A's ids {_id_range(a_ids)}, B's {_id_range(b_ids)}); compare runs "
            "of the same workload"
        )
    both = a[["request_id", *_SIZES]].merge(b[["request_id", *_SIZES]], on="request_id")
    differ = pd.Series(False, index=both.index)
    for column in _SIZES:
        differ |= both[f"{column}_x"] != both[f"{column}_y"]
    counts = {
        "a": len(a),
        "b": len(b),
        "matched": len(matched_ids),
        "only_a": len(a_ids - b_ids),
        "only_b": len(b_ids - a_ids),
        "different_sizes": int(differ.sum()),
    }
    per_request = _per_request(a, b)
    errors = pd.DataFrame(
        [_error_row(per_request, metric) for metric in METRICS],
        index=pd.Index(list(METRICS), name="metric"),
    )
    return Comparison(
        labels=names,
        request_counts=counts,
        per_request=per_request,
        errors=errors,
        percentiles=_percentile_rows(per_request, checked),
    )


# ---------------------------------------------------------------------- inputs


def _labels(a: RunInput, b: RunInput, given: tuple[str, str] | None) -> tuple[str, str]:
    if given is not None:
        if (
            not isinstance(given, tuple | list)
            or len(given) != 2
            or not all(isinstance(name, str) and name.strip() for name in given)
        ):
            raise ValueError(f"labels must be two non-empty strings, got {given!r}")
        if given[0] == given[1]:
            raise ValueError(f"labels must differ (both are {given[0]!r})")
        return (given[0], given[1])
    names = (_default_label(a, "A"), _default_label(b, "B"))
    if names[0] == names[1]:  # two folders of the same name: say which is which
        return (f"{names[0]} (A)", f"{names[1]} (B)")
    return names


def _default_label(run: RunInput, fallback: str) -> str:
    if isinstance(run, pd.DataFrame):
        return fallback
    path = run.folder if isinstance(run, RunFolder) else Path(run)
    return path.resolve().name or str(path)


def _requests(run: RunInput, side: str) -> pd.DataFrame:
    """The side's requests table, checked: the columns, not empty, unique ids, no negatives."""
    if isinstance(run, pd.DataFrame):
        frame, where = run, f"{side}: the requests DataFrame"
    else:
        try:
            folder = run if isinstance(run, RunFolder) else read_run_folder(run)
            frame = folder.table("requests")
        except (FileNotFoundError, ValueError) as error:
            # The message names the folder; say which side it is, keep the type.
            raise type(error)(f"{side}: {error}") from None
        where = f"{side}: {folder.path('requests')}"
    missing = [column for column in REQUEST_COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(
            f"{where} lacks the columns {missing}; a requests table has "
            "simsim.results.REQUEST_COLUMNS (write one with 'simsim run --out DIR')"
        )
    if frame.empty:
        raise ValueError(f"{where} holds no requests; there is nothing to compare")
    ids = frame["request_id"]
    if ids.isna().any():
        raise ValueError(f"{where} has a request without a request_id")
    repeated = ids[ids.duplicated()]
    if len(repeated):
        raise ValueError(
            f"{where} repeats request_id {int(repeated.iloc[0])}; "
            "requests are matched by id, so each id must appear once"
        )
    columns = {"request_id": ids.astype("int64"), "state": frame["state"].astype(str)}
    for size in _SIZES:
        columns[size] = frame[size].astype("int64")
    for metric in METRICS:
        try:
            values = frame[metric].astype("Float64")
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: column {metric} is not numeric ({error})") from None
        negative = values < 0
        if negative.any():
            row = int(np.flatnonzero(negative.fillna(False).to_numpy(dtype=bool))[0])
            raise ValueError(
                f"{where}: request {int(ids.iloc[row])} has {metric} = {values.iloc[row]}; "
                "a latency is never negative"
            )
        columns[metric] = values
    table = pd.DataFrame(columns).sort_values("request_id", kind="stable")
    return table.reset_index(drop=True)


def _id_range(ids: set[int]) -> str:
    return f"{min(ids)}..{max(ids)}" if len(ids) > 1 else str(next(iter(ids)))


# ---------------------------------------------------------------------- errors


def _eligible(frame: pd.DataFrame, metric: str, side: str) -> pd.Series[bool]:
    """Whether each row's *side* (``"a"`` or ``"b"``) has *metric* and the state it needs."""
    present = frame[f"{side}_{metric}"].notna()
    state = _NEEDS_STATE[metric]
    if state is not None:
        present &= (frame[f"{side}_state"] == state).fillna(False)
    return present.astype(bool)


def _side_values(per_request: pd.DataFrame, side: str, metric: str) -> npt.NDArray[np.float64]:
    """*side*'s values of *metric* over its own eligible requests, matched or not."""
    keep = _eligible(per_request, metric, side).to_numpy(dtype=bool)
    return per_request.loc[keep, f"{side}_{metric}"].to_numpy(dtype=np.float64)


def _per_request(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    both = a.add_prefix("a_").merge(
        b.add_prefix("b_"), left_on="a_request_id", right_on="b_request_id", how="outer"
    )
    out = pd.DataFrame(
        {
            "request_id": both["a_request_id"].fillna(both["b_request_id"]).astype("int64"),
            "a_state": both["a_state"],
            "b_state": both["b_state"],
        }
    )
    for metric in METRICS:
        a_values = both[f"a_{metric}"].astype("Float64")
        b_values = both[f"b_{metric}"].astype("Float64")
        usable = _eligible(both, metric, "a") & _eligible(both, metric, "b") & (a_values > 0)
        out[f"a_{metric}"] = a_values
        out[f"b_{metric}"] = b_values
        # Where the request does not count, <NA> (the Float64 column's missing value).
        out[f"{_stem(metric)}_ape"] = ((b_values - a_values).abs() / a_values).where(
            usable.fillna(False)
        )
    return out.sort_values("request_id").reset_index(drop=True)


def _error_row(per_request: pd.DataFrame, metric: str) -> dict[str, Any]:
    in_a, in_b = per_request["a_state"].notna(), per_request["b_state"].notna()
    both = _eligible(per_request, metric, "a") & _eligible(per_request, metric, "b")
    ape = per_request[f"{_stem(metric)}_ape"].dropna().to_numpy(dtype=np.float64)
    row: dict[str, Any] = {
        "label": METRICS[metric],
        "used": len(ape),
        "excluded_unmatched": int((~(in_a & in_b)).sum()),
        "excluded_missing": int((in_a & in_b & ~both).sum()),
        "excluded_zero_reference": int(both.sum()) - len(ape),
    }
    for name, q in _APE_QUANTILES:
        row[f"{name}_ape"] = float(np.quantile(ape, q)) if len(ape) else math.nan
    return row


def _percentile_rows(per_request: pd.DataFrame, percentiles: Sequence[float]) -> pd.DataFrame:
    rows = []
    for metric, label in METRICS.items():
        a_values = _side_values(per_request, "a", metric)
        b_values = _side_values(per_request, "b", metric)
        for q in percentiles:
            a_us = float(np.quantile(a_values, q / 100)) if len(a_values) else math.nan
            b_us = float(np.quantile(b_values, q / 100)) if len(b_values) else math.nan
            rows.append(
                {
                    "metric": metric,
                    "label": label,
                    "percentile": percentile_label(q),
                    "a_count": len(a_values),
                    "b_count": len(b_values),
                    "a_us": a_us,
                    "b_us": b_us,
                    "signed_error": (b_us - a_us) / a_us if a_us > 0 else math.nan,
                }
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------- text


def _percent(value: float, *, signed: bool = False) -> str:
    if pd.isna(value):
        return "n/a"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _ms(value_us: float) -> str:
    if pd.isna(value_us):
        return "n/a"
    ms = value_us / 1000
    return f"{ms:,.1f}" if abs(ms) >= 100 else f"{ms:.3f}" if abs(ms) < 1 else f"{ms:.2f}"


def _json_number(value: Any) -> float | int | None:
    if pd.isna(value):
        return None
    if isinstance(value, int | np.integer):
        return int(value)
    number = float(value)
    return number if math.isfinite(number) else None


# ---------------------------------------------------------------------- figures


def draw_comparison_cdfs(comparison: Comparison) -> Figure:
    """Empirical CDFs of TTFT, TPOT and E2E (ms), A and B on each of three panels.

    Each side's curve covers the requests that enter its percentiles (matched or not).
    Needs matplotlib.
    """
    import matplotlib.pyplot as plt

    from simsim import plots

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), sharey=True, layout="constrained")
    for ax, (metric, label) in zip(axes, METRICS.items(), strict=True):
        ax.set_title(label)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        drawn = False
        for side, name, style in (
            ("a", comparison.labels[0], "-"),
            ("b", comparison.labels[1], "--"),
        ):
            values_ms = np.sort(_side_values(comparison.per_request, side, metric)) / 1000.0
            if len(values_ms) == 0:
                continue
            fraction = np.arange(1, len(values_ms) + 1) / len(values_ms)
            ax.step(
                np.concatenate([[values_ms[0]], values_ms]),
                np.concatenate([[0.0], fraction]),
                where="post",
                linestyle=style,
                label=f"{side.upper()}: {name} ({counted(len(values_ms), 'request')})",
            )
            drawn = True
        if drawn:
            ax.legend(loc="lower right", fontsize="small")
        else:
            plots._no_data(ax, f"no request has a {label}")
    axes[0].set_ylabel("fraction of requests")
    fig.suptitle(f"Latency CDFs: A = {comparison.labels[0]}, B = {comparison.labels[1]}")
    return fig


def draw_comparison_scatter(comparison: Comparison) -> Figure:
    """Per-request A (x) against B (y) for TTFT, TPOT and E2E (ms), with the line y = x.

    One point per request whose error counts (``used`` in ``errors``). Needs matplotlib.
    """
    import matplotlib.pyplot as plt

    from simsim import plots

    fig, axes = plt.subplots(1, 3, figsize=(15, 5), layout="constrained")
    per_request = comparison.per_request
    for ax, (metric, label) in zip(axes, METRICS.items(), strict=True):
        used = per_request[f"{_stem(metric)}_ape"].notna().to_numpy(dtype=bool)
        x = per_request.loc[used, f"a_{metric}"].to_numpy(dtype=np.float64) / 1000.0
        y = per_request.loc[used, f"b_{metric}"].to_numpy(dtype=np.float64) / 1000.0
        ax.set_title(label)
        ax.set_xlabel(f"A: {comparison.labels[0]} (ms)")
        ax.set_ylabel(f"B: {comparison.labels[1]} (ms)")
        ax.grid(True, alpha=0.3)
        if len(x) == 0:
            plots._no_data(ax, f"no request has a {label} in both runs")
            continue
        low = float(min(x.min(), y.min()))
        high = float(max(x.max(), y.max()))
        ax.plot([low, high], [low, high], color="0.4", linewidth=1, label="y = x")
        ax.scatter(x, y, s=10, alpha=0.6, label=counted(len(x), "request"))
        row = comparison.errors.to_dict("index")[metric]
        ax.legend(
            loc="upper left",
            fontsize="small",
            title=f"|B - A| / A: median {_percent(row['median_ape'])}, "
            f"p90 {_percent(row['p90_ape'])}",
            title_fontsize="small",
        )
        ax.set_aspect("equal", adjustable="datalim")
    fig.suptitle("Per-request latencies, A against B")
    return fig
