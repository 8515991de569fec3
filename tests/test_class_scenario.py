"""Request classes in scenario files, ``[scheduler]`` policies, sweeps over both, and the
per-class lines of ``simsim run``.

Hand-worked costs: prefill = 100 + 2 * prompt tokens, decode step = 10 (microseconds).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from simsim.cli import main
from simsim.scenario import ScenarioError, load_scenario, run_scenario
from simsim.sweeps.grid import apply_settings
from simsim.sweeps.spec import load_sweep
from simsim.sweeps.sweep_file import run_sweep
from simsim.workloads import ClassMix, PoissonArrivals, Uniform

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"

BACKEND = """
[backend]                   # the costs left out are 0
prefill_base_us = 100
prefill_per_token_us = 2
decode_base_us = 10
"""

CLASSES = """
[workload]
{mix}
[[workload.classes]]
name = "chat"
rate_per_s = 50.0
prompt_tokens = [10, 100]
output_tokens = [1, 20]
tenant = "app"
priority = -1
relative_deadline_us = 300_000
ttft_slo_us = 1_000
tpot_slo_us = 10.5
{chat}
[[workload.classes]]
name = "batch"
arrivals = {{ process = "gamma", rate_per_s = 10.0, cv = 2.0 }}
prompt_tokens = {{ distribution = "fixed", value = 500 }}
output_tokens = 30
priority = 2
tags = {{ job = "nightly", shard = 3, urgent = false }}
{batch}
"""


def scenario_text(
    mix: str = "", chat: str = "count = 30", batch: str = "count = 8", head: str = ""
) -> str:
    return f"[scenario]\nseed = 4\n{head}\n{BACKEND}" + CLASSES.format(
        mix=mix, chat=chat, batch=batch
    )


def write(directory: Path, text: str, name: str = "scenario.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    return str(caught.value)


# ---------------------------------------------------------------------- classes


def test_workload_classes_become_a_class_mix(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, scenario_text()))
    mix = scenario.workload
    assert isinstance(mix, ClassMix)
    chat, batch = mix.classes
    assert (chat.name, chat.tenant, chat.priority, chat.relative_deadline_us) == (
        "chat",
        "app",
        -1,
        300_000,
    )
    assert chat.arrivals == PoissonArrivals(50.0)
    assert chat.prompt_tokens == Uniform(10, 100)
    assert dict(batch.tags or {}) == {"job": "nightly", "shard": 3, "urgent": False}
    assert scenario.slo_targets() == {"chat": (1000.0, 10.5)}
    specs = scenario.all_requests()
    assert len(specs) == 38
    assert [spec.request_id for spec in specs] == list(range(38))
    assert [spec.arrival_time_us for spec in specs] == sorted(s.arrival_time_us for s in specs)


def test_a_class_mix_runs_and_its_frame_carries_the_metadata(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, scenario_text()))
    frame = run_scenario(scenario).requests_frame()
    assert (frame["state"] == "FINISHED").all()
    chat = frame[frame["request_class"] == "chat"]
    assert len(chat) == 30
    assert (chat["tenant"] == "app").all() and (chat["priority"] == -1).all()
    assert (chat["deadline_us"] == chat["arrival_time_us"] + 300_000).all()
    batch = frame[frame["request_class"] == "batch"]
    assert (batch["tag_job"] == "nightly").all() and batch["deadline_us"].isna().all()
    assert (batch["prompt_token_count"] == 500).all()


def test_a_total_is_split_among_the_classes(tmp_path: Path) -> None:
    text = scenario_text(mix="total = 60", chat="", batch="")
    mix = load_scenario(write(tmp_path, text)).workload
    assert isinstance(mix, ClassMix)
    assert mix.counts() == [50, 10]  # by arrival rate, 50:10
    text = scenario_text(mix="total = 60", chat="share = 1", batch="share = 2")
    mix = load_scenario(write(tmp_path, text)).workload
    assert isinstance(mix, ClassMix)
    assert mix.counts() == [20, 40]


def test_requests_may_carry_metadata(tmp_path: Path) -> None:
    text = f"""{BACKEND}
[[requests]]
request_id = 0
arrival_time_us = 0
prompt_token_count = 4
max_output_tokens = 2
request_class = "chat"
tenant = "t1"
priority = -5
deadline_us = 1_000
tags = {{ user = "ann", turn = 2 }}
[[requests]]
request_id = 1
arrival_time_us = 0
prompt_token_count = 4
max_output_tokens = 2
"""
    frame = run_scenario(load_scenario(write(tmp_path, text))).requests_frame()
    first, second = frame.iloc[0], frame.iloc[1]
    assert (first["request_class"], first["tenant"], first["priority"]) == ("chat", "t1", -5)
    assert (first["deadline_us"], first["tag_user"], first["tag_turn"]) == (1000, "ann", 2)
    assert second["priority"] == 0 and second["request_class"] is not None
    assert frame["request_class"].isna().tolist() == [False, True]


BAD_CLASSES = [
    # (text to replace in scenario_text(), its replacement, the key named, the rule)
    pytest.param(
        "count = 30",
        "count = 30\nnmae = 'x'",
        "workload.classes[0] (chat).nmae",
        "unknown key (did you mean 'name'?)",
        id="unknown-class-key",
    ),
    pytest.param(
        "[workload]",
        "[workload]\ntotal = 10",
        "workload.classes[0] (chat).count",
        "the workload has total = 10",
        id="count-with-total",
    ),
    pytest.param(
        "count = 30",
        "",
        "workload.classes[0] (chat).count",
        "missing: give every class a count",
        id="no-count-no-total",
    ),
    pytest.param(
        "count = 30",
        "count = 3\nshare = 2",
        "workload.classes[0] (chat).share",
        "needs [workload] total",
        id="share-without-total",
    ),
    pytest.param(
        "count = 30",
        "count = 3\npatience_us = { distribution = 'exponential' }",
        "workload.classes[0] (chat).patience_us.mean",
        "missing required key",
        id="bad-patience",
    ),
    pytest.param(
        "shard = 3",
        "shard = 2024-01-01",
        "workload.classes[1] (batch).tags.shard",
        "a tag must be a string, integer, float or boolean",
        id="bad-tag",
    ),
    pytest.param(
        "priority = -1",
        "priority = 1.5",
        "workload.classes[0] (chat).priority",
        "must be an integer, got float",
        id="float-priority",
    ),
    pytest.param(
        "relative_deadline_us = 300_000",
        "relative_deadline_us = -1",
        "workload.classes[0] (chat).relative_deadline_us",
        "must be >= 0 microseconds",
        id="negative-deadline",
    ),
    pytest.param(
        'tenant = "app"',
        'tenant = ""',
        "workload.classes[0] (chat).tenant",
        "must be a non-empty string",
        id="empty-tenant",
    ),
    pytest.param(
        "rate_per_s = 50.0",
        "rate_per_s = -1.0",
        "workload.classes[0] (chat).rate_per_s",
        "must be a finite number > 0, got -1.0",
        id="negative-rate",
    ),
    pytest.param(
        "[workload]",
        "[workload]\nkind = 'closed_loop'",
        "workload.kind",
        "[[workload.classes]] describe open-loop traffic",
        id="closed-loop-classes",
    ),
    pytest.param(
        'name = "batch"',
        'name = "chat"',
        "workload.classes[1].name",
        "'chat' is also the name of workload.classes[0]; class names must be unique",
        id="name-twice",
    ),
]


@pytest.mark.parametrize(("old", "new", "key", "rule"), BAD_CLASSES)
def test_bad_classes_name_the_file_the_class_and_the_rule(
    tmp_path: Path, old: str, new: str, key: str, rule: str
) -> None:
    text = scenario_text()
    assert old in text
    path = write(tmp_path, text.replace(old, new, 1))
    message = load_error(path)
    assert message.startswith(f"{path}: {key}: "), message
    assert rule in message, message


def test_an_empty_class_list_is_refused(tmp_path: Path) -> None:
    text = f"{BACKEND}\n[workload]\nclasses = []\n"
    assert "needs at least one [[workload.classes]] table" in load_error(write(tmp_path, text))


# ---------------------------------------------------------------------- sweeps


def test_sweep_settings_reach_a_class_by_its_name() -> None:
    document: dict[str, Any] = {
        "workload": {"classes": [{"name": "chat", "count": 1}, {"name": "batch", "count": 2}]}
    }
    changed = apply_settings(document, {"workload.classes.batch.count": 9})
    assert changed["workload"]["classes"] == [
        {"name": "chat", "count": 1},
        {"name": "batch", "count": 9},
    ]
    assert document["workload"]["classes"][1]["count"] == 2  # a copy was changed
    with pytest.raises(ValueError, match="has no entry named 'bulk'"):
        apply_settings(document, {"workload.classes.bulk.count": 9})
    with pytest.raises(ValueError, match="names a whole entry"):
        apply_settings(document, {"workload.classes.batch": 9})


# ---------------------------------------------------------------------- admission


ADMISSION = """
[admission]
key = "{key}"
[admission.limits.batch]
max_queued = 1
[admission.limits."*"]
rate_per_s = 20.0
burst = 2
"""


def test_admission_limits_reject_at_arrival_per_class(tmp_path: Path) -> None:
    # Batch jobs of 3000 tokens (30 ms each) in bursts: some find one already queued.
    text = scenario_text().replace("output_tokens = 30", "output_tokens = 3000")
    scenario = load_scenario(write(tmp_path, text + ADMISSION.format(key="class")))
    assert scenario.admission is not None
    assert scenario.admission.key == "class"
    assert scenario.admission.limits["batch"].max_queued == 1
    assert scenario.admission.limits["*"].burst == 2
    frame = run_scenario(scenario).requests_frame()
    rejected = frame[frame["rejection"].notna()]
    assert set(rejected["state"]) == {"CANCELLED"}
    reasons = {
        str(name): set(group) for name, group in rejected.groupby("request_class")["rejection"]
    }
    # chat (30 at 50/s) outruns its 20/s bucket; batch has a queue limit only.
    assert reasons == {"chat": {"rate_limited"}, "batch": {"queue_full"}}
    assert len(frame) == 38  # rejected requests are kept, never lost


def test_a_cluster_checks_admission_once_before_routing(tmp_path: Path) -> None:
    cluster = "\n[cluster]\nreplicas = 2\n"
    by_tenant = (
        '\n[admission]\nkey = "tenant"\n[admission.limits."*"]\nrate_per_s = 20.0\nburst = 2\n'
    )
    text = scenario_text() + by_tenant + cluster
    frame = run_scenario(load_scenario(write(tmp_path, text))).requests_frame()
    rejected = frame[frame["rejection"].notna()]
    assert len(rejected) > 0
    assert rejected["replica"].isna().all()  # never routed
    # By tenant: chat's tenant "app" and the tenant-less batch each fall under "*".
    assert set(rejected["rejection"]) == {"rate_limited"}


# ---------------------------------------------------------------------- bad tables


@pytest.mark.parametrize(
    ("table", "key", "rule"),
    [
        (
            '[admission]\nkey = "user"\n[admission.limits.a]\nmax_queued = 1',
            "admission.key",
            "unknown value 'user'",
        ),
        ("[admission]\n", "admission.limits", "missing: give a limit per class"),
        (
            "[admission.limits.batch]\nmax_queue = 1",
            "admission.limits.batch.max_queue",
            "did you mean 'max_queued'?",
        ),
        (
            "[admission.limits.batch]\nburst = 3",
            "admission.limits.batch",
            "burst=3 without rate_per_s",
        ),
        ("[admission.limits]\nbatch = 3", "admission.limits.batch", "must be a table"),
        (
            "[admission.limits.bacth]\nmax_queued = 1",
            "admission.limits.bacth",
            "no request of this scenario has request_class 'bacth' (did you mean 'batch'?)",
        ),
        (
            '[admission]\nkey = "tenant"\n[admission.limits.batch]\nmax_queued = 1',
            "admission.limits.batch",
            "no request of this scenario has tenant 'batch'",
        ),
        ("[admission.limits.batch]\nmax_queued = 0", "admission.limits.batch.max_queued", ">= 1"),
        ("[admission.limits.batch]\nmax_queued = -1", "admission.limits.batch.max_queued", ">= 1"),
        (
            "[scheduler]\naging_per_s = 1.0",
            "scheduler.aging_per_s",
            "policy 'fcfs' takes no options; aging_per_s is an option of shortest_prompt, "
            "shortest_job",
        ),
        ('[scheduler]\npolicy = "sjf"', "scheduler.policy", "unknown value 'sjf'"),
        ('[scheduler]\npolicy = "fcfs"\nweight = 2', "scheduler.weight", "unknown key"),
        (
            '[scheduler]\npolicy = "fair"\nprompt_weight = 0\noutput_weight = 0',
            "scheduler",
            "prompt_weight=0.0 and output_weight=0.0: at least one weight must be above 0",
        ),
        (
            '[scheduler]\npolicy = "fair"\nprompt_weight = -1',
            "scheduler.prompt_weight",
            "must be a finite number >= 0, got -1.0",
        ),
        (
            '[admission.limits."*"]\nrate_per_s = -1.0',
            "admission.limits.*.rate_per_s",
            "must be >= 0 requests per second, got -1.0",
        ),
    ],
)
def test_bad_admission_and_scheduler_tables_are_named(
    tmp_path: Path, table: str, key: str, rule: str
) -> None:
    path = write(tmp_path, f"{scenario_text()}\n{table}\n")
    message = load_error(path)
    assert message.startswith(f"{path}: {key}: "), message
    assert rule in message, message


# ---------------------------------------------------------------------- simsim run


def test_run_prints_a_line_per_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, scenario_text() + ADMISSION.format(key="class"))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    lines = {line.split()[0]: line for line in printed.splitlines() if line}
    assert lines["per"].split() == [
        "per", "class", "requests", "rejected", "p50", "TTFT", "p99", "TTFT", "p99", "e2e",
        "SLO", "attained",
    ]  # fmt: skip
    assert re.search(r"\bchat +30 +\d+ .*% \(within TTFT 1\.0 ms, TPOT 0\.011 ms\)$", lines["chat"])
    assert re.search(r"\bbatch +8 +\d+ .* n/a \(no target\)$", lines["batch"])


def test_run_without_classes_prints_no_class_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = "count = 3\nrate_per_s = 5.0\nprompt_tokens = 4\noutput_tokens = 2"
    text = f"{BACKEND}\n[workload]\n{workload}\n"
    assert main(["run", str(write(tmp_path, text)), "--out", str(tmp_path / "out")]) == 0
    assert "per class" not in capsys.readouterr().out


def test_the_classes_example_prints_its_golden_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As tests/test_examples.py checks its CLI examples: the report is a contract.
    monkeypatch.chdir(ROOT)  # the report names the file as given: examples/...
    out = tmp_path / "out"
    assert main(["run", "examples/scenarios/classes.toml", "--out", str(out)]) == 0
    printed = re.sub(r"in \d+\.\d\d s of wall time", "in X s of wall time", capsys.readouterr().out)
    assert printed.replace(str(out), "OUT") == (GOLDEN / "scenarios" / "classes.txt").read_text()


# ---------------------------------------------------------------------- policies at work


def test_each_policy_builds_its_own_scheduler_per_replica(tmp_path: Path) -> None:
    text = scenario_text() + '\n[scheduler]\npolicy = "shortest_job"\naging_per_s = 2.5\n'
    scenario = load_scenario(write(tmp_path, text + "\n[cluster]\nreplicas = 2\n"))
    assert (scenario.scheduler, scenario.scheduler_options) == (
        "shortest_job",
        (("aging_per_s", 2.5),),
    )
    first, second = (scenario.build_scheduler() for _ in range(2))
    assert type(first).__name__ == "ShortestJobFirstScheduler" and first is not second


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        # Four requests queue behind request 0 on one slot; each policy picks its own way.
        ("fcfs", [0, 1, 2, 3, 4]),
        ("priority", [0, 3, 2, 4, 1]),  # priority -2, then -1 twice (by arrival), then 5
        ("shortest_prompt", [0, 4, 3, 2, 1]),  # prompts 10, 20, 30, 40
        ("edf", [0, 2, 4, 1, 3]),  # deadlines 500, 900, none, none (then arrival)
    ],
)
def test_the_scheduler_policy_orders_admissions(
    tmp_path: Path, policy: str, order: list[int]
) -> None:
    rows = [
        # id, prompt, priority, deadline
        (0, 5, 0, None),
        (1, 40, 5, None),
        (2, 30, -1, 500),
        (3, 20, -2, None),
        (4, 10, -1, 900),
    ]
    text = BACKEND + f'\n[scheduler]\npolicy = "{policy}"\n'
    for rid, prompt, priority, deadline in rows:
        text += (
            f"\n[[requests]]\nrequest_id = {rid}\narrival_time_us = {rid}\n"
            f"prompt_token_count = {prompt}\nmax_output_tokens = 2\npriority = {priority}\n"
        )
        if deadline is not None:
            text += f"deadline_us = {deadline}\n"
    engine = run_scenario(load_scenario(write(tmp_path, text)))
    assert engine.admissions_frame()["request_id"].tolist() == order


def test_a_sweep_varies_the_policy_and_a_class_by_name(tmp_path: Path) -> None:
    write(tmp_path, scenario_text(chat="count = 12", batch="count = 4"), "classes.toml")
    sweep_file = write(
        tmp_path,
        '[sweep]\nscenario = "classes.toml"\nreplications = 1\n'
        '[grid]\n"scheduler.policy" = ["fcfs", "priority"]\n'
        "[grid.workload.classes.batch]\ncount = [2, 6]\n",
        "sweep.toml",
    )
    spec = load_sweep(sweep_file)
    result, _ = run_sweep(spec, out=tmp_path / "out", workers=1)
    runs = result.runs
    assert sorted(
        zip(runs["scheduler.policy"], runs["workload.classes.batch.count"], strict=True)
    ) == [
        ("fcfs", 2),
        ("fcfs", 6),
        ("priority", 2),
        ("priority", 6),
    ]
    assert sorted(runs["requests"]) == [14, 14, 18, 18]


def test_a_sweep_naming_a_missing_class_is_refused_before_running(tmp_path: Path) -> None:
    write(tmp_path, scenario_text(), "classes.toml")
    sweep_file = write(
        tmp_path,
        '[sweep]\nscenario = "classes.toml"\n[grid]\n"workload.classes.bulk.count" = [1, 2]\n',
        "sweep.toml",
    )
    with pytest.raises(ScenarioError, match=r"'workload\.classes' has no entry named 'bulk'"):
        load_sweep(sweep_file)


def test_the_scenario_options_of_each_policy_are_its_schedulers_options() -> None:
    from simsim.scenario.model import SCHEDULER_OPTIONS
    from simsim.schedulers import SCHEDULERS, make_scheduler

    assert set(SCHEDULERS) <= set(SCHEDULER_OPTIONS)  # a new policy is named in files too
    for name in SCHEDULERS:
        make_scheduler(name, **dict.fromkeys(SCHEDULER_OPTIONS[name], 1.0))
