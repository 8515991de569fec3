"""inference-perf's workloads: staged constant-rate load and shared-prefix data.

Hand-computed arrival times and counts per stage, which requests share which KV blocks,
the scenario keys' one-line errors, and a scenario made from a row of the vLLM reference
set's ``train.csv`` (shortened) run by ``simsim run``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simsim.cli import main
from simsim.workloads import (
    Fixed,
    FixedRateArrivals,
    OpenLoopWorkload,
    SharedPrefixes,
    Stage,
    StagedArrivals,
    Uniform,
)

RNG = np.random.default_rng(0)

# ---------------------------------------------------------------- staged constant-rate load


def test_two_stages_run_back_to_back_one_request_every_period() -> None:
    # Stage 0: 5/s for 2 s (10 requests, every 200 ms); stage 1: 10/s for 1 s (10, every
    # 100 ms), from the end of stage 0. Each stage's first request comes one period after
    # the stage starts, its last at the stage's end.
    arrivals = StagedArrivals([(5.0, 2_000_000), (10.0, 1_000_000)])
    assert arrivals.count == 20
    times = arrivals.arrival_times_us(RNG, 20).tolist()
    assert times == [200_000 * k for k in range(1, 11)] + [
        2_000_000 + 100_000 * k for k in range(1, 11)
    ]
    assert arrivals.stage_indices(20) == [0] * 10 + [1] * 10
    assert arrivals.positions_in_stage(20) == list(range(10)) * 2
    assert arrivals.stage_starts_us(500) == [500, 2_000_500]
    assert arrivals.arrival_times_us(RNG, 3, start_us=7).tolist() == [200_007, 400_007, 600_007]


def test_a_stage_makes_rate_times_duration_requests() -> None:
    # train.csv's stage_expected_requests: rate x duration.
    assert Stage(5.0, 600_000_000).request_count == 3000
    assert Stage(10.0, 600_000_000).request_count == 6000
    assert StagedArrivals([Stage(8.0, 600_000_000), Stage(20.0, 600_000_000)]).count == 16_800
    assert Stage(0.3, 10_000_000).request_count == 3  # 0.3 * 10 is 2.9999... in binary
    assert Stage(2.5, 1_000_000).request_count == 2  # rounded down, as inference-perf does
    assert Stage(0.5, 1_000_000).request_count == 0


def test_a_period_that_is_no_whole_microsecond_is_rounded_once_per_request() -> None:
    # 3/s: 333,333.3 us apart, each time rounded from its exact offset (no drift).
    arrivals = StagedArrivals([(3.0, 1_000_000), (3.0, 1_000_000)])
    assert arrivals.arrival_times_us(RNG, 6).tolist() == [
        333_333,
        666_667,
        1_000_000,
        1_333_333,
        1_666_667,
        2_000_000,
    ]


def test_one_stage_is_fixed_rate_arrivals() -> None:
    staged = StagedArrivals([(7.0, 3_000_000)]).arrival_times_us(RNG, 21, start_us=11)
    fixed = FixedRateArrivals(7.0).arrival_times_us(RNG, 21, start_us=11)
    assert staged.tolist() == fixed.tolist()


@pytest.mark.parametrize(
    ("stages", "error", "message"),
    [
        ([], ValueError, "stages must hold at least one stage"),
        ([(0.0, 1_000_000)], ValueError, "stages[0]: rate_per_s must be a finite number > 0"),
        ([(1.0, 0)], ValueError, "stages[0]: duration_us must be >= 1 microsecond, got 0"),
        ([(1.0, 1.5)], TypeError, "stages[0]: duration_us"),
        ([(1.0,)], TypeError, "stages[0] must be a Stage or a (rate_per_s, duration_us) pair"),
        ("5,600", TypeError, "stages must be a sequence"),
        ([(1.0, 2**62), (1.0, 2**62)], OverflowError, "past the 64-bit limit"),
    ],
)
def test_bad_stages_are_refused_naming_the_stage(
    stages: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=None) as raised:
        StagedArrivals(stages)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_asking_for_more_requests_than_the_stages_make_is_an_error() -> None:
    arrivals = StagedArrivals([(5.0, 1_000_000)])
    with pytest.raises(ValueError, match=r"count must be at most 5, .* got 6"):
        arrivals.arrival_times_us(RNG, 6)
    with pytest.raises(ValueError, match=r"count must be at most 5, .* got 6"):
        OpenLoopWorkload(arrivals, Fixed(1), Fixed(1), 6)
    with pytest.raises(TypeError, match=r"only StagedArrivals, .* may leave it out\), got None"):
        OpenLoopWorkload(FixedRateArrivals(1.0), Fixed(1), Fixed(1))


def test_a_staged_workload_makes_every_stage_request_and_tags_its_stage() -> None:
    workload = OpenLoopWorkload(
        StagedArrivals([(5.0, 2_000_000), (10.0, 1_000_000)]), Fixed(8), Fixed(2)
    )
    assert workload.count == 20
    requests = workload.generate(0).requests
    assert [dict(r.tags or {}) for r in requests] == [{"stage": 0}] * 10 + [{"stage": 1}] * 10
    first = OpenLoopWorkload(workload.arrivals, Fixed(8), Fixed(2), 12).generate(0).requests
    assert first == requests[:12]


def test_other_arrivals_carry_no_stage_tag() -> None:
    requests = OpenLoopWorkload(FixedRateArrivals(5.0), Fixed(8), Fixed(2), 4).generate(0).requests
    assert all(r.tags is None and not r.has_metadata for r in requests)


# ---------------------------------------------------------------- shared-prefix data


def _data(users: int = 2, question: object = None) -> OpenLoopWorkload:
    # 2 system prompts of 40 tokens (2 full blocks of 16), 2 users each, questions of 20
    # tokens: each prompt is 60 tokens, 3 full blocks.
    return OpenLoopWorkload(
        StagedArrivals([(4.0, 2_000_000), (4.0, 1_000_000)]),
        Fixed(20) if question is None else question,  # type: ignore[arg-type]
        Fixed(5),
        shared_prefixes=SharedPrefixes([40, 40], 16, users_per_prefix=users),
    )


def test_users_take_turns_and_repeat_their_question() -> None:
    requests = _data().generate(3).requests
    assert len(requests) == 12  # 8 in stage 0, 4 in stage 1
    hashes = [r.block_hashes for r in requests]
    assert all(r.prompt_token_count == 60 for r in requests)
    assert all(len(keys or ()) == 3 for keys in hashes)
    users = [keys[2][0] for keys in hashes if keys]  # the block past the system prompt
    # Four users, each once per round of four requests, in one shuffled order.
    assert sorted(users[:4]) == ["u0", "u1", "u2", "u3"]
    assert users[4:8] == users[:4]
    # The turns start again with stage 1 (inference-perf numbers each stage from zero).
    assert users[8:] == users[:4]
    # A user's repeated prompt names the same blocks; users 0, 1 share system prompt 0's.
    for keys, user in zip(hashes, users, strict=True):
        group = int(user[1:]) // 2
        assert keys == ((f"g{group}", 0), (f"g{group}", 1), (user, 2))


def test_requests_share_exactly_the_full_blocks_inside_their_system_prompt() -> None:
    # A 100-token system prompt holds 6 full blocks of 16; the 7th block mixes in the
    # question, so it is the user's own.
    workload = OpenLoopWorkload(
        FixedRateArrivals(1.0),
        Fixed(466),
        Fixed(1),
        6,
        shared_prefixes=SharedPrefixes([100, 100, 100], 16, users_per_prefix=2),
    )
    requests = workload.generate(0).requests
    assert all(r.prompt_token_count == 566 for r in requests)
    blocks = [r.block_hashes or () for r in requests]
    assert all(len(keys) == 566 // 16 for keys in blocks)
    for a in blocks:
        for b in blocks:
            same_prompt = a[0] == b[0]
            assert (a[:6] == b[:6]) == same_prompt
            assert (a[6] == b[6]) == (a == b)  # the question ends all sharing between users


def test_a_user_asks_the_question_drawn_for_its_first_request() -> None:
    requests = _data(question=Uniform(1, 400)).generate(5).requests
    length_of: dict[object, int] = {}
    for request in requests:
        user = (request.block_hashes or ())[-1][0]
        assert length_of.setdefault(user, request.prompt_token_count) == request.prompt_token_count
    assert len(set(length_of.values())) > 1  # the users' questions differ


def test_the_same_seed_gives_the_same_turns_another_seed_another_order() -> None:
    assert _data().generate(3).requests == _data().generate(3).requests
    orders = {tuple(r.block_hashes for r in _data().generate(seed).requests) for seed in range(8)}
    assert len(orders) > 1


def test_users_per_prefix_takes_no_weights() -> None:
    with pytest.raises(ValueError, match="weights do not apply with users_per_prefix"):
        SharedPrefixes([10, 10], 16, weights=[1, 2], users_per_prefix=3)
    with pytest.raises(ValueError, match="users_per_prefix must be >= 1"):
        SharedPrefixes([10], 16, users_per_prefix=0)


# ---------------------------------------------------------------- scenario files

HEAD = """\
[scenario]
engine = "batching"
[backend]
prefill_base_us = 2000
prefill_per_token_us = 20
decode_base_us = 8000
decode_per_active_sequence_us = 100
[batching]
max_active_requests = 64
max_batch_tokens = 2048
policy = "mixed"
[kv_cache]
block_size_tokens = 16
total_blocks = 20000
[prefix_cache]
"""

# The workload columns of train.csv's case 154 (codegen), as the CSV writes them.
TRAIN_ROW = {
    "num_stages": "2",
    "all_stage_rates_rps": "5;10",
    "all_stage_durations_s": "600;600",
    "system_prompt_len": "100",
    "question_len": "466",
    "output_len": "247",
    "num_unique_system_prompts": "11",
    "num_users_per_system_prompt": "4",
    "enable_multi_turn_chat": "True",
    "ignore_eos": "True",
}


def workload_table(row: dict[str, str], shorten: float = 1.0) -> str:
    """The ``[workload]`` table of a train.csv row, every stage *shorten* times as long."""
    rates = row["all_stage_rates_rps"].split(";")
    durations = row["all_stage_durations_s"].split(";")
    assert len(rates) == len(durations) == int(row["num_stages"])
    stages = ", ".join(
        f"{{ rate_per_s = {float(rate)}, duration_s = {float(seconds) * shorten} }}"
        for rate, seconds in zip(rates, durations, strict=True)
    )
    keys = [
        'data = "shared_prefix"',
        f"arrivals = {{ process = 'staged', stages = [{stages}] }}",
    ]
    for key in (
        "num_unique_system_prompts",
        "num_users_per_system_prompt",
        "system_prompt_len",
        "question_len",
        "output_len",
    ):
        keys.append(f"{key} = {int(row[key])}")
    for key in ("ignore_eos", "enable_multi_turn_chat"):
        keys.append(f"{key} = {row[key].lower()}")
    return "[workload]\n" + "\n".join(keys) + "\n"


def run_requests(directory: Path, text: str) -> pd.DataFrame:
    """``simsim run`` a scenario of *text*; its requests table."""
    path = directory / "scenario.toml"
    path.write_text(text)
    assert main(["run", str(path), "--out", str(directory / "out")]) == 0
    return pd.read_csv(directory / "out" / "requests.csv")


def test_a_train_csv_row_runs_as_a_scenario_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 600 s stages shortened to 2 s: 10 requests at 5/s, then 20 at 10/s.
    path = tmp_path / "row.toml"
    path.write_text(HEAD + workload_table(TRAIN_ROW, shorten=2 / 600))
    assert main(["validate", str(path)]) == 0
    assert "30 requests" in capsys.readouterr().out
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 0
    requests = pd.read_csv(tmp_path / "out" / "requests.csv")
    assert (requests["state"] == "FINISHED").all()
    assert (requests["prompt_token_count"] == 566).all()
    assert (requests["generated_token_count"] == 247).all()  # ignore_eos: exactly output_len
    per_stage = requests.groupby("tag_stage")["arrival_time_us"].agg(["size", "min", "max"])
    assert per_stage.to_dict("index") == {
        0: {"size": 10, "min": 200_000, "max": 2_000_000},
        1: {"size": 20, "min": 2_100_000, "max": 4_000_000},
    }
    # 44 users take turns, from the first in every stage: stage 1's first 10 requests are
    # stage 0's 10 users again and find their whole prompt cached (35 full blocks); every
    # other request finds its system prompt's 6 full blocks, unless it is the first of it.
    cached = requests["cached_prompt_tokens"].tolist()
    assert cached[10:20] == [35 * 16] * 10
    assert cached[0] == 0
    assert set(cached[:10] + cached[20:]) == {0, 6 * 16}


def test_a_user_who_asks_again_finds_the_whole_prompt_cached(tmp_path: Path) -> None:
    # 1 system prompt, 2 users, 1 request per second: requests 2 and 3 repeat 0 and 1,
    # long after they finished, and find every full block of their 161-token prompt
    # cached (10 blocks); request 1 finds the system prompt's 6.
    body = (
        '[workload]\ndata = "shared_prefix"\nnum_unique_system_prompts = 1\n'
        "num_users_per_system_prompt = 2\nsystem_prompt_len = 100\nquestion_len = 61\n"
        "output_len = 4\narrivals = { process = 'staged', stages = [{ rate_per_s = 1, "
        "duration_us = 4_000_000 }] }\n"
    )
    requests = run_requests(tmp_path, HEAD + body)
    assert requests["cached_prompt_tokens"].tolist() == [0, 96, 160, 160]


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"arrivals": "{ process = 'staged' }"},
            "workload.arrivals.stages: missing required key (an array of { rate_per_s, "
            "duration_s })",
        ),
        (
            {"arrivals": "{ process = 'staged', stages = [] }"},
            "workload.arrivals.stages: must be a non-empty array of tables { rate_per_s = R, "
            "duration_s = D } (or duration_us), got []",
        ),
        (
            {"arrivals": "{ process = 'staged', stages = [{ rate_per_s = 0, duration_s = 2 }] }"},
            "workload.arrivals.stages[0].rate_per_s: must be a finite number > 0, got 0.0",
        ),
        (
            {"arrivals": "{ process = 'staged', stages = [{ rate_per_s = 1 }] }"},
            "workload.arrivals.stages[0]: give exactly one of duration_s and duration_us",
        ),
        (
            {"arrivals": "{ process = 'staged', stages = [{ rate_per_s = 1, duration_us = 0 }] }"},
            "workload.arrivals.stages[0].duration_us: must be >= 1 microsecond, got 0",
        ),
        (
            {"arrivals": "{ process = 'staged', stages = [{ rate_per_s = 1, duration_us = 1e0 }]}"},
            "workload.arrivals.stages[0].duration_us: must be an integer number of "
            "microseconds, got float 1.0 (write 1",
        ),
        (
            {"arrivals": "{ process = 'staged', stages = [{ rate = 1, duration_s = 2 }] }"},
            "workload.arrivals.stages[0].rate: unknown key",
        ),
        (
            {"arrivals": "{ process = 'staged', stages = [{ rate_per_s = 0.1, duration_s = 2 }] }"},
            "workload.arrivals.stages: make no request (rate x duration is below 1 in every stage)",
        ),
        (
            {"count": "31"},
            "workload.count: must be at most 30, the requests the stages make (rate x "
            "duration per stage), got 31 (leave count out to make them all)",
        ),
        ({"ignore_eos": "false"}, "workload.ignore_eos: must be true: simsim generates exactly"),
        ({"enable_multi_turn_chat": "1"}, "workload.enable_multi_turn_chat: must be true or false"),
        ({"num_unique_system_prompts": "0"}, "workload.num_unique_system_prompts: must be >= 1"),
        (
            {"num_users_per_system_prompt": "-2"},
            "workload.num_users_per_system_prompt: must be >= 1",
        ),
        ({"system_prompt_len": "100.0"}, "workload.system_prompt_len: must be an integer"),
        ({"data": "'sharedprefix'"}, "workload.data: unknown value 'sharedprefix' (did you mean"),
        ({"prompt_tokens": "10"}, "workload.prompt_tokens: unknown key"),
        ({"kind": "'closed_loop'"}, 'workload.kind: data = "shared_prefix" is open-loop traffic'),
    ],
)
def test_a_bad_key_is_one_line_naming_the_key_and_the_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, str], line: str
) -> None:
    table = workload_table(TRAIN_ROW, shorten=2 / 600)
    lines = table.splitlines()
    for key, value in change.items():
        lines = [item for item in lines if not item.startswith(f"{key} =")] + [f"{key} = {value}"]
    path = tmp_path / "bad.toml"
    path.write_text(HEAD + "\n".join(lines) + "\n")
    assert main(["validate", str(path)]) == 2
    error = capsys.readouterr().err.splitlines()
    assert len(error) == 1
    assert error[0].startswith(f"simsim: error: {path}: {line}")


def test_shared_prefix_data_needs_a_prefix_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "no_cache.toml"
    path.write_text(HEAD.replace("[prefix_cache]\n", "") + workload_table(TRAIN_ROW, 2 / 600))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        f'simsim: error: {path}: workload.data: needs engine = "batching" with [kv_cache] '
        "and [prefix_cache]"
    )


def test_staged_arrivals_are_no_class_of_a_mix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = (
        "[workload]\ntotal = 4\n[[workload.classes]]\nname = 'a'\nprompt_tokens = 1\n"
        "output_tokens = 1\narrivals = { process = 'staged', stages = [{ rate_per_s = 2, "
        "duration_s = 2 }] }\n"
    )
    path = tmp_path / "mix.toml"
    path.write_text(HEAD + body)
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        f'simsim: error: {path}: workload.classes[0] (a).arrivals: process = "staged" makes '
        "a [workload] of its own"
    )


def test_staged_arrivals_in_a_plain_open_loop_workload(tmp_path: Path) -> None:
    body = (
        "[workload]\nprompt_tokens = 32\noutput_tokens = 2\narrivals = { process = 'staged', "
        "stages = [{ rate_per_s = 2, duration_s = 1.5 }, { rate_per_s = 4, duration_us = "
        "1_000_000 }] }\n"
    )
    requests = run_requests(tmp_path, HEAD + body)
    # 2/s for 1.5 s: 3 requests, every 500 ms; then 4/s for 1 s: 4, every 250 ms.
    assert requests["arrival_time_us"].tolist() == [
        500_000,
        1_000_000,
        1_500_000,
        1_750_000,
        2_000_000,
        2_250_000,
        2_500_000,
    ]
    assert requests["tag_stage"].tolist() == [0, 0, 0, 1, 1, 1, 1]
