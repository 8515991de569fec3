"""A vLLM-shaped server in scenario files, the CLI and the Python API (issue 26, points 2 and 4).

``[scenario] engine = "vllm"`` with a ``[vllm]`` table, user GPUs in ``[gpus.<name>]``,
``[backend] kind = "physics"``; what ``simsim run`` and ``simsim validate`` say about
them; client latencies (the frontend's overheads) in the frames; clusters of vLLM
replicas; :class:`simsim.VllmConfig` and :func:`simsim.vllm_server`. The shipped
coefficients are being fitted: no test asserts a latency that depends on them.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

import simsim
from simsim.cli import main
from simsim.gpu import kv_cache_blocks, load_gpu, load_model, memory_plan
from simsim.gpu.physics import DEFAULT_COEFFICIENTS, FrontendOverheads
from simsim.results import CLIENT_COLUMNS
from simsim.scenario import (
    PhysicsBackendSpec,
    ScenarioError,
    load_scenario,
    parse_scenario,
    run_scenario,
)

LLAMA2 = "meta-llama/Llama-2-7b-hf"
REQUESTS = "".join(
    f"""
[[requests]]
request_id = {i}
arrival_time_us = {i * 20_000}
prompt_token_count = {200 + 50 * i}
max_output_tokens = {8 + i}
"""
    for i in range(6)
)
FRONTEND = """
[backend]
kind = "physics"
before_queue_us = 1500.0
per_output_token_us = 20.0
at_completion_us = 700.0
"""


def scenario_file(tmp_path: Path, body: str, *, requests: str = REQUESTS) -> Path:
    path = tmp_path / "scenario.toml"
    text = f'[scenario]\nname = "vllm-test"\nengine = "vllm"\n{textwrap.dedent(body)}\n{requests}'
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, body: str, **kwargs: str) -> simsim.scenario.Scenario:
    return load_scenario(scenario_file(tmp_path, body, **kwargs))


def error(tmp_path: Path, body: str) -> str:
    with pytest.raises(ScenarioError) as raised:
        load(tmp_path, body)
    message = str(raised.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------- parsing


def test_every_vllm_key_reaches_the_config(tmp_path: Path) -> None:
    scenario = load(
        tmp_path,
        f"""
        [vllm]
        model = "{LLAMA2.upper()}"
        gpu = "a100-80gb"
        tp = 2
        max_num_seqs = 64
        max_num_batched_tokens = 2048
        gpu_mem_util = 0.8
        block_size = 32
        enable_prefix_caching = false
        precision = "fp8"
        kv_cache_dtype = "fp8"
        """,
    )
    config = scenario.vllm
    assert config is not None
    assert config.model == load_model(LLAMA2, precision="fp8", kv_cache_dtype="fp8")
    assert (config.gpu.name, config.tp) == ("A100-SXM-80GB", 2)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (64, 2048)
    assert (config.gpu_mem_util, config.block_size) == (0.8, 32)
    assert config.enable_prefix_caching is False
    assert config.coefficients == DEFAULT_COEFFICIENTS
    assert scenario.backend == PhysicsBackendSpec(config.model, config.gpu, 2, DEFAULT_COEFFICIENTS)
    assert scenario.frontend == DEFAULT_COEFFICIENTS.frontend


def test_the_defaults_are_vllms(tmp_path: Path) -> None:
    config = load(tmp_path, f'[vllm]\nmodel = "{LLAMA2}"').vllm
    assert config == simsim.VllmConfig(LLAMA2)
    assert (config.gpu.name, config.tp, config.max_num_seqs) == ("H100-SXM", 1, 256)
    assert (config.max_num_batched_tokens, config.gpu_mem_util) == (8192, 0.9)
    assert (config.block_size, config.enable_prefix_caching) == (16, True)


def test_the_built_engine_is_the_vllm_shaped_batching_engine(tmp_path: Path) -> None:
    scenario = load(tmp_path, f'[vllm]\nmodel = "{LLAMA2}"\nmax_num_seqs = 32')
    engine = scenario.build()
    assert type(engine) is simsim.BatchingEngine
    assert (engine.policy, engine.max_active_requests, engine.max_batch_tokens) == (
        "mixed",
        32,
        8192,
    )
    assert engine.first_token_at_prefill and engine.prefix_cache
    blocks = kv_cache_blocks(load_model(LLAMA2), "H100", 1, max_num_seqs=32)
    assert engine.kv_cache == simsim.KvCacheConfig(16, blocks)
    backend = scenario.build_backend()
    assert isinstance(backend, simsim.PhysicsBackend)
    assert (backend.model.name, backend.gpu.name, backend.tp) == (LLAMA2, "H100-SXM", 1)


def test_a_model_path_is_read_from_the_scenario_files_folder(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    config = {
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 1000,
    }
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    by_file = load(tmp_path, '[vllm]\nmodel = "models/config.json"\ngpu = "L4"').vllm
    by_folder = load(tmp_path, '[vllm]\nmodel = "models"\ngpu = "L4"').vllm
    assert by_file is not None and by_folder is not None
    assert by_file.model.name == str(folder / "config.json")
    assert by_file.model == by_folder.model
    assert (by_file.model.num_layers, by_file.model.num_kv_heads) == (4, 2)


OWN_GPU = {"bf16_tflops": 500, "hbm_tb_s": 2.0, "memory_gib": 96, "interconnect_gb_s": 200}


def test_a_user_gpu_is_named_like_a_preset(tmp_path: Path) -> None:
    gpu = "\n".join(f"{key} = {value}" for key, value in OWN_GPU.items())
    body = f'[vllm]\nmodel = "{LLAMA2}"\ngpu = "my-gpu"\n[gpus.My-GPU]\n{gpu}\nprice_per_hour = 1.5'
    config = load(tmp_path, body).vllm
    assert config is not None
    assert config.gpu == simsim.GpuSpec.from_mapping("My-GPU", {**OWN_GPU, "price_per_hour": 1.5})
    assert config.memory().usable_bytes == int(96 * 2**30 * 0.9)


@pytest.mark.parametrize(
    ("body", "key", "rule"),
    [
        ("", "vllm", 'missing table: engine = "vllm" needs [vllm]'),
        ('[vllm]\ngpu = "H100"', "vllm.model", "missing required key"),
        (
            '[vllm]\nmodel = "llama-2-7b-hf"',
            "vllm.model",
            "unknown model 'llama-2-7b-hf' (did you mean 'meta-llama/Llama-2-7b-hf'?)",
        ),
        ('[vllm]\nmodel = "missing/config.json"', "vllm.model", "no config.json at "),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\ngpu = "H10"',
            "vllm.gpu",
            "unknown GPU 'H10' (did you mean 'H100-SXM'?); known GPUs: H100-SXM",
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\ntp = 3',
            "vllm.tp",
            "tp=3 does not divide meta-llama/Llama-2-7b-hf's 32 attention heads",
        ),
        (
            '[vllm]\nmodel = "meta-llama/Llama-3.1-70B-Instruct"\ngpu = "H100"',
            "vllm.tp",
            "needs 131.4 GiB of weights per GPU at tp=1 on H100-SXM",
        ),
        (f'[vllm]\nmodel = "{LLAMA2}"\ntp = 0', "vllm.tp", "must be >= 1, got 0"),
        (f'[vllm]\nmodel = "{LLAMA2}"\nmax_num_seq = 4', "vllm.max_num_seq", "did you mean"),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\ngpu_mem_util = 1.5',
            "vllm.gpu_mem_util",
            "must be in (0, 1], got 1.5",
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\nmax_num_seqs = 512\nmax_num_batched_tokens = 256',
            "vllm.max_num_batched_tokens",
            "must be at least max_num_seqs (512), got 256: every running sequence",
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\nprecision = "int4"',
            "vllm.precision",
            "unknown value 'int4'",
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\nenable_prefix_caching = 1',
            "vllm.enable_prefix_caching",
            "must be true or false",
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\n[backend]\nprefill_base_us = 1',
            "backend",
            'engine = "vllm" prices its steps with the physics cost model',
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\n[backend]\nkind = "physics"\ngpu = "H200"',
            "backend.gpu",
            "the model, GPU, tp and precisions come from [vllm]",
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\n[backend]\nkind = "physics"\nmemory_scale = -1',
            "backend.memory_scale",
            "must be >= 0, got -1.0",
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\ngpu = "X"\n[gpus.X]\nbf16_tflops = 1\nhbm_tb_s = 1',
            "gpus.X",
            "missing 'memory_gib'",
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\n[kv_cache]\nblock_size_tokens = 16\ntotal_blocks = 8',
            "kv_cache",
            'only for engine = "batching"',
        ),
        (
            f'[vllm]\nmodel = "{LLAMA2}"\n[cluster]\nreplicas = 2\n[cluster.prefill]\n'
            "replicas = 1\n[cluster.decode]\nreplicas = 1\n[cluster.transfer]\n"
            "kv_bytes_per_token = 1\nbandwidth_bytes_per_s = 1",
            "cluster.prefill",
            'disaggregated prefill and decode need engine = "batching"',
        ),
    ],
)
def test_every_bad_value_is_one_line_naming_its_key(
    tmp_path: Path, body: str, key: str, rule: str
) -> None:
    message = error(tmp_path, body)
    assert message.startswith(f"{tmp_path / 'scenario.toml'}: {key}: "), message
    assert rule in message


def test_a_config_missing_a_field_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}), encoding="utf-8")
    message = error(tmp_path, '[vllm]\nmodel = "config.json"')
    assert "vllm.model: " in message
    assert "config has no 'num_hidden_layers', which simsim needs" in message


def test_does_not_fit_says_by_how_much_and_which_tp_fits(tmp_path: Path) -> None:
    message = error(tmp_path, '[vllm]\nmodel = "meta-llama/Llama-3.1-70B-Instruct"')
    assert "short by" in message and message.endswith("try tp=2")


def test_an_unknown_user_gpu_lists_the_scenarios_own(tmp_path: Path) -> None:
    gpu = "\n".join(f"{key} = {value}" for key, value in OWN_GPU.items())
    body = f'[vllm]\nmodel = "{LLAMA2}"\ngpu = "my-gpx"\n[gpus.my-gpu]\n{gpu}'
    message = error(tmp_path, body)
    assert "vllm.gpu: unknown GPU 'my-gpx' (did you mean 'my-gpu'?)" in message
    assert "defined in [gpus]: my-gpu" in message


def test_vllm_tables_are_refused_beside_other_engines() -> None:
    base = {
        "scenario": {"engine": "batching"},
        "batching": {"max_active_requests": 2},
        "backend": {"decode_base_us": 1},
        "requests": [
            {"request_id": 0, "arrival_time_us": 0, "prompt_token_count": 1, "max_output_tokens": 1}
        ],
    }
    with pytest.raises(ScenarioError, match=r'vllm: only for engine = "vllm"'):
        parse_scenario({**base, "vllm": {"model": LLAMA2}})
    gpus = {"x": {"bf16_tflops": 1, "hbm_tb_s": 1, "memory_gib": 1, "interconnect_gb_s": 1}}
    with pytest.raises(ScenarioError, match=r"gpus: a GPU is named only by"):
        parse_scenario({**base, "gpus": gpus})


# --------------------------------------------------------- [backend] kind = "physics"


def test_a_physics_backend_prices_a_plain_batching_server() -> None:
    gpus = {
        "mine": {"bf16_tflops": 400, "hbm_tb_s": 1.5, "memory_gib": 48, "interconnect_gb_s": 32}
    }
    document = {
        "scenario": {"engine": "batching"},
        "batching": {"max_active_requests": 4},
        "backend": {"kind": "physics", "model": LLAMA2, "gpu": "mine", "per_step_us": 50.0},
        "gpus": gpus,
        "requests": [
            {
                "request_id": 0,
                "arrival_time_us": 0,
                "prompt_token_count": 64,
                "max_output_tokens": 4,
            }
        ],
    }
    scenario = parse_scenario(document)
    assert isinstance(scenario.backend, PhysicsBackendSpec)
    assert scenario.backend.gpu.name == "mine" and scenario.backend.tp == 1
    assert scenario.backend.coefficients == replace(DEFAULT_COEFFICIENTS, per_step_us=50.0)
    assert scenario.frontend is None  # only a vLLM server has a frontend
    engine = run_scenario(scenario)
    assert engine.requests[0].state is simsim.RequestState.FINISHED
    assert list(scenario.requests_frame(engine).columns) == list(engine.requests_frame().columns)
    with pytest.raises(ScenarioError, match=r"backend\.tp: .*short by"):
        parse_scenario(
            {
                **document,
                "backend": {"kind": "physics", "model": "meta-llama/Llama-3.1-405B"},
            }
        )
    fast = {key: value for key, value in document.items() if key not in ("batching", "gpus")}
    fast["scenario"] = {"engine": "single_slot_fast"}
    fast["backend"] = {"kind": "physics", "model": LLAMA2}
    with pytest.raises(ScenarioError, match=r'backend\.kind: "physics" prices each step'):
        parse_scenario(fast)
    fast["scenario"] = {"engine": "single_slot"}
    assert isinstance(parse_scenario(fast).build_backend(), simsim.PhysicsBackend)


# ------------------------------------------------------------------------- running


def test_a_run_gives_the_first_token_with_the_prefill(tmp_path: Path) -> None:
    scenario = load(tmp_path, f'[vllm]\nmodel = "{LLAMA2}"')
    engine = run_scenario(scenario)
    frame = engine.requests_frame()
    assert (frame["state"] == "FINISHED").all()
    assert (frame["first_token_time_us"] == frame["prefill_end_time_us"]).all()
    assert (frame["generated_token_count"] == frame["max_output_tokens"]).all()


def test_client_latencies_add_the_frontend_overheads_in_the_frames(tmp_path: Path) -> None:
    scenario = load(tmp_path, f'[vllm]\nmodel = "{LLAMA2}"\n{FRONTEND}')
    assert scenario.frontend == FrontendOverheads(1500.0, 20.0, 700.0)
    engine = run_scenario(scenario)
    frame = scenario.requests_frame(engine)
    own = engine.requests_frame()
    assert list(frame.columns) == [*own.columns, *CLIENT_COLUMNS]
    pd.testing.assert_frame_equal(frame[list(own.columns)], own)
    assert (frame["client_ttft_us"] == own["ttft_us"] + 1500.0).all()
    expected = own["e2e_latency_us"] + 1500.0 + 20.0 * own["generated_token_count"] + 700.0
    assert (frame["client_e2e_us"] == expected).all()
    assert str(frame["client_e2e_us"].dtype) == "Float64"
    summary = simsim.summarize(frame)["value"]
    assert summary["client_ttft_us_mean"] == pytest.approx(summary["ttft_us_mean"] + 1500.0)
    assert summary["client_e2e_us_p99"] == pytest.approx(frame["client_e2e_us"].quantile(0.99))


@pytest.mark.parametrize("caching", [True, False])
def test_shared_prefixes_name_blocks_the_prefix_cache_shares(tmp_path: Path, caching: bool) -> None:
    # No [prefix_cache] table: a vLLM server takes block hashes, and uses them when on.
    workload = (
        "count = 20\nrate_per_s = 50.0\nprompt_tokens = [300, 400]\noutput_tokens = [4, 8]\n"
        "shared_prefixes = { lengths = [256] }"
    )
    body = f'[vllm]\nmodel = "{LLAMA2}"\nenable_prefix_caching = {str(caching).lower()}\n'
    scenario = load(tmp_path, f"{body}[workload]\n{workload}", requests="")
    frame = run_scenario(scenario).requests_frame()
    assert (frame["state"] == "FINISHED").all()
    hits = frame["cached_prompt_tokens"].sum() if "cached_prompt_tokens" in frame else 0
    assert bool(hits > 0) is caching


def test_an_inference_perf_workload_runs_on_a_vllm_server(tmp_path: Path) -> None:
    # The reference set's rows are inference-perf runs on vLLM: its example's server tables
    # replaced by a [vllm] table make the same requests share prefixes in vLLM's cache.
    example = Path(__file__).resolve().parent.parent / "examples/scenarios/inference_perf.toml"
    text = example.read_text(encoding="utf-8")
    server = text[text.index("[backend]") : text.index("[workload]")]
    vllm = '[vllm]\nmodel = "meta-llama/Llama-3.1-8B-Instruct"\nmax_num_batched_tokens = 2048\n'
    text = text.replace(server, vllm).replace('engine = "batching"', 'engine = "vllm"')
    path = tmp_path / "inference_perf.toml"
    path.write_text(text, encoding="utf-8")
    scenario = load_scenario(path)
    frame = scenario.requests_frame(run_scenario(scenario))
    assert (frame["state"] == "FINISHED").all()
    assert frame["cached_prompt_tokens"].sum() > 0
    assert set(frame["tag_stage"]) == {0, 1}


def test_an_unfinished_request_has_no_client_latency(tmp_path: Path) -> None:
    cancel = "\n[[cancellations]]\ntime_us = 0\nrequest_id = 0\n"
    scenario = load(tmp_path, f'[vllm]\nmodel = "{LLAMA2}"\n{FRONTEND}{cancel}')
    frame = scenario.requests_frame(run_scenario(scenario))
    assert frame.loc[0, "state"] == "CANCELLED"
    assert frame.loc[0, CLIENT_COLUMNS].isna().all()
    assert frame.loc[1:, CLIENT_COLUMNS].notna().all().all()


def test_a_frame_without_client_columns_summarises_as_before(tmp_path: Path) -> None:
    engine = run_scenario(load(tmp_path, f'[vllm]\nmodel = "{LLAMA2}"'))
    summary = simsim.summarize(engine.requests_frame())
    assert not any(name.startswith("client_") for name in summary.index)


def test_a_cluster_of_vllm_replicas(tmp_path: Path) -> None:
    body = f"""
    [vllm]
    model = "{LLAMA2}"
    max_num_seqs = 8

    [cluster]
    replicas = 3
    router = "prefix_affinity"
    """
    scenario = load(tmp_path, body)
    cluster = run_scenario(scenario)
    assert isinstance(cluster, simsim.Cluster)
    assert len(cluster.replicas) == 3
    blocks = kv_cache_blocks(load_model(LLAMA2), "H100", 1, max_num_seqs=8)
    for replica in cluster.replicas:
        assert type(replica) is simsim.BatchingEngine
        assert replica.first_token_at_prefill and replica.max_active_requests == 8
        assert replica.kv_cache == simsim.KvCacheConfig(16, blocks)
    frame = scenario.requests_frame(cluster)
    assert (frame["state"] == "FINISHED").all()
    assert frame["replica"].nunique() > 1
    assert frame["client_e2e_us"].notna().all()
    # Prefix affinity needs the replicas' prefix cache: without it, refused.
    message = error(tmp_path, body.replace("max_num_seqs = 8", "enable_prefix_caching = false"))
    assert "cluster.router: 'prefix_affinity'" in message


def test_a_sweep_over_vllm_settings_reports_client_latencies() -> None:
    document = {
        "scenario": {"engine": "vllm"},
        "vllm": {"model": LLAMA2},
        "backend": {"kind": "physics", "before_queue_us": 1000.0},
        "workload": {
            "count": 12,
            "rate_per_s": 20.0,
            "prompt_tokens": [50, 200],
            "output_tokens": [5, 20],
        },
    }
    result = simsim.sweep(document, {"vllm.tp": [1, 2]}, replications=1, workers=1)
    runs = result.runs.set_index("vllm.tp")
    assert runs["client_ttft_us_mean"].tolist() == pytest.approx(
        (runs["ttft_us_mean"] + 1000.0).tolist()
    )
    # Two GPUs split the weights each step reads: decode steps are quicker.
    assert runs.loc[2, "tpot_us_mean"] < runs.loc[1, "tpot_us_mean"]


# ---------------------------------------------------------------------------- CLI


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_simsim_run_says_what_it_built_and_what_a_client_sees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_file(tmp_path, f'[vllm]\nmodel = "{LLAMA2}"\ntp = 2\n{FRONTEND}')
    out_dir = tmp_path / "out"
    code, out, _ = cli(capsys, "run", str(path), "--out", str(out_dir))
    assert code == 0
    plan = memory_plan(load_model(LLAMA2), load_gpu("H100"), 2)
    lines = out.splitlines()
    assert (
        f"vllm          {LLAMA2} on H100-SXM x 2 (tp=2): "
        f"{plan.weight_bytes / 2**30:.1f} GiB of 16-bit weights per GPU"
    ) in lines
    assert (
        f"vllm memory   {plan.kv_blocks:,} KV blocks x 16 tokens = {plan.kv_tokens:,} tokens "
        "of 16-bit KV cache per replica (gpu_mem_util 0.9)"
    ) in lines
    assert (
        "vllm limits   max_num_seqs 256, max_num_batched_tokens 8,192, prefix caching on" in lines
    )
    client = [line for line in lines if line.startswith(("client TTFT", "client e2e"))]
    assert len(client) == 2 and all(line.endswith("6 finished requests") for line in client)
    assert (
        "client rows   include vLLM's frontend overheads (the rows above them are the engine's):"
    ) in lines
    assert (
        "              1.5 ms before queueing, 0.020 ms per output token, 0.700 ms at completion"
        in lines
    )
    requests = pd.read_csv(out_dir / "requests.csv")
    assert list(requests.columns[-2:]) == list(CLIENT_COLUMNS)
    summary = pd.read_csv(out_dir / "summary.csv").set_index("metric")["value"]
    assert summary["client_ttft_us_mean"] == pytest.approx(requests["client_ttft_us"].mean())


def test_simsim_run_names_an_overloaded_vllm_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One running sequence at a time and long outputs: arrivals outpace completions.
    workload = (
        "count = 120\nrate_per_s = 200.0\nprompt_tokens = [500, 600]\noutput_tokens = [200, 220]"
    )
    body = f'[vllm]\nmodel = "{LLAMA2}"\nmax_num_seqs = 1\n[workload]\n{workload}'
    path = scenario_file(tmp_path, body, requests="")
    code, out, _ = cli(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert code == 0
    assert any(line.startswith("overloaded: the queue grew") for line in out.splitlines())
    summary = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("metric")["value"]
    assert summary["overloaded"] == 1.0


def test_simsim_run_of_another_engine_prints_no_client_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain.toml"
    path.write_text(f"[backend]\ndecode_base_us = 10\n{REQUESTS}", encoding="utf-8")
    code, out, _ = cli(capsys, "run", str(path), "--out", str(tmp_path / "out"))
    assert code == 0
    assert "client" not in out and "vllm" not in out


def test_simsim_validate_checks_a_vllm_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_file(tmp_path, f'[vllm]\nmodel = "{LLAMA2}"')
    code, out, _ = cli(capsys, "validate", str(path))
    blocks = kv_cache_blocks(load_model(LLAMA2), "H100", 1)
    assert code == 0
    assert out == (
        f"{path}: ok: scenario 'vllm-test', engine vllm ({LLAMA2} on H100-SXM x 1, "
        f"{blocks:,} KV blocks of 16 tokens per replica), 6 requests, 0 cancellations\n"
    )
    bad = scenario_file(tmp_path, '[vllm]\nmodel = "meta-llama/Llama-3.1-70B-Instruct"')
    code, out, err = cli(capsys, "validate", str(bad))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "vllm.tp: " in err and "try tp=2" in err


# --------------------------------------------------------------------- Python API


def test_vllm_server_is_the_configs_engine() -> None:
    env = simsim.Environment()
    engine = simsim.vllm_server(LLAMA2, "H100", tp=2, max_num_seqs=16, env=env)
    assert type(engine) is simsim.BatchingEngine and engine.env is env
    config = simsim.VllmConfig(LLAMA2, "H100", 2, max_num_seqs=16)
    assert engine.kv_cache == config.kv_cache()
    assert (engine.max_active_requests, engine.policy) == (16, "mixed")
    fp8 = simsim.vllm_server(LLAMA2, precision="fp8", kv_cache_dtype="fp8")
    assert fp8.kv_cache is not None and engine.kv_cache is not None
    assert fp8.kv_cache.total_blocks > simsim.VllmConfig(LLAMA2).kv_cache().total_blocks
    with pytest.raises(ValueError, match="apply to a model given by name or path"):
        simsim.vllm_server(load_model(LLAMA2), precision="fp8")
    engine.submit(simsim.Request(0, 0, 100, 3))
    engine.run()
    assert engine.requests[0].generated_token_count == 3


def test_the_public_names_are_the_gpu_packages() -> None:
    assert simsim.ModelSpec is simsim.gpu.ModelSpec and simsim.GpuSpec is simsim.gpu.GpuSpec
    assert simsim.load_model is simsim.gpu.load_model and simsim.load_gpu is simsim.gpu.load_gpu
    assert simsim.PhysicsBackend is simsim.gpu.physics.PhysicsBackend
    assert simsim.PhysicsCoefficients is simsim.gpu.physics.PhysicsCoefficients
    assert simsim.VllmConfig is simsim.gpu.vllm.VllmConfig


# ------------------------------------------------------------------------ VllmConfig


def test_vllm_config_defaults_and_memory() -> None:
    config = simsim.VllmConfig(LLAMA2)
    model = load_model(LLAMA2)
    assert (config.model, config.gpu) == (model, load_gpu("H100"))
    assert (config.tp, config.gpus, config.max_num_seqs, config.max_num_batched_tokens) == (
        1,
        1,
        256,
        8192,
    )
    assert (config.gpu_mem_util, config.block_size, config.enable_prefix_caching) == (
        0.9,
        16,
        True,
    )
    assert config.coefficients is DEFAULT_COEFFICIENTS
    assert config.frontend == DEFAULT_COEFFICIENTS.frontend
    assert config.memory() == memory_plan(model, "H100", 1)
    assert config.kv_cache() == simsim.KvCacheConfig(16, memory_plan(model, "H100", 1).kv_blocks)
    backend = config.backend()
    assert (backend.model, backend.gpu, backend.tp) == (model, config.gpu, 1)


def test_vllm_config_engine_settings() -> None:
    config = simsim.VllmConfig(
        LLAMA2,
        "H200",
        4,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        block_size=32,
        enable_prefix_caching=False,
    )
    engine = config.engine()
    assert (engine.policy, engine.max_active_requests, engine.max_batch_tokens) == (
        "mixed",
        8,
        512,
    )
    plan = memory_plan(
        load_model(LLAMA2), "H200", 4, block_size=32, max_num_batched_tokens=512, max_num_seqs=8
    )
    assert engine.kv_cache == simsim.KvCacheConfig(32, plan.kv_blocks)
    assert engine.prefix_cache is False and engine.first_token_at_prefill is True
    assert isinstance(engine.scheduler_stats, simsim.SchedulerStats)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tp": 0}, ValueError, "tp"),
        ({"tp": 3}, ValueError, "tp=3 does not divide"),
        ({"max_num_seqs": 0}, ValueError, "max_num_seqs"),
        ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, ValueError, "at least max_num_seqs"),
        ({"gpu_mem_util": 0.0}, ValueError, r"gpu_mem_util must be in \(0, 1\]"),
        ({"gpu_mem_util": 1.2}, ValueError, r"gpu_mem_util must be in \(0, 1\]"),
        ({"block_size": 0}, ValueError, "block_size"),
        ({"enable_prefix_caching": 1}, TypeError, "enable_prefix_caching must be True or False"),
        ({"coefficients": {}}, TypeError, "coefficients must be a PhysicsCoefficients"),
        ({"gpu": "H1000"}, ValueError, "did you mean"),
        ({"model": "meta-llama/Llama-3.1-70B"}, ValueError, "short by"),
    ],
)
def test_vllm_config_refuses_bad_settings(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    arguments: dict[str, object] = {"model": LLAMA2, **kwargs}
    with pytest.raises(error, match=match):
        simsim.VllmConfig(**arguments)  # type: ignore[arg-type]


def test_capacity_targets_take_the_client_latencies() -> None:
    from simsim.sweeps.capacity import target_metrics

    checked, percentiles = target_metrics(
        {"client_ttft_us_p99": 2_000_000, "client_e2e_us_p95": 30_000_000}
    )
    assert checked == {"client_ttft_us_p99": 2_000_000.0, "client_e2e_us_p95": 30_000_000.0}
    assert 95.0 in percentiles
    with pytest.raises(ValueError, match="did you mean 'client_ttft_us_p99'"):
        target_metrics({"client_ttft_p99": 1.0})
