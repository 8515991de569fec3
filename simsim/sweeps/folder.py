"""A sweep's results folder, read back: the reader beside :mod:`simsim.sweeps.sweep`'s
writer (:func:`~simsim.sweeps.sweep.write_tables`), so the manifest's keys are known
in one package.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simsim.sweeps.runner import MANIFEST
from simsim.sweeps.sweep import SUMMARY_FILE

__all__ = ["SweepFolder", "read_sweep_folder"]


def read_sweep_folder(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], pd.DataFrame]:
    """A finished sweep folder's manifest and summary table (what :func:`write_tables` wrote).

    Raises ``FileNotFoundError`` naming the folder and the missing file.
    """
    path = Path(folder)
    manifest_path = path / MANIFEST
    summary_path = path / SUMMARY_FILE
    for needed in (manifest_path, summary_path):
        if not needed.exists():
            raise FileNotFoundError(
                f"{path} is not a finished sweep folder: {needed.name} is missing "
                "(run 'simsim sweep' to the end first)"
            )
    manifest: dict[str, Any] = json.loads(manifest_path.read_text(encoding="utf-8"))
    return manifest, pd.read_csv(summary_path)


@dataclass(frozen=True)
class SweepFolder:
    """A finished sweep's results folder, read back: what :func:`simsim.sweep` (with
    ``out``) or ``simsim sweep`` wrote, seen by load.

    ``summary`` is the folder's ``summary.csv``; ``load`` the axis the sweep put on the
    x axis (its manifest's ``load``); ``configuration_columns`` the columns that tell
    the lines apart (the case and every other axis); ``confidence`` the level of the
    summary's intervals.
    """

    path: Path
    summary: pd.DataFrame
    load: str
    configuration_columns: tuple[str, ...]
    confidence: float

    @classmethod
    def read(cls, path: Path) -> SweepFolder:
        """Read the sweep's manifest and summary; errors name the folder and the file."""
        manifest, summary = read_sweep_folder(path)
        axes = [str(a) for a in manifest.get("axes", [])]
        load = manifest.get("load")
        if not axes or load not in axes:
            raise ValueError(
                f"{path}: the sweep has no grid axis to plot against (give it a [grid])"
            )
        others = [a for a in axes if a != load]
        configuration = tuple(c for c in ("case", *others) if c in summary.columns)
        return cls(path, summary, str(load), configuration, float(manifest["confidence"]))

    def lines(self, metric: str) -> list[tuple[str, pd.DataFrame]]:
        """One (label, rows sorted by load) pair per configuration, for *metric*."""
        rows = self.summary[self.summary["metric"] == metric]
        if not self.configuration_columns:
            return [("", rows.sort_values(self.load))]
        lines = []
        for keys, group in rows.groupby(list(self.configuration_columns), sort=False):
            values = keys if isinstance(keys, tuple) else (keys,)
            label = ", ".join(
                str(v) if c == "case" else f"{c}={v}"
                for c, v in zip(self.configuration_columns, values, strict=True)
            )
            lines.append((label, group.sort_values(self.load)))
        return lines
