"""Non-negative least squares, small and exact: the fitting under ``simsim calibrate``.

A cost model has a handful of coefficients, each a cost that cannot be negative, so the
fit is ``minimise |A x - b|`` subject to ``x >= 0`` with a few columns. :func:`nnls`
solves it exactly by trying every set of free coefficients (the others held at zero) and
keeping the best feasible one: with at most :data:`MAX_COLUMNS` columns that is a few
hundred small least-squares problems, and no optimisation library is needed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_COLUMNS", "LinearFit", "fit_nonnegative", "nnls"]

MAX_COLUMNS = 10
"""The most coefficients :func:`nnls` solves for (it tries all ``2**columns`` subsets)."""


def nnls(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The ``x >= 0`` that minimises ``|matrix @ x - target|`` (exact, by enumeration).

    Among equally good solutions the one with fewer non-zero coefficients wins, then
    the first found (subsets are tried from the fewest columns up), so the answer is
    deterministic. Raises ``ValueError`` for mismatched shapes, non-finite values, no
    rows, or more than :data:`MAX_COLUMNS` columns.
    """
    a = np.asarray(matrix, dtype=float)
    b = np.asarray(target, dtype=float)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise ValueError(
            f"matrix {a.shape} and target {b.shape} do not match (rows x columns, rows)"
        )
    rows, columns = a.shape
    if rows == 0:
        raise ValueError("nothing to fit: no observations")
    if columns > MAX_COLUMNS:
        raise ValueError(f"{columns} columns; nnls solves at most {MAX_COLUMNS}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("the observations hold a non-finite value (NaN or infinity)")
    best = np.zeros(columns)
    best_residual = float(b @ b)
    # A tiny slack so that a subset which only matches the best within rounding does
    # not replace a smaller one.
    slack = 1e-12 * max(best_residual, 1.0)
    for size in range(1, columns + 1):
        for subset in itertools.combinations(range(columns), size):
            chosen = list(subset)
            solution, *_ = np.linalg.lstsq(a[:, chosen], b, rcond=None)
            if (solution < 0).any():
                continue
            residual_vector = a[:, chosen] @ solution - b
            residual = float(residual_vector @ residual_vector)
            if residual < best_residual - slack:
                best = np.zeros(columns)
                best[chosen] = solution
                best_residual = residual
    return best


@dataclass(frozen=True)
class LinearFit:
    """A fitted non-negative linear model: its coefficients and how well it fits."""

    names: tuple[str, ...]
    coefficients: tuple[float, ...]
    observed: tuple[float, ...]
    predicted: tuple[float, ...]

    @property
    def r_squared(self) -> float:
        """``1 - SS_residual / SS_total`` (1.0 when every observation is equal and fitted)."""
        observed = np.asarray(self.observed)
        residual = float(((observed - np.asarray(self.predicted)) ** 2).sum())
        total = float(((observed - observed.mean()) ** 2).sum())
        if total == 0.0:  # every observation equal: fitted up to rounding, or not at all
            scale = float((observed**2).sum())
            return 1.0 if residual <= 1e-12 * max(scale, 1.0) else 0.0
        return 1.0 - residual / total

    @property
    def residuals(self) -> tuple[float, ...]:
        """Observed minus predicted, per observation."""
        return tuple(o - p for o, p in zip(self.observed, self.predicted, strict=True))

    def coefficient(self, name: str) -> float:
        """The coefficient of column *name*."""
        return self.coefficients[self.names.index(name)]

    def predict(self, row: Mapping[str, float]) -> float:
        """The model's value for one row of regressors (missing names count as 0)."""
        return sum(c * row.get(n, 0.0) for n, c in zip(self.names, self.coefficients, strict=True))


def fit_nonnegative(
    columns: Mapping[str, Sequence[float] | np.ndarray], target: Sequence[float] | np.ndarray
) -> LinearFit:
    """Fit ``target ~ sum of coefficient * column`` with every coefficient ``>= 0``.

    *columns* maps each coefficient's name to its regressor values, one per observation
    (a column of ones gives an intercept). See :func:`nnls` for the rules.
    """
    names = tuple(columns)
    if not names:
        raise ValueError("nothing to fit: no columns")
    matrix = np.column_stack([np.asarray(columns[name], dtype=float) for name in names])
    observed = np.asarray(target, dtype=float)
    solution = nnls(matrix, observed)
    predicted = matrix @ solution
    return LinearFit(
        names=names,
        coefficients=tuple(float(x) for x in solution),
        observed=tuple(float(x) for x in observed),
        predicted=tuple(float(x) for x in predicted),
    )
