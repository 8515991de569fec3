"""``simsim serve`` on the command line.

Two tests run the real command in a subprocess (``python -m simsim serve --port 0``),
read the address from its first line, call it with the ``openai`` client, stop it with
SIGINT or SIGTERM, and read the folder ``--record`` wrote with
:func:`simsim.run_folder.read_run_folder` and ``simsim plot``. The others call
:func:`simsim.cli.main` in this process with :meth:`LiveServer.run` replaced: by a
stand-in that fails (options that must be refused before serving) or by one that
serves a single request in the background and stops (a scenario file is served).
"""

from __future__ import annotations

import contextlib
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers import ROOT, HeldStream, wait_for
from prometheus_client.parser import text_string_to_metric_families

from simsim.cli import main
from simsim.live import LiveServer
from simsim.run_folder import read_run_folder

MODEL = "simsim"
_ADDRESS = re.compile(r" on (http://127\.0\.0\.1:(\d+)/v1) at speed ")


@contextlib.contextmanager
def _serve_process(cwd: Path, *options: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``simsim serve --port 0 --speed 50 *options*`` running; yields it and its base URL.

    The process is killed on the way out if the test left it running.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "simsim", "serve", "--port", "0", "--speed", "50", *options],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "simsim serve printed nothing in 60 s"
        first = process.stdout.readline()
        match = _ADDRESS.search(first)
        assert match, f"no address in the first line {first!r}"
        yield process, match.group(1)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=60)


def _stop(process: subprocess.Popen[str], signum: int) -> tuple[str, str]:
    """Send *signum*; return the rest of stdout and stderr once the process exited 0."""
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, (process.returncode, err)
    assert "Traceback" not in err, err
    return out, err


def _plot(folder: Path, capsys: pytest.CaptureFixture[str]) -> list[Path]:
    capsys.readouterr()
    assert main(["plot", str(folder)]) == 0, capsys.readouterr().err
    written = [Path(line) for line in capsys.readouterr().out.split()]
    assert written
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    return written


def test_sigint_stops_the_server_and_record_writes_a_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "served"
    with _serve_process(tmp_path, "--record", str(record)) as (process, url):
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            first = client.completions.create(model=MODEL, prompt="Hello, world!", max_tokens=5)
            second = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=7)
            chunks = list(
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=4,
                    stream=True,
                )
            )
        assert len(chunks) == 4
        out, _ = _stop(process, signal.SIGINT)
    assert "served 3 requests (3 finished, 0 cancelled, 0 unfinished)" in out
    assert f"results in {record}/ (csv)" in out
    run = read_run_folder(record)
    assert run.format == "csv"
    assert {"requests", "events", "admissions", "iterations", "summary"} <= set(run.tables)
    assert (record / "run.json").is_file()
    requests = run.requests().sort_values("request_id")
    assert list(requests["state"]) == ["FINISHED"] * 3
    assert list(requests["generated_token_count"]) == [5, 7, 4]
    assert first.usage is not None and second.usage is not None
    assert list(requests["prompt_token_count"]) == [
        first.usage.prompt_tokens,
        second.usage.prompt_tokens,
        3,  # "user: hi\n"
    ]
    assert (requests["ttft_us"] > 0).all()
    written = _plot(record, capsys)
    assert record / "iterations.png" in written  # the built-in server batches


def test_sigterm_ends_open_streams_and_records_every_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "served"
    with (
        _serve_process(tmp_path, "--record", str(record), "--format", "parquet") as (
            process,
            url,
        ),
        httpx.Client(timeout=30) as http,
        contextlib.ExitStack() as stack,
    ):
        # 60000 tokens of 8.25 simulated ms at speed 50 (10 wall s): far from done
        cut = HeldStream(stack, http, url, prompt="cut me off", max_tokens=60000)
        cut.read(2)
        cut.close()

        def aborted() -> bool:
            page = http.get(url.removesuffix("/v1") + "/metrics").text
            return any(
                sample.labels.get("finished_reason") == "abort" and sample.value == 1
                for family in text_string_to_metric_families(page)
                for sample in family.samples
            )

        wait_for(aborted, "the closed stream's request to be cancelled")
        left_open = HeldStream(stack, http, url, prompt="still going", max_tokens=60000)
        left_open.read(1)
        whole = http.post(f"{url}/completions", json={"model": MODEL, "prompt": "x"})
        assert whole.json()["usage"]["completion_tokens"] == 16
        out, _ = _stop(process, signal.SIGTERM)
        left_open.read_to_end()  # the server ended it: an error event, then [DONE]
        assert left_open.done
        assert [error["type"] for error in left_open.errors] == ["server_error"]
        assert "shutting down" in left_open.errors[0]["message"]
    assert "served 3 requests (1 finished, 1 cancelled, 1 unfinished)" in out
    run = read_run_folder(record)
    assert run.format == "parquet"
    requests = run.requests().sort_values("request_id")
    assert list(requests["state"]) == ["CANCELLED", "DECODING", "FINISHED"]
    assert 2 <= requests["generated_token_count"].iloc[0] < 60000
    assert len(left_open.chunks) <= requests["generated_token_count"].iloc[1] < 60000
    _plot(record, capsys)


# --------------------------------------------------------------------------- in process


@pytest.fixture
def must_not_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LiveServer.run`` fails the test: the command had to refuse before serving."""

    def run(self: LiveServer) -> None:
        # pytest.fail, not an Exception that main's last line of defence would catch
        pytest.fail(f"simsim serve started serving on port {self.port}")

    monkeypatch.setattr(LiveServer, "run", run)


@pytest.fixture
def serve_one(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``LiveServer.run`` serves one completion in the background, then stops.

    The answers are appended to the returned list.
    """
    answers: list[Any] = []

    def run(self: LiveServer) -> None:
        with (
            self,
            openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0) as client,
        ):
            answers.append(
                client.completions.create(model=self.options.model, prompt="x", max_tokens=3)
            )

    monkeypatch.setattr(LiveServer, "run", run)
    return answers


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--speed", "0"], "--speed"),
        (["--speed", "nan"], "--speed"),
        (["--port", "70000"], "--port"),
        (["--fail-rate", "2"], "--fail-rate"),
        (["--max-waiting", "-1"], "--max-waiting"),
        (["--fail-status", "200"], "--fail-status"),
        (["--retry-after", "-1"], "--retry-after"),
        (["--max-model-len", "-5"], "--max-model-len"),
        (["--model", ""], "--model"),
    ],
)
def test_bad_options_exit_2_with_one_line_naming_the_option(
    options: list[str],
    named: str,
    must_not_serve: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--port", "0", *options]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"simsim: error: {named}: "), lines[0]
    assert options[1] in lines[0] or options[1] == "", lines[0]


def test_record_on_a_file_names_record(
    tmp_path: Path, must_not_serve: None, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "a-file"
    target.write_text("not a folder")
    assert main(["serve", "--port", "0", "--record", str(target)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("simsim: error: --record: "), line
    assert str(target) in line


def test_a_refused_option_creates_no_record_folder(
    tmp_path: Path, must_not_serve: None, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "never"
    assert main(["serve", "--port", "0", "--record", str(record), "--fail-rate", "2"]) == 2
    assert "--fail-rate" in capsys.readouterr().err
    assert not record.exists()


def test_record_in_parquet_without_pyarrow_is_refused_before_serving(
    tmp_path: Path,
    must_not_serve: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "pyarrow" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    record = tmp_path / "rec"
    assert main(["serve", "--port", "0", "--record", str(record), "--format", "parquet"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert "--format parquet" in lines[0] and "pyarrow" in lines[0]


def test_a_busy_port_exits_1_with_one_line(
    must_not_serve: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"simsim: error: cannot listen on 127.0.0.1:{port} ("), lines[0]
    assert "in use" in lines[0]


_BACKEND = """
[backend]
prefill_base_us = 1000
prefill_per_token_us = 10
decode_base_us = 5000
decode_per_active_sequence_us = 0
prefill_per_active_sequence_us = 0
"""


def test_a_scenario_without_requests_is_served(
    tmp_path: Path, serve_one: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "server.toml"
    path.write_text('[scenario]\nname = "bare"\nengine = "single_slot_fast"\n' + _BACKEND)
    assert main(["serve", str(path), "--port", "0", "--speed", "50", "--model", "m1"]) == 0
    captured = capsys.readouterr()
    first, *rest = captured.out.splitlines()
    assert _ADDRESS.search(first), first
    assert "'m1' (bare, engine SimulationEngine)" in first
    assert "served 1 request (1 finished, 0 cancelled, 0 unfinished)" in rest[-1]
    assert "ignoring" not in captured.err
    assert "serving engine single_slot" in captured.err  # the fast engine has no steps
    assert serve_one[0].model == "m1"
    assert serve_one[0].usage.completion_tokens == 3


def test_a_scenario_with_requests_is_served_with_a_note(
    tmp_path: Path, serve_one: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "with-requests.toml"
    path.write_text(
        '[scenario]\nname = "busy"\nengine = "single_slot"\n'
        + _BACKEND
        + "[[requests]]\nrequest_id = 0\narrival_time_us = 0\n"
        + "prompt_token_count = 4\nmax_output_tokens = 2\n"
    )
    assert main(["serve", str(path), "--port", "0", "--speed", "50"]) == 0
    captured = capsys.readouterr()
    note = [line for line in captured.err.splitlines() if "ignoring" in line]
    assert note == [f"simsim: ignoring {path}'s requests: the clients send the requests"]
    # The served run has the client's request only, not the file's.
    assert "served 1 request " in captured.out.splitlines()[-1]
    assert serve_one[0].usage.prompt_tokens == 1


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_format_without_record_is_a_usage_error_naming_both(
    fmt: str, must_not_serve: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--port", "0", "--format", fmt])
    assert refused.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    last = captured.err.splitlines()[-1]
    assert last.startswith("simsim serve: error: "), last
    assert f"--format {fmt}" in last and "--record" in last


def _docs_serve_toml(tmp_path: Path) -> Path:
    """docs/serve.md's own ``serve.toml``, written to *tmp_path*."""
    page = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8")
    found = re.search(r"```toml\n(# serve\.toml\n.*?)```", page, re.DOTALL)
    assert found, "docs/serve.md has no toml block starting '# serve.toml'"
    path = tmp_path / "serve.toml"
    path.write_text(found.group(1))
    return path


def test_validate_serve_checks_serve_md_s_own_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _docs_serve_toml(tmp_path)
    assert main(["validate", str(path), "--serve"]) == 0
    captured = capsys.readouterr()
    assert captured.out == (
        f"{path}: ok: scenario 'eight-slots', engine batching, served over HTTP "
        "(the clients send the requests)\n"
    )
    # Without --serve it is checked for simsim run: the error says what is missing
    # and how to check it as a serving scenario.
    assert main(["validate", str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"simsim: error: {path}: the scenario has no requests: "), line
    assert f"simsim validate {path} --serve" in line


def _scenario_file(path: Path, engine: str, tables: str) -> Path:
    """A scenario named after *path*'s stem, of *engine*, with _BACKEND and *tables*."""
    path.write_text(f'[scenario]\nname = "{path.stem}"\nengine = "{engine}"\n{_BACKEND}{tables}')
    return path


def test_validate_serve_checks_a_cluster_as_serve_serves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _scenario_file(tmp_path / "two.toml", "single_slot", "[cluster]\nreplicas = 2\n")
    assert main(["validate", str(path), "--serve"]) == 0
    assert capsys.readouterr().out == (
        f"{path}: ok: scenario 'two', engine single_slot, cluster of 2 replicas, router "
        "round_robin, served over HTTP (the clients send the requests)\n"
    )


def test_validate_serve_refuses_what_serve_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _scenario_file(tmp_path / "bad.toml", "batching", "[cluster]\nreplicas = 2\n")
    assert main(["validate", str(path), "--serve"]) == 2
    line = capsys.readouterr().err
    assert line == f"simsim: error: {path}: batching.max_active_requests: missing required key\n"
    assert main(["serve", str(path), "--port", "0"]) == 2
    assert capsys.readouterr().err == line


def test_a_cluster_is_served_behind_one_endpoint_and_recorded_as_routed(
    tmp_path: Path,
) -> None:
    path = _scenario_file(
        tmp_path / "cluster.toml",
        "batching",
        "[batching]\nmax_active_requests = 4\n[cluster]\nreplicas = 2\n",
    )
    record = tmp_path / "served"
    with _serve_process(tmp_path, str(path), "--record", str(record)) as (process, url):
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            answers = [
                client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=n)
                for n in (2, 3, 4, 5)
            ]
        out, _ = _stop(process, signal.SIGINT)
    assert [answer.usage.completion_tokens for answer in answers if answer.usage] == [2, 3, 4, 5]
    assert "served 4 requests (4 finished, 0 cancelled, 0 unfinished)" in out
    run = read_run_folder(record)
    requests = run.requests().sort_values("request_id")
    assert list(requests["replica"]) == [0, 1, 0, 1]  # round_robin, as offline
    summary = run.table("summary").set_index("metric")["value"]
    assert summary["replicas"] == 2


def test_a_prefix_cache_scenario_is_served_with_a_note(
    tmp_path: Path, serve_one: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = _scenario_file(
        tmp_path / "prefix.toml",
        "batching",
        "[batching]\nmax_active_requests = 4\n"
        "[kv_cache]\nblock_size_tokens = 16\ntotal_blocks = 64\n[prefix_cache]\n",
    )
    assert main(["serve", str(path), "--port", "0", "--speed", "50"]) == 0
    served = capsys.readouterr().err
    note = [line for line in served.splitlines() if "[prefix_cache]" in line]
    assert note == [
        "simsim: note: [prefix_cache] never hits over HTTP: served requests carry no KV block "
        "hashes (prompts are not hashed into blocks yet), so every prompt is prefilled in full"
    ]
    # simsim validate --serve says the same.
    assert main(["validate", str(path), "--serve"]) == 0
    assert note[0] in capsys.readouterr().err


def test_validate_serve_notes_what_serve_ignores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _scenario_file(
        tmp_path / "classes.toml",
        "single_slot",
        "[[requests]]\nrequest_id = 0\narrival_time_us = 0\nprompt_token_count = 4\n"
        'max_output_tokens = 2\nrequest_class = "batch"\n'
        "[admission.limits.batch]\nmax_queued = 1\n",
    )
    assert main(["validate", str(path), "--serve"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"simsim: ignoring {path}'s requests: the clients send the requests",
        "simsim: note: served requests carry no class name, so the admission limits for "
        "'batch' never apply to them (only a '*' limit would)",
    ]


@pytest.mark.parametrize("serve", [True, False], ids=["serve", "run"])
def test_validate_takes_the_backend_file_run_and_serve_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], serve: bool
) -> None:
    # docs/fidelity.md's workflow: a scenario without [backend], the costs from calibrate.
    backend = tmp_path / "calibrated.toml"
    backend.write_text(_BACKEND)
    path = tmp_path / "plain.toml"
    requests = "" if serve else "[[requests]]\nrequest_id = 0\narrival_time_us = 0\n"
    requests += "" if serve else "prompt_token_count = 4\nmax_output_tokens = 2\n"
    path.write_text('[scenario]\nname = "plain"\nengine = "single_slot"\n' + requests)
    flags = ["--serve"] if serve else []
    assert main(["validate", str(path), *flags]) == 2  # no [backend] of its own
    assert "backend: missing table" in capsys.readouterr().err
    assert main(["validate", str(path), *flags, "--backend", str(backend)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok: scenario 'plain', engine single_slot")


def test_a_serving_file_may_name_classes_its_clients_never_carry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # serve.md: limits that name classes get a note, not a refusal (a serving file has no
    # requests of its own to check the names against).
    path = _scenario_file(
        tmp_path / "limits.toml",
        "single_slot",
        '[admission.limits.chat]\nmax_queued = 3\n[admission.limits."*"]\nrate_per_s = 5.0\n',
    )
    assert main(["validate", str(path), "--serve"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "simsim: note: served requests carry no class name, so the admission limits for "
        "'chat' never apply to them (only the '*' limit does)"
    ]


def test_the_closing_line_counts_the_requests_admission_turned_away(tmp_path: Path) -> None:
    path = _scenario_file(
        tmp_path / "limited.toml",
        "single_slot",
        '[admission.limits."*"]\nrate_per_s = 0.0\nburst = 1\n',  # one request, then none
    )
    with _serve_process(tmp_path, str(path)) as (process, url):
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            client.completions.create(model=MODEL, prompt="a", max_tokens=2)
            for prompt in ("b", "c"):
                with pytest.raises(openai.RateLimitError):
                    client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
        out, _ = _stop(process, signal.SIGINT)
    assert "served 3 requests (1 finished, 2 cancelled of which 2 rejected, 0 unfinished)" in out
