"""The llama.cpp reference benchmark's infrastructure, without building llama.cpp.

The launcher (``benchmarks/fidelity/llama.py``) is driven against a stand-in
``llama-server``: a small Python script that answers ``/health`` and completions and
records its command line. The workload files are checked against the limits the
reference server imposes (per-slot context, duration, size), and the pipeline's
backend substitution is checked on a real workload file.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest
from helpers import ROOT, load_script

from simsim.scenario import load_scenario

FIDELITY = ROOT / "benchmarks" / "fidelity"

FAKE_SERVER = """\
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
with open(os.environ["FAKE_LLAMA_RECORD"], "w") as record:
    json.dump({"pid": os.getpid(), "argv": args}, record)
if os.environ.get("FAKE_LLAMA_FAIL"):
    print("error: failed to load model 'nowhere.gguf'", flush=True)
    sys.exit(3)


class Handler(BaseHTTPRequestHandler):
    def _answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer({"status": "ok"})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer({"choices": [{"text": " w1", "finish_reason": "length"}]})

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


@pytest.fixture(scope="module")
def llama() -> ModuleType:
    return load_script(FIDELITY / "llama.py", "fidelity_llama")


@pytest.fixture
def fake_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    binary.chmod(0o755)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("FAKE_LLAMA_RECORD", str(tmp_path / "record.json"))
    monkeypatch.setenv("SIMSIM_LLAMA_CACHE", str(tmp_path))
    return binary


def _record(binary: Path) -> dict[str, object]:
    result: dict[str, object] = json.loads((binary.parent.parent / "record.json").read_text())
    return result


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launcher_starts_on_loopback_serves_and_stops(llama: ModuleType, fake_binary: Path) -> None:
    assert llama.server_binary() == fake_binary  # found through SIMSIM_LLAMA_CACHE
    with llama.llama_server(llama.model_path(), parallel=4) as url:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            assert json.load(response) == {"status": "ok"}
        record = _record(fake_binary)
        pid = record["pid"]
        assert isinstance(pid, int) and _alive(pid)
    assert not _alive(pid)
    argv = record["argv"]
    assert isinstance(argv, list)
    options = dict(zip(argv[::2], argv[1::2], strict=False))
    assert options["--host"] == "127.0.0.1"
    assert options["--port"] == url.rsplit(":", 1)[1]
    assert options["--threads"] == options["--threads-batch"] == "1"
    assert options["--parallel"] == "4"
    # Each of the 4 slots gets the per-slot context: the total is split by the server.
    assert options["--ctx-size"] == str(4 * llama.CONTEXT_TOKENS_PER_SLOT)


def test_launcher_stops_the_server_when_the_block_raises(
    llama: ModuleType, fake_binary: Path
) -> None:
    with pytest.raises(KeyError), llama.llama_server(llama.model_path()):
        pid = _record(fake_binary)["pid"]
        raise KeyError("the caller failed")
    assert isinstance(pid, int) and not _alive(pid)


def test_launcher_reports_a_server_that_exits_with_its_log(
    llama: ModuleType, fake_binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_FAIL", "1")
    error = r"exited with status 3(.|\n)*nowhere\.gguf"
    with pytest.raises(RuntimeError, match=error), llama.llama_server(llama.model_path()):
        pass


def test_launcher_without_setup_says_to_run_setup(
    llama: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIMSIM_LLAMA_CACHE", str(tmp_path))
    error = r"no llama-server binary .*setup\.sh"
    with pytest.raises(FileNotFoundError, match=error), llama.llama_server(llama.model_path()):
        pass


def test_request_extras_ban_every_token_that_streams_no_text(llama: ModuleType) -> None:
    extras = llama.REQUEST_EXTRAS
    assert extras["ignore_eos"] is True and extras["cache_prompt"] is False
    banned = sorted(int(token_id) for token_id in extras["logit_bias"])
    # <unk>, <s>, </s>, then the two helper pieces after the words (make_model.py).
    assert banned == [0, 1, 2, 3 + llama.WORDS, 4 + llama.WORDS]
    assert set(extras["logit_bias"].values()) == {False}
    assert not set(banned) & set(llama.PROMPT_TOKEN_IDS)


CONFIGS = {"single_slot": ("single_slot", None), "batching": ("batching", 4)}
WORKLOADS = ("calib", "rate", "lengths", "bursty")


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("workload", WORKLOADS)
def test_workload_fits_the_reference_server(llama: ModuleType, config: str, workload: str) -> None:
    scenario = load_scenario(FIDELITY / "workloads" / config / f"{workload}.toml")
    engine, slots = CONFIGS[config]
    assert scenario.engine == engine
    assert (scenario.batching.max_active_requests if scenario.batching else None) == slots
    requests = scenario.all_requests()
    assert 100 <= len(requests) <= 200
    assert max(request.arrival_time_us for request in requests) <= 60_000_000
    for request in requests:
        # The server silently cuts a request that outgrows its slot's context.
        total = request.prompt_token_count + request.max_output_tokens
        assert total <= llama.CONTEXT_TOKENS_PER_SLOT, request
        assert request.prompt_token_count >= 1 and request.max_output_tokens >= 2, request


def test_the_pipeline_knows_every_workload_and_config() -> None:
    run = load_script(FIDELITY / "run.py", "fidelity_run")
    assert run.WORKLOADS == WORKLOADS
    assert {name: (config.engine, config.parallel) for name, config in run.CONFIGS.items()} == {
        "single_slot": ("single_slot", 1),
        "batching": ("batching", 4),
    }


def test_simulated_scenario_is_the_workload_with_the_fitted_backend() -> None:
    run = load_script(FIDELITY / "run.py", "fidelity_run")
    source = FIDELITY / "workloads" / "batching" / "rate.toml"
    fitted = '[backend]\nkind = "fitted"\nprefill_base_us = 1500.5\ndecode_base_us = 800.25\n'
    result = tomllib.loads(run.with_backend(source.read_text(), fitted, str(source)))
    original = tomllib.loads(source.read_text())
    assert result["backend"] == tomllib.loads(fitted)["backend"]
    assert {key: value for key, value in result.items() if key != "backend"} == {
        key: value for key, value in original.items() if key != "backend"
    }
    with pytest.raises(ValueError, match="expected only a \\[backend\\] table"):
        run.with_backend(source.read_text(), "[scenario]\nname = 'x'\n", "fitted.toml")


def test_summary_gathers_every_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = load_script(FIDELITY / "run.py", "fidelity_run")
    monkeypatch.setenv("SIMSIM_LLAMA_CACHE", str(tmp_path / "no-cache"))
    for config, error in (("single_slot", 0.05), ("batching", 0.125)):
        record = {
            "config": config,
            "workload": "rate",
            "comparison": "simulated",
            "a": f"{config}/measured/rate-run1",
            "b": f"{config}/simulated/rate",
            "errors": [{"metric": "ttft_us", "median_ape": error}],
            "percentiles": [{"metric": "ttft_us", "percentile": 50, "relative_error": -error}],
        }
        (tmp_path / config).mkdir()
        (tmp_path / config / run.COMPARISONS_FILE).write_text(json.dumps([record]))
    run.write_summary(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [record["config"] for record in summary["comparisons"]] == ["single_slot", "batching"]
    assert summary["conditions"]["server"].startswith("unavailable")  # no binary there
    csv = (tmp_path / "summary.csv").read_text().splitlines()
    assert csv == [
        "config,workload,comparison,metric,median_ape",
        "single_slot,rate,simulated,ttft_us,0.05",
        "batching,rate,simulated,ttft_us,0.125",
    ]
    markdown = (tmp_path / "summary.md").read_text()
    assert "## batching / rate / simulated" in markdown
    assert "| ttft_us | 50 | -0.125 |" in markdown
