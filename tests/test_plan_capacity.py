"""simsim.gpu.plan_capacity: the cheapest GPU type x tp x replicas within SLO targets.

Predicted latencies depend on fitted coefficients, so no test asserts one from the
shipped defaults: the hand-checkable cases pass their own coefficients (every step costs
exactly 10 ms), and the others assert structure and cost arithmetic only.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import simsim.gpu
from simsim.cli.app import main
from simsim.gpu.deployment import Deployment
from simsim.gpu.physics import PhysicsCoefficients
from simsim.gpu.vllm import VllmConfig
from simsim.sweeps import CapacityPlan, plan_capacity
from simsim.sweeps.plan import VERDICTS, check_plan_targets
from simsim.sweeps.plan_file import plan_from_file
from simsim.workloads import Fixed, FixedRateArrivals, OpenLoopWorkload

SMALL = "Qwen/Qwen2.5-0.5B-Instruct"  # 14 heads, 2 KV heads: tp=4 cannot split it
BIG = "meta-llama/Llama-3.1-70B-Instruct"

# Every step costs 10 ms, whatever it computes; nothing else costs anything.
TEN_MS_STEPS = PhysicsCoefficients(
    memory_scale=0.0,
    compute_scale=0.0,
    allreduce_scale=0.0,
    per_step_us=10_000.0,
    per_layer_us=0.0,
    per_sequence_us=0.0,
    before_queue_us=0.0,
    per_output_token_us=0.0,
    at_completion_us=0.0,
)
# One request at a time per replica, so a request of 10 output tokens takes 10 steps
# (its prefill gives the first token): 100 ms.
ONE_SLOT = {"max_num_seqs": 1, "coefficients": TEN_MS_STEPS}


def light(count: int = 30) -> OpenLoopWorkload:
    return OpenLoopWorkload(FixedRateArrivals(5.0), Fixed(100), Fixed(10), count=count)


def every_40_ms(count: int = 60) -> OpenLoopWorkload:
    return OpenLoopWorkload(FixedRateArrivals(25.0), Fixed(16), Fixed(10), count=count)


def plan_light(**kwargs: Any) -> CapacityPlan:
    """A plan of the light workload; its default target every configuration meets."""
    return plan_capacity(SMALL, light(), **{"targets": {"e2e_p99_ms": 60_000}, **kwargs})


def plan_one_slot(**kwargs: Any) -> CapacityPlan:
    """A plan of one-slot replicas at tp=1 behind a round robin, requests every 40 ms."""
    settings = {"tp": [1], "router": "round_robin", "vllm": ONE_SLOT, "workers": 1}
    return plan_capacity(SMALL, every_40_ms(), **{**settings, **kwargs})


def test_every_pair_is_reported_and_the_cheapest_passing_one_is_chosen() -> None:
    plan = plan_light(gpus=["H100", "L4"], tp=[1, 4, 2], max_replicas=4, workers=1)
    configurations = plan.configurations
    assert list(zip(configurations["gpu"], configurations["tp"], strict=True)) == [
        ("H100-SXM", 1),
        ("H100-SXM", 4),
        ("H100-SXM", 2),
        ("L4", 1),
        ("L4", 4),
        ("L4", 2),
    ]
    invalid = configurations[configurations["tp"] == 4]
    assert set(invalid["status"]) == {"invalid tp"}
    assert all("does not divide" in reason for reason in invalid["reason"])
    table = plan.table
    assert set(table["verdict"]) <= set(VERDICTS)
    run = table[table["replicas"].notna()]
    # Cost arithmetic: GPUs = replicas x tp, $/hour = GPUs x the GPU's price.
    prices = {"H100-SXM": simsim.gpu.load_gpu("H100").price_per_hour, "L4": 0.80}
    assert (run["gpus"] == run["replicas"] * run["tp"]).all()
    for _, row in run.iterrows():
        assert row["usd_per_hour"] == pytest.approx(row["gpus"] * prices[row["gpu"]])
    # A generous target: one replica of every valid pair meets it, so the cheapest
    # GPU at the smallest tp wins, after a single run per pair.
    assert len(run) == 4 and set(run["verdict"]) == {"meets"}
    assert plan.best is not None
    assert (plan.best.gpu, plan.best.tp, plan.best.replicas) == ("L4", 1, 1)
    assert plan.best.usd_per_hour == pytest.approx(0.80)
    assert table["best"].sum() == 1
    best_row = table[table["best"]].iloc[0]
    assert (best_row["gpu"], best_row["tp"], best_row["replicas"]) == ("L4", 1, 1)
    assert set(plan.best.metrics) >= {"ttft_p99_ms", "itl_p99_ms", "e2e_p99_ms", "overloaded"}


def test_a_lower_price_changes_the_answer() -> None:
    plan = plan_light(gpus=["L4", "H100"], tp=[1], prices={"h100": 0.10}, workers=1)
    assert plan.best is not None
    assert plan.best.gpu == "H100-SXM"
    assert plan.best.usd_per_hour == pytest.approx(0.10)
    assert plan.prices == {"L4": 0.80, "H100-SXM": 0.10}


def test_bisection_finds_the_fewest_replicas_by_hand() -> None:
    # Requests arrive every 40 ms and each takes 100 ms on a one-slot replica: round-robin
    # over 3 replicas gives each one every 120 ms (no wait); over 2, one every 80 ms (the
    # queue grows); 1 replica is overloaded.
    plan = plan_one_slot(targets={"e2e_p99_ms": 150}, gpus=["H100"], max_replicas=8)
    assert plan.best is not None
    assert plan.best.replicas == 3
    assert plan.best.metrics["e2e_p99_ms"] == pytest.approx(100.0)
    table = plan.table.set_index("replicas")
    # One replica, the most allowed, then bisection: 4, 2, 3.
    assert sorted(table.index) == [1, 2, 3, 4, 8]
    assert table.loc[1, "verdict"] == "overloaded"
    assert re.match(
        r"overloaded: 25\.\d requests/s arrived, [\d.]+/s completed, "
        r"the queue grew by \d+; e2e_p99 ",
        table.loc[1, "reason"],
    )
    assert table.loc[2, "verdict"] == "misses"
    assert re.fullmatch(
        r"e2e_p99 [\d,]+ ms > 150 ms \((\d+% over|[\d.]+x the limit)\)", table.loc[2, "reason"]
    )
    assert [table.loc[n, "verdict"] for n in (3, 4, 8)] == ["meets"] * 3
    # More replicas never cost less per hour.
    costs = [table.loc[n, "usd_per_hour"] for n in sorted(table.index)]
    assert costs == sorted(costs)
    assert plan.configurations.loc[0, "replicas"] == 3


def test_too_few_replicas_at_most_says_which_target_missed() -> None:
    targets = {"e2e_p99_ms": 150, "ttft_mean_ms": 50}
    plan = plan_one_slot(targets=targets, gpus=["H100"], max_replicas=2)
    assert plan.best is None
    assert list(plan.table["replicas"]) == [1, 2]
    row = plan.configurations.iloc[0]
    assert row["status"] == "misses" and pd.isna(row["replicas"])
    assert row["reason"].startswith("at 2 replicas (the most tried): e2e_p99 ")


def test_a_model_that_does_not_fit_is_never_run() -> None:
    plan = plan_capacity(BIG, light(), targets={"ttft_p99_ms": 1000}, gpus=["L4"], tp=[1, 2])
    assert plan.best is None
    assert list(plan.table["verdict"]) == ["does not fit", "does not fit"]
    assert plan.table["replicas"].isna().all()
    assert all("short by" in reason for reason in plan.table["reason"])


def test_a_request_longer_than_the_kv_cache_does_not_fit() -> None:
    huge = OpenLoopWorkload(FixedRateArrivals(1.0), Fixed(5_000_000), Fixed(10), count=1)
    plan = plan_capacity(SMALL, huge, targets={"ttft_p99_ms": 1000}, gpus=["L4"], tp=[1])
    (reason,) = plan.table["reason"]
    assert plan.table["verdict"].iloc[0] == "does not fit"
    assert reason.startswith("the longest request (5,000,010 tokens) needs 312,501 KV blocks")


def test_client_latencies_add_the_frontend_overheads() -> None:
    coefficients = PhysicsCoefficients(
        **{
            **{name: getattr(TEN_MS_STEPS, name) for name in TEN_MS_STEPS.__dataclass_fields__},
            "before_queue_us": 5_000.0,
            "per_output_token_us": 1_000.0,
            "at_completion_us": 2_000.0,
        }
    )
    config = VllmConfig(SMALL, "H100", 1, max_num_seqs=1, coefficients=coefficients)
    deployment = Deployment(config, 3, "round_robin")
    assert deployment.gpus == 3
    assert deployment.usd_per_hour(2.0) == 6.0
    metrics = deployment.run(light(), seed=0).metrics()
    # Prefill (with the first token) then 9 decode steps, 10 ms each, no waiting.
    assert metrics["ttft_p50_ms"] == pytest.approx(10.0 + 5.0)
    assert metrics["itl_p99_ms"] == pytest.approx(10.0 + 1.0)
    assert metrics["e2e_p50_ms"] == pytest.approx(100.0 + 5.0 + 10 * 1.0 + 2.0)
    assert metrics["itl_mean_ms"] == pytest.approx((117.0 - 15.0) / 9)
    assert metrics["overloaded"] == 0.0 and metrics["requests"] == 30.0


def test_a_pool_gives_the_same_plan() -> None:
    kwargs = {"targets": {"e2e_p99_ms": 150}, "gpus": ["H100", "L4"], "max_replicas": 4}
    here = plan_one_slot(**kwargs)
    pooled = plan_one_slot(workers=2, **kwargs)
    assert here.table.equals(pooled.table)
    assert here.best is not None and pooled.best is not None
    assert (here.best.gpu, here.best.replicas) == ("L4", 3)


def test_simsim_gpu_names_the_planner() -> None:
    assert simsim.gpu.plan_capacity is plan_capacity
    with pytest.raises(AttributeError, match="no attribute 'plan'"):
        simsim.gpu.plan  # noqa: B018


def test_targets_are_checked() -> None:
    targets, percentiles = check_plan_targets({"ttft_p95_ms": 2000, "itl_mean_ms": 50})
    assert targets == {"ttft_p95_ms": 2000.0, "itl_mean_ms": 50.0}
    assert 95.0 in percentiles


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"gpus": ["H10"]}, ValueError, r"unknown GPU 'H10' \(did you mean"),
        ({"gpus": []}, ValueError, "gpus must name at least one GPU"),
        ({"tp": []}, ValueError, "tp must list at least one tensor-parallel degree"),
        ({"tp": [0]}, ValueError, "tp"),
        ({"targets": {}}, ValueError, "targets must be a non-empty mapping"),
        ({"targets": {"ttft_p99": 2000}}, ValueError, r"unknown metric 'ttft_p99' \(did you"),
        ({"targets": {"ttft_p99_ms": -1}}, ValueError, r"targets\['ttft_p99_ms'\]"),
        ({"targets": {"tpot_p99_ms": 5}}, ValueError, "latency ttft, itl or e2e"),
        ({"prices": {"A100": 1.0}}, ValueError, "prices names 'A100', which is not among"),
        ({"prices": {"H100": 0}}, ValueError, r"prices\['H100'\]"),
        ({"max_replicas": 0}, ValueError, "max_replicas"),
        ({"router": "least_outstandin"}, ValueError, "did you mean 'least_outstanding'"),
        ({"workers": 2, "executor": object()}, ValueError, "either an executor or"),
        (
            {"vllm": {"max_num_seq": 8}},
            ValueError,
            r"vllm\['max_num_seq'\]: not a VllmConfig setting \(did you mean 'max_num_seqs'",
        ),
        ({"vllm": {"tp": 2}}, ValueError, r"vllm\['tp'\]: the plan sets it"),
        ({"vllm": {"gpu": "H100"}}, ValueError, r"vllm\['gpu'\]: the plan sets it"),
    ],
)
def test_bad_arguments_get_one_line(kwargs: dict[str, object], error: type, message: str) -> None:
    arguments: dict[str, object] = {
        "targets": {"ttft_p99_ms": 1000},
        "gpus": ["H100"],
        "tp": [1],
        "workers": 1,
        **kwargs,
    }
    if "executor" in kwargs:
        arguments["workers"] = kwargs["workers"]
    with pytest.raises(error, match=message) as raised:
        plan_capacity(SMALL, light(1), **arguments)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


def test_a_gpu_without_a_price_needs_one() -> None:
    mine = simsim.gpu.GpuSpec.from_mapping(
        "mine", {"bf16_tflops": 100, "hbm_tb_s": 1, "memory_gib": 48, "interconnect_gb_s": 32}
    )
    with pytest.raises(ValueError, match=r"GPU 'mine' has no price per GPU-hour.*prices="):
        plan_capacity(SMALL, light(1), targets={"ttft_p99_ms": 1}, gpus=[mine], tp=[1])
    plan = plan_light(gpus=[mine], tp=[1], prices={"mine": 1.5}, workers=1)
    assert plan.best is not None and math.isclose(plan.best.usd_per_hour, 1.5)


# ---------------------------------------------------------------- simsim plan


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


LIGHT_FLAGS = ("--model", SMALL, "--rate", "5", "--prompt", "100", "--output", "10")


def test_simsim_plan_prints_the_table_and_the_answer_and_draws_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = cli(
        capsys,
        *LIGHT_FLAGS,
        "--duration", "4",
        "--gpus", "H100,L4",
        "--tp", "1,4",
        "--e2e-p99", "60s",
        "--target", "ttft_mean=1min",
        "--price", "L4=0.5",
        "--workers", "1",
        "--plot", str(tmp_path / "plan.png"),
        "--table", str(tmp_path / "plan.csv"),
    )  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "targets: e2e_p99 <= 60.0 s, ttft_mean <= 60.0 s"
    assert lines[1].split()[:5] == ["gpu", "tp", "replicas", "GPUs", "$/hour"]
    assert lines[1].split()[-2:] == ["verdict", "reason"]
    assert "invalid tp  tp=4 does not divide" in out
    assert "cheapest (*): 1 L4 GPU (1 replica at tp=1), $0.50/hour" in out
    assert (tmp_path / "plan.png").stat().st_size > 0
    table = pd.read_csv(tmp_path / "plan.csv")
    assert list(table["verdict"]) == ["meets", "invalid tp", "meets", "invalid tp"]
    assert out.rstrip().endswith("not measured on hardware.")


def test_simsim_plan_says_when_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(
        capsys, "--model", BIG, "--rate", "1", "--prompt", "10", "--output", "10",
        "--gpus", "L4", "--tp", "1", "--ttft-p99", "2s", "--max-replicas", "3",
    )  # fmt: skip
    assert code == 0
    assert "does not fit" in out and "short by" in out
    assert "no configuration met the targets with at most 3 replicas" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--gpus", "H10"), "unknown GPU 'H10' (did you mean"),
        (("--tp", ""), "--tp: give a comma-separated list"),
        (("--tp", "1,,2"), "--tp: give a comma-separated list with no empty entry, got '1,,2'"),
        (("--tp", "1,x"), "--tp: expected whole numbers, got 'x'"),
        (("--ttft-p99", "fast"), "--ttft-p99: expected a time such as 2s or 100ms, got 'fast'"),
        (("--ttft-p99", "0s"), "--ttft-p99: must be a time above zero"),
        (("--target", "ttft_p99"), "--target: expected NAME=VALUE"),
        (("--target", "tpot_p99=1s"), "unknown metric 'tpot_p99_ms'"),
        (("--price", "A100=1"), "prices names 'A100', which is not among"),
        (("--rate", "0"), "--rate: must be a number of requests per second > 0"),
        (("--model", "meta-llama/Llama-9-1B"), "meta-llama/Llama-9-1B"),
    ],
)
def test_simsim_plan_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], message: str
) -> None:
    argv = dict(zip(LIGHT_FLAGS[::2], LIGHT_FLAGS[1::2], strict=True))
    argv |= {"--gpus": "H100", "--tp": "1", "--ttft-p99": "2s"}
    argv |= dict(zip(flags[::2], flags[1::2], strict=True))
    code, out, err = cli(capsys, *(item for pair in argv.items() for item in pair))
    assert code == 2
    assert out == ""
    assert err.startswith("simsim: error: ") and message in err
    assert err.count("\n") == 1


def test_simsim_plan_needs_a_target(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, *LIGHT_FLAGS, "--gpus", "H100", "--tp", "1")
    assert code == 2
    assert "give at least one target, e.g. --ttft-p99 2s" in err


def test_the_figure_has_one_column_per_pair_and_stars_the_answer() -> None:
    from simsim import plots

    plan = plan_light(gpus=["H100", "L4"], tp=[1, 4], workers=1)
    figure = plots.draw_plan(plan.table)
    (ax,) = figure.axes
    labels = [tick.get_text() for tick in ax.get_xticklabels()]
    assert labels == ["H100-SXM\ntp=1", "H100-SXM\ntp=4", "L4\ntp=1", "L4\ntp=4"]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend == ["meets", "invalid tp", "cheapest that meets the targets"]
    plots.plt.close(figure)


def test_the_answer_runs_again_as_planned() -> None:
    plan = plan_one_slot(targets={"e2e_p99_ms": 150}, gpus=["H100"], max_replicas=4, seed=3)
    assert (plan.router, plan.seed, plan.max_replicas) == ("round_robin", 3, 4)
    assert plan.best is not None
    price = 3 * simsim.gpu.load_gpu("H100").price_per_hour
    assert str(plan.best) == f"3 H100-SXM GPUs (3 replicas at tp=1), ${price:,.2f}/hour"
    deployment = plan.best.deployment()
    assert (deployment.replicas, deployment.router, deployment.gpus) == (3, "round_robin", 3)
    again = deployment.run(every_40_ms(), seed=3).metrics()
    assert again["e2e_p99_ms"] == plan.best.metrics["e2e_p99_ms"]


def test_progress_counts_every_run_and_ends_complete() -> None:
    calls: list[tuple[int, int]] = []
    plan = plan_one_slot(
        targets={"e2e_p99_ms": 150},
        gpus=["H100"],
        max_replicas=8,
        progress=lambda done, total: calls.append((done, total)),
    )
    runs = len(plan.table)
    assert calls[-1] == (runs, runs)
    assert all(done < total for done, total in calls[:-1])  # open-ended until the end
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_a_vllm_config_is_a_template_for_every_configuration() -> None:
    template = VllmConfig(SMALL, "L4", 1, max_num_seqs=1, coefficients=TEN_MS_STEPS)
    plan = plan_capacity(
        template,
        every_40_ms(),
        targets={"e2e_p99_ms": 150},
        gpus=["H100"],
        tp=[1],
        max_replicas=4,
        router="round_robin",
        workers=1,
    )
    # The template's one slot and 10 ms steps, on the plan's GPU: 3 replicas, as by hand.
    assert plan.best is not None
    assert (plan.best.gpu, plan.best.replicas) == ("H100-SXM", 3)
    assert plan.best.config.max_num_seqs == 1
    assert plan.best.config.coefficients == TEN_MS_STEPS


# ---------------------------------------------------------------- from a scenario file

PLAN_SCENARIO = """\
[scenario]
engine = "vllm"
seed = 5

[vllm]
model = "Qwen/Qwen2.5-0.5B-Instruct"
gpu = "L4"
max_num_seqs = 1

[backend]                  # every step costs 10 ms, nothing else costs anything
kind = "physics"
memory_scale = 0
compute_scale = 0
allreduce_scale = 0
per_step_us = 10000
per_layer_us = 0
per_sequence_us = 0
before_queue_us = 0
per_output_token_us = 0
at_completion_us = 0

[cluster]
replicas = 1
router = "round_robin"

[workload]
count = 60
arrivals = { process = "fixed", rate_per_s = 25.0 }
prompt_tokens = 16
output_tokens = 10

[gpus.mine]
bf16_tflops = 100
hbm_tb_s = 1
memory_gib = 48
interconnect_gb_s = 32
price_per_hour = 0.5

[plan]
gpus = ["H100", "mine"]
tp = [1, 4]
max_replicas = 4
targets = { e2e_p99_ms = 150 }
"""


def scenario_file(tmp_path: Path, text: str = PLAN_SCENARIO) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_scenario_file_gives_the_server_the_requests_and_the_plan(tmp_path: Path) -> None:
    plan = plan_from_file(scenario_file(tmp_path), workers=1)
    # The file's one slot, 10 ms steps, requests every 40 ms and round robin: 3 replicas
    # of either GPU, and the file's own GPU is the cheaper.
    assert plan.best is not None
    assert (plan.best.gpu, plan.best.tp, plan.best.replicas) == ("mine", 1, 3)
    assert plan.best.usd_per_hour == pytest.approx(1.5)
    assert (plan.router, plan.seed, plan.max_replicas) == ("round_robin", 5, 4)
    assert list(plan.configurations["status"]) == ["meets", "invalid tp", "meets", "invalid tp"]
    # Keywords (the command's flags) replace the [plan] table's keys.
    only = plan_from_file(scenario_file(tmp_path), gpus=["H100"], tp=[1], workers=1)
    assert only.best is not None and only.best.gpu == "H100-SXM"


def test_simsim_plan_reads_a_scenario_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = scenario_file(tmp_path)
    code, out, err = cli(capsys, str(path), "--workers", "1", "--e2e-p99", "90ms")
    assert code == 0, err
    assert out.splitlines()[0] == "targets: e2e_p99 <= 90.0 ms"
    assert "no configuration met the targets with at most 4 replicas" in out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('engine = "vllm"', 'engine = "batching"'), 'vllm: only for engine = "vllm"'),
        (("max_replicas = 4", 'max_replicas = "4"'), "plan.max_replicas: must be a whole"),
        (
            ("tp = [1, 4]", "tp = [1, 4]\nreplicas = 2"),
            "plan.replicas: unknown key (did you mean 'max_replicas'?)",
        ),
        (("targets = { e2e_p99_ms = 150 }", ""), "plan.targets: give at least one target"),
        (
            ('gpu = "L4"', 'gpu = "L4"\ntp = 4'),
            "vllm.tp: tp=4 does not divide Qwen/Qwen2.5-0.5B-Instruct's 14 attention heads (the "
            "scenario must run as it stands",
        ),
    ],
)
def test_a_bad_scenario_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = scenario_file(tmp_path, PLAN_SCENARIO.replace(*change))
    code, out, err = cli(capsys, str(path), "--workers", "1")
    assert code == 2 and out == ""
    assert err.startswith(f"simsim: error: {path}") and message in err
    assert err.count("\n") == 1


def test_a_scenario_file_leaves_no_room_for_workload_flags(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = cli(capsys, str(scenario_file(tmp_path)), "--rate", "5")
    assert code == 2
    assert "--rate: comes from the scenario file" in err


def test_simsim_plan_needs_a_vllm_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).parent.parent / "examples" / "scenarios" / "batching.toml"
    code, _, err = cli(capsys, str(path), "--ttft-p99", "1s")
    assert code == 2
    assert err == (
        f'simsim: error: {path}: scenario.engine: simsim plan needs engine = "vllm" with a '
        "[vllm] table (the model and its server's settings)\n"
    )


def test_simsim_plan_says_when_it_cannot_write_the_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no" / "such" / "plan.csv"
    code, out, err = cli(
        capsys, *LIGHT_FLAGS, "--duration", "2", "--gpus", "L4", "--tp", "1",
        "--ttft-p99", "1min", "--workers", "1", "--table", str(missing),
    )  # fmt: skip
    assert code == 1
    assert "cheapest (*): 1 L4 GPU" in out
    assert err.startswith(f"simsim: error: --table {missing}: cannot write it (")
    assert err.count("\n") == 1
