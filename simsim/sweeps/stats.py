"""Confidence intervals for replicated runs: Student's t, without SciPy.

The core install depends on NumPy and pandas only, so the t quantile is computed here:
the t distribution's CDF comes from the regularized incomplete beta function (a
continued fraction evaluated with the modified Lentz method), and the quantile is found
by bisection on that CDF (relative error below 1e-9 against SciPy up to 1e5 degrees of
freedom).

A t interval is symmetric about the mean, so with few replications of a metric near the
edge of its range (an SLO attainment near 1, a latency near 0) it reaches values the
metric cannot take. Intervals are clipped to the metric's range (:func:`metric_range`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "MeanInterval",
    "mean_interval",
    "metric_range",
    "student_t_cdf",
    "student_t_quantile",
]

_TINY = 1e-300
_EPSILON = 1e-15
# Words of a metric's name (split at "_") that say what it can be: a fraction is in
# [0, 1]; a count, a duration in microseconds, a rate or a length is at least 0.
_FRACTION_WORDS = frozenset(
    {
        "attainment",
        "fraction",
        "hit",
        "share",
        "fairness",
        "utilisation",
        "utilization",
        "overloaded",
    }
)
_NON_NEGATIVE_WORDS = frozenset(
    {
        "count",
        "requests",
        "tokens",
        "us",
        "throughput",
        "goodput",
        "length",
        "busy",
        "replicas",
        "imbalance",
    }
)


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    c = 1.0
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 1000):
        # Even step, then odd step, of the fraction's recurrence.
        numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + numerator / c
        c = c if abs(c) > _TINY else _TINY
        result *= d * c
        numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + numerator / c
        c = c if abs(c) > _TINY else _TINY
        step = d * c
        result *= step
        if abs(step - 1.0) < _EPSILON:
            break
    return result


def _regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    # The fraction converges fast only on this side of the mean; use symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t distribution with *df* > 0 degrees of freedom."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The *p* quantile of Student's t with *df* > 0 degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be strictly between 0 and 1, got {p!r}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    high = 1.0
    while student_t_cdf(high, df) < p:
        high *= 2.0
    low = 0.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True, slots=True)
class MeanInterval:
    """The mean of some replications and its two-sided Student-t confidence interval.

    ``count`` is the number of finite values used; with fewer than two the interval
    (and ``std``) is NaN. ``low`` and ``high`` lie within the bounds the interval was
    computed with (see :func:`mean_interval`).
    """

    mean: float
    std: float
    count: int
    low: float
    high: float


def metric_range(metric: str) -> tuple[float, float]:
    """The lowest and highest value a :func:`simsim.summarize` metric can take, by its name.

    The name's words (split at ``_``) tell. A fraction, with a word ``attainment``,
    ``fraction``, ``hit``, ``share``, ``fairness``, ``utilisation`` or ``utilization``
    (``slo_attainment``, ``prefix_cache_hit_rate_tokens``, ``rejected_share``,
    ``jain_fairness_index``), is in [0, 1].
    A count, a duration, a rate, a length or a ratio of counts, with a word ``count``,
    ``requests``, ``tokens``, ``us`` (microseconds: ``ttft_us_p99``, ``makespan_us``),
    ``throughput``, ``goodput``, ``length``, ``busy``, ``replicas`` or ``imbalance``, is
    at least 0 with no upper limit. Every metric :func:`simsim.summarize` and
    :func:`~simsim.results.class_summary` report is one of these (a test holds them to
    it). A name with none of these words (a column of the caller's own) gets no limits,
    so its interval is never clipped.
    """
    words = set(metric.lower().split("_"))
    if words & _FRACTION_WORDS:
        return (0.0, 1.0)
    if words & _NON_NEGATIVE_WORDS:
        return (0.0, math.inf)
    return (-math.inf, math.inf)


def mean_interval(
    values: Iterable[float],
    confidence: float = 0.95,
    *,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> MeanInterval:
    """Mean, sample standard deviation and *confidence* interval of the finite *values*.

    NaN values (a metric a run could not measure) are left out and not counted. The
    interval is clipped to *bounds*, the values the quantity can take (see
    :func:`metric_range`): a fraction's interval never reaches above 1, a latency's never
    below 0.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    lowest, highest = bounds
    if not lowest <= highest:
        raise ValueError(f"bounds must be (low, high) with low <= high, got {bounds!r}")
    finite = [float(v) for v in values if math.isfinite(float(v))]
    count = len(finite)
    if count == 0:
        return MeanInterval(math.nan, math.nan, 0, math.nan, math.nan)
    mean = math.fsum(finite) / count
    if count == 1:
        return MeanInterval(mean, math.nan, 1, math.nan, math.nan)
    variance = math.fsum((v - mean) ** 2 for v in finite) / (count - 1)
    std = math.sqrt(variance)
    half = student_t_quantile(0.5 + confidence / 2.0, count - 1) * std / math.sqrt(count)
    low = min(max(mean - half, lowest), highest)
    high = max(min(mean + half, highest), lowest)
    return MeanInterval(mean, std, count, low, high)
