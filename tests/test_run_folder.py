"""A results folder is written and read in one place, and reads back as the frames were."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import EASY_CONFIG

import simsim
from simsim.run_folder import MANIFEST, RUN_TABLES, read_run_folder, write_run_folder


def batching_frames() -> dict[str, pd.DataFrame]:
    engine = simsim.BatchingEngine(simsim.SimulatedBackend(EASY_CONFIG), max_active_requests=2)
    for rid in range(4):
        engine.submit(simsim.Request(rid, 5 * rid, 3, 2))
    engine.run_next_timestamp()
    engine.cancel_request(3)  # a cancelled request: <NA> times in the table
    engine.run()
    return {
        "requests": engine.requests_frame(),
        "events": engine.events_frame(),
        "admissions": engine.admissions_frame(),
        "iterations": engine.iterations_frame(),
        "summary": simsim.summarize(engine.requests_frame(), slots=2).reset_index(),
    }


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_every_table_reads_back_with_the_frames_dtypes(tmp_path: Path, fmt: str) -> None:
    frames = batching_frames()
    written = write_run_folder(tmp_path, frames, format=fmt, scenario="s", seed=4, end_us=99)  # type: ignore[arg-type]
    assert [path.name for path in written] == [f"{n}.{fmt}" for n in RUN_TABLES] + [MANIFEST]
    folder = read_run_folder(tmp_path)
    assert folder.format == fmt
    assert folder.tables == RUN_TABLES
    for name, frame in frames.items():
        pd.testing.assert_frame_equal(folder.table(name), frame, check_dtype=True)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest == {
        "format": fmt,
        "tables": list(RUN_TABLES),
        "scenario": "s",
        "seed": 4,
        "end_us": 99,
        "simsim_version": simsim.__version__,
    }


def test_bad_tables_and_formats_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown run tables \\['extra'\\]"):
        write_run_folder(tmp_path, {"extra": pd.DataFrame()})
    with pytest.raises(ValueError, match="format must be one of"):
        write_run_folder(tmp_path, {}, format="xlsx")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_table_the_run_did_not_write_is_named(tmp_path: Path) -> None:
    frames = batching_frames()
    del frames["iterations"]
    write_run_folder(tmp_path, frames)
    folder = read_run_folder(tmp_path)
    assert not folder.has("iterations")
    with pytest.raises(FileNotFoundError, match=r"no iterations\.csv"):
        folder.table("iterations")


def test_a_broken_manifest_is_named(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ValueError, match="is not a simsim run manifest"):
        read_run_folder(tmp_path)


def test_a_rewrite_that_fails_half_way_leaves_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames = batching_frames()
    write_run_folder(tmp_path, frames)
    assert (tmp_path / MANIFEST).is_file()

    def disk_full(self: pd.DataFrame, *args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_run_folder(tmp_path, frames)
    assert not (tmp_path / MANIFEST).exists()  # so the folder never passes for complete


def test_summarize_slo_targets_may_be_floats_as_before() -> None:
    frame = batching_frames()["requests"]
    with_float = simsim.summarize(frame, ttft_slo_us=1500.0)
    with_int = simsim.summarize(frame, ttft_slo_us=1500)
    pd.testing.assert_frame_equal(with_float, with_int)
