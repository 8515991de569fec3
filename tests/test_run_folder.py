"""A results folder is written and read in one place, and reads back as the frames were."""

from __future__ import annotations

import json
import tempfile
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import EASY_CONFIG
from helpers import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import simsim
from simsim.results import requests_frame
from simsim.run_folder import MANIFEST, RUN_TABLES, read_run_folder, write_run_folder
from simsim.scenario import parse_scenario, run_scenario


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
        "dtypes": {
            name: {str(column): str(dtype) for column, dtype in frame.dtypes.items()}
            for name, frame in frames.items()
        },
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


# ---------------------------------------------------------------- every kind of run

BACKEND = "[backend]\nprefill_base_us = 100\nprefill_per_token_us = 2\ndecode_base_us = 10\n"
BATCHING = '[scenario]\nengine = "batching"\n[batching]\nmax_active_requests = 2\n'
KV = "[kv_cache]\nblock_size_tokens = 16\ntotal_blocks = 100\n"


def listed(count: int, **extra: str) -> str:
    """*count* ``[[requests]]`` of 40-token prompts 5 us apart; *extra*: TOML lines by id."""
    return "".join(
        f"[[requests]]\nrequest_id = {rid}\narrival_time_us = {5 * rid}\n"
        f"prompt_token_count = 40\nmax_output_tokens = 3\n{extra.get(f'r{rid}', '')}"
        for rid in range(count)
    )


# Each kind of run a results folder holds, as a scenario: its tables are the frames
# simsim run (and simsim serve --record) writes.
RUNS = {
    "single_slot": BACKEND + listed(4) + "[[cancellations]]\nrequest_id = 3\ntime_us = 1\n",
    "batching_prefix_cache": BATCHING
    + BACKEND
    + KV
    + "[prefix_cache]\n[workload]\ncount = 6\nrate_per_s = 1000.0\nprompt_tokens = 40\n"
    + "output_tokens = 2\n[workload.shared_prefixes]\nlengths = [32]\n",
    "cluster": BATCHING + BACKEND + KV + "[prefix_cache]\n[cluster]\nreplicas = 5\n" + listed(4),
    "cluster_rejecting": BACKEND
    + "[cluster]\nreplicas = 2\n[admission]\n[admission.limits.b]\nmax_queued = 1\n"
    + listed(6, **{f"r{rid}": 'request_class = "b"\n' for rid in range(6)}),
    "disaggregated": BATCHING
    + BACKEND
    + KV
    + "[cluster.prefill]\nreplicas = 2\n[cluster.decode]\nreplicas = 3\n[cluster.transfer]\n"
    + "kv_bytes_per_token = 1000\nbandwidth_bytes_per_s = 1_000_000_000\n"
    + listed(4),
    # Names pandas reads as missing by default, a deadline past 2**53 (a float64 would
    # round it), tags of every type a file can give them, and admission's rejections.
    "classes_and_tags": BACKEND
    + '[scheduler]\npolicy = "edf"\n[admission]\n[admission.limits.NA]\nmax_queued = 1\n'
    + listed(
        4,
        r0='request_class = "NA"\ntenant = "null"\npriority = -3\n'
        "deadline_us = 9007199254740993\n"
        'tags = { user = "ann", n = 3, zip = "02134", ok = true, x = 0.5, mix = 1 }\n',
        r1='request_class = "NA"\ntags = { mix = "b", empty = "" }\n',
        r2='request_class = "NA"\n',
        r3="priority = 1\n",
    ),
    # What a served request carries: a priority, and no class, tenant or deadline.
    "metadata_without_names": BACKEND + listed(3, r1="priority = 2\n"),
}


def run_tables(text: str) -> dict[str, pd.DataFrame]:
    """The tables simsim run writes for the scenario *text*."""
    from simsim import results

    scenario = parse_scenario(tomllib.loads(text), source="run.toml")
    return results.run_tables(run_scenario(scenario))


def assert_reads_back(folder: Path, frames: dict[str, pd.DataFrame], fmt: str) -> None:
    folder.mkdir(exist_ok=True)
    write_run_folder(folder, frames, format=fmt)  # type: ignore[arg-type]
    run = read_run_folder(folder)
    for name, frame in frames.items():
        table = run.table(name)
        pd.testing.assert_frame_equal(table, frame, check_exact=True, obj=name)
        # pandas counts 1 == True == 1.0 and None == nan among Python objects: not here.
        for column, dtype in frame.dtypes.items():
            if dtype != np.dtype(object):
                continue
            assert list(map(repr, table[column])) == list(map(repr, frame[column])), column


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("kind", list(RUNS))
def test_every_kind_of_run_reads_back_as_it_was(tmp_path: Path, kind: str, fmt: str) -> None:
    frames = run_tables(RUNS[kind])
    if kind == "cluster_rejecting":
        assert frames["requests"]["rejection"].notna().any()
        assert frames["events"]["replica"].isna().any()
    if kind == "classes_and_tags":
        assert frames["requests"]["rejection"].notna().any()
    assert_reads_back(tmp_path, frames, fmt)


def test_a_served_record_reads_back_as_it_was(tmp_path: Path) -> None:
    from helpers import serve_backend, serving

    from simsim import results

    engine = simsim.BatchingEngine(serve_backend(100), max_active_requests=2)
    with serving(engine, 1000) as (server, http, _):
        for priority in (None, 3):
            body = {"model": "simsim", "prompt": [1, 2, 3], "max_tokens": 2, "priority": priority}
            assert http.post(f"{server.base_url}/completions", json=body).status_code == 200
    frames = results.run_tables(engine)  # what simsim serve --record writes
    assert frames["requests"]["request_class"].isna().all()
    for fmt in ("csv", "parquet"):
        assert_reads_back(tmp_path / fmt, frames, fmt)


# Text a name or a tag may hold, the awkward kinds included: pandas' missing-value
# spellings, number-like strings, quotes, separators, line breaks and carriage returns.
names = st.one_of(
    st.sampled_from(["NA", "null", "nan", "None", "N/A", "02134", "1e3", "True", "a,b", '"q"']),
    st.text(min_size=1, max_size=8),
)
tag_values = st.one_of(
    st.none(),
    names,
    st.just(""),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)


@st.composite
def annotated_requests(draw: st.DrawFn) -> list[simsim.Request]:
    keys = draw(st.lists(st.sampled_from(["a", "b", "r\r", "x y"]), unique=True, max_size=3))
    count = draw(st.integers(min_value=1, max_value=4))
    tags = dict.fromkeys(keys, tag_values)
    return [
        simsim.Request(
            rid,
            0,
            1,
            1,
            request_class=draw(st.none() | names),
            tenant=draw(st.none() | names),
            priority=draw(st.integers(min_value=-(2**63), max_value=2**63 - 1)),
            deadline_us=draw(st.none() | st.integers(min_value=0, max_value=2**63 - 1)),
            tags=draw(st.none() | st.fixed_dictionaries({}, optional=tags)),
        )
        for rid in range(count)
    ]


@settings(max_examples=examples(40), deadline=None)
@given(requests=annotated_requests())
def test_request_metadata_and_tags_read_back_exactly(requests: list[simsim.Request]) -> None:
    frame = requests_frame(requests)
    for fmt in ("csv", "parquet"):
        with tempfile.TemporaryDirectory() as folder:
            assert_reads_back(Path(folder), {"requests": frame}, fmt)


def test_an_older_folder_reads_with_the_dtypes_the_frames_give(tmp_path: Path) -> None:
    # A manifest from before dtypes were recorded: simsim's own rule types the columns.
    frames = run_tables(RUNS["cluster_rejecting"])
    write_run_folder(tmp_path, frames)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    del manifest["dtypes"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    run = read_run_folder(tmp_path)
    pd.testing.assert_frame_equal(run.requests(), frames["requests"])
    # The one column whose dtype the name does not tell: Int64 once it has gaps.
    pd.testing.assert_frame_equal(run.table("events"), frames["events"])
    untagged = run_tables(RUNS["classes_and_tags"])["requests"].drop(columns=TAGS)
    write_run_folder(tmp_path, {"requests": untagged})
    (tmp_path / MANIFEST).unlink()  # from before the manifest: the tables alone
    pd.testing.assert_frame_equal(read_run_folder(tmp_path).requests(), untagged)


TAGS = ["tag_user", "tag_n", "tag_zip", "tag_ok", "tag_x", "tag_mix", "tag_empty"]


def test_a_manifest_whose_dtypes_are_no_column_map_is_named(tmp_path: Path) -> None:
    write_run_folder(tmp_path, batching_frames())
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    for key, value, rule in [
        ("dtypes", ["int64"], "dtypes must map each table to its columns, got list"),
        ("dtypes", {"events": {"sequence": 64}}, "dtypes.events.sequence must be a dtype, got 64"),
        (
            "value_types",
            {"requests": {"tag_a": "list"}},
            "value_types.requests.tag_a must be one of \\('str', 'int', 'float', 'bool', "
            "'json'\\), got 'list'",
        ),
    ]:
        (tmp_path / MANIFEST).write_text(json.dumps({**manifest, key: value}))
        with pytest.raises(ValueError, match=f"is not a simsim run manifest \\({rule}"):
            read_run_folder(tmp_path)


def test_a_tag_cell_that_is_not_its_columns_type_is_named(tmp_path: Path) -> None:
    requests = [simsim.Request(rid, 0, 1, 1, tags={"n": rid}) for rid in range(2)]
    write_run_folder(tmp_path, {"requests": requests_frame(requests)})
    path = tmp_path / "requests.csv"
    path.write_text(path.read_text().replace(",1\n", ",one\n"))
    with pytest.raises(ValueError, match="column tag_n holds 'one', which is not of the type int"):
        read_run_folder(tmp_path).requests()
