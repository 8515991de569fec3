"""One registry shape for every plug-in, and users' own plug-ins run from scenario files
(issue 25, point 3)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import pytest

import simsim
from simsim.backend import BACKENDS
from simsim.cluster import ROUTERS, ReplicaSnapshot
from simsim.registry import Registry
from simsim.scenario import ScenarioError, load_scenario, run_scenario
from simsim.scenario.model import SCHEDULER_OPTIONS, SEEDED_ROUTERS
from simsim.schedulers import SCHEDULERS, HeapScheduler, make_scheduler


class LongestPromptFirst(HeapScheduler):
    """Longest prompt first; ``bonus`` is an option a scenario may set."""

    def __init__(self, bonus: float = 0.0) -> None:
        super().__init__()
        self.bonus = bonus

    def order_key(self, item: simsim.QueuedRequest) -> int:
        return -item.prompt_token_count


class LastReplica:
    """Sends every request to the last replica; records its seed."""

    seeds: ClassVar[list[int]] = []

    def __init__(self, seed: int = 0) -> None:
        LastReplica.seeds.append(seed)

    def route(self, request: simsim.Request, replicas: Sequence[ReplicaSnapshot]) -> int:
        return len(replicas) - 1


def flat_backend(step_us: int, prefill_us: int = 0) -> simsim.Backend:
    """Every prefill costs *prefill_us*, every decode step *step_us*."""
    return simsim.SimulatedBackend(
        simsim.SimulatedBackendConfig(prefill_base_us=prefill_us, decode_base_us=step_us)
    )


@pytest.fixture
def plugins() -> Iterator[None]:
    """Register the plug-ins above for one test, and remove them after it."""
    simsim.register_scheduler("longest_prompt", LongestPromptFirst)
    simsim.register_router("last_replica", LastReplica)
    simsim.register_backend("flat", flat_backend)
    LastReplica.seeds.clear()
    try:
        yield
    finally:
        del SCHEDULERS["longest_prompt"]
        del ROUTERS["last_replica"]
        del BACKENDS["flat"]


REQUESTS = """
[[requests]]
request_id = 0
arrival_time_us = 0
prompt_token_count = 1
max_output_tokens = 1

[[requests]]
request_id = 1
arrival_time_us = 0
prompt_token_count = 5
max_output_tokens = 1

[[requests]]
request_id = 2
arrival_time_us = 0
prompt_token_count = 9
max_output_tokens = 1
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(text + REQUESTS, encoding="utf-8")
    return path


def test_a_registered_scheduler_runs_from_a_scenario_file(plugins: None, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[backend]\nprefill_base_us = 10\ndecode_base_us = 1\n\n"
        '[scheduler]\npolicy = "longest_prompt"\nbonus = 2\n',
    )
    scenario = load_scenario(path)
    assert scenario.scheduler_options == (("bonus", 2.0),)
    engine = run_scenario(scenario)
    admitted = [record.request_id for record in engine.admission_log]
    # All three arrive at 0 us and are queued before the first admission: longest first
    # (fcfs would admit 0, 1, 2).
    assert admitted == [2, 1, 0]


def test_a_registered_scheduler_takes_only_its_own_options(plugins: None, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[backend]\ndecode_base_us = 1\n\n[scheduler]\npolicy = "longest_prompt"\nbonux = 1\n',
    )
    with pytest.raises(
        ScenarioError, match=r"scheduler\.bonux: unknown key \(did you mean 'bonus'\?\)"
    ):
        load_scenario(path)


def test_a_registered_router_runs_from_a_cluster_table(plugins: None, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[scenario]\nseed = 5\n\n[backend]\ndecode_base_us = 1\n\n"
        '[cluster]\nreplicas = 3\nrouter = "last_replica"\n',
    )
    cluster = run_scenario(load_scenario(path))
    assert isinstance(cluster, simsim.Cluster)
    # It takes a seed, so it is seeded from the scenario's, like the built-in random ones
    # (the first call is the load's trial build, which reports a factory's own errors).
    assert LastReplica.seeds == [0, 5]
    served = [len(replica.requests) for replica in cluster.replicas]
    assert served == [0, 0, 3]


def test_a_registered_router_takes_a_seed_key_only_if_it_is_seeded(
    plugins: None, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        "[backend]\ndecode_base_us = 1\n\n"
        '[cluster]\nreplicas = 2\nrouter = "last_replica"\nseed = 9\n',
    )
    run_scenario(load_scenario(path))
    assert LastReplica.seeds == [9, 9]  # the load's trial build, then the run
    simsim.register_router("last_replica", lambda: LastReplica(), replace=True)
    with pytest.raises(ScenarioError, match=r"cluster\.seed: only for router 'random' or"):
        load_scenario(path)


def test_a_registered_backend_kind_runs_from_a_backend_table(plugins: None, tmp_path: Path) -> None:
    path = write(tmp_path, '[backend]\nkind = "flat"\nstep_us = 7\nprefill_us = 3\n')
    scenario = load_scenario(path)
    engine = run_scenario(scenario)
    assert isinstance(engine, simsim.SimulationEngine)
    finish = [engine.requests[i].finish_time_us for i in range(3)]
    assert finish == [10, 20, 30]  # 3 us of prefill and one 7 us decode step each


def test_a_registered_backend_kind_checks_its_keys_and_values(
    plugins: None, tmp_path: Path
) -> None:
    with pytest.raises(
        ScenarioError, match=r"backend\.step: unknown key \(did you mean 'step_us'\?\)"
    ):
        load_scenario(write(tmp_path, '[backend]\nkind = "flat"\nstep = 7\n'))
    with pytest.raises(ScenarioError, match=r"backend\.prefill_us: must be an integer"):
        load_scenario(write(tmp_path, '[backend]\nkind = "flat"\nstep_us = 1\nprefill_us = 0.5\n'))
    with pytest.raises(
        ScenarioError, match=r"backend\.kind: unknown value 'flta' \(did you mean 'flat'\?\)"
    ):
        load_scenario(write(tmp_path, '[backend]\nkind = "flta"\nstep_us = 1\n'))


def test_registering_a_taken_name_is_refused_unless_replacing() -> None:
    with pytest.raises(ValueError, match="scheduler policy 'fcfs' is already registered"):
        simsim.register_scheduler("fcfs", LongestPromptFirst)
    with pytest.raises(ValueError, match="router 'random' is already registered"):
        simsim.register_router("random", LastReplica)
    with pytest.raises(ValueError, match="backend kind 'fitted' is already registered"):
        simsim.register_backend("fitted", flat_backend)
    with pytest.raises(TypeError, match="must be callable"):
        simsim.register_scheduler("nothing", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a non-empty str"):
        simsim.register_router("", LastReplica)
    registry: Registry[type[LongestPromptFirst]] = Registry("thing")
    registry.register("a", LongestPromptFirst)
    registry.register("a", LongestPromptFirst, replace=True)
    assert list(registry) == ["a"]


def test_unknown_names_get_a_guess_everywhere() -> None:
    with pytest.raises(
        ValueError, match=r"unknown scheduler policy 'fcfss' \(did you mean 'fcfs'\?\)"
    ):
        make_scheduler("fcfss")
    with pytest.raises(ValueError, match=r"unknown router 'randon' \(did you mean 'random'\?\)"):
        simsim.cluster.make_router("randon")
    with pytest.raises(
        ValueError, match=r"unknown backend kind 'fited' \(did you mean 'fitted'\?\)"
    ):
        BACKENDS.build("fited")


def test_options_and_seeds_are_read_from_the_signatures() -> None:
    assert ROUTERS.options("random") == ("seed",)
    assert ROUTERS.seeded("power_of_two") and not ROUTERS.seeded("round_robin")
    assert SEEDED_ROUTERS == ("random", "power_of_two")
    assert SCHEDULER_OPTIONS["fair"] == ("prompt_weight", "output_weight")
    # A Python-only option (default None, a function) is not a scenario key.
    assert SCHEDULERS.options("shortest_job") == ("aging_per_s", "prompt_weight", "predict")
    assert SCHEDULER_OPTIONS["shortest_job"] == ("aging_per_s", "prompt_weight")
    assert BACKENDS.options("simulated") == tuple(
        simsim.SimulatedBackendConfig.__dataclass_fields__
    )
    with pytest.raises(TypeError, match="scheduler policy 'fcfs' has no option 'speed'"):
        make_scheduler("fcfs", speed=1)


def test_batching_policies_are_a_registry_of_records_with_one_error_shape() -> None:
    from simsim.engines.batching import POLICIES, BatchingPolicy

    assert isinstance(POLICIES, Registry)
    assert list(POLICIES) == ["prefill_first", "mixed"]
    assert all(isinstance(POLICIES[name], BatchingPolicy) for name in POLICIES)
    assert POLICIES["prefill_first"].token_cap_at_admission
    assert POLICIES["mixed"].needs_max_batch_tokens
    backend = simsim.SimulatedBackend(simsim.SimulatedBackendConfig(1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"unknown policy 'mixd' \(did you mean 'mixed'\?\)"):
        simsim.BatchingEngine(backend, max_active_requests=2, policy="mixd")
    with pytest.raises(ValueError, match="policy 'mixed' needs max_batch_tokens"):
        simsim.BatchingEngine(backend, max_active_requests=2, policy="mixed")
    engine = simsim.BatchingEngine(
        backend, max_active_requests=2, max_batch_tokens=4, policy="mixed"
    )
    assert engine.policy == "mixed"


def test_a_plug_in_that_raises_or_returns_none_is_a_scenario_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(**options: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setitem(simsim.schedulers.SCHEDULERS, "returns_none", lambda: None)
    monkeypatch.setitem(simsim.schedulers.SCHEDULERS, "raises", broken)
    monkeypatch.setitem(ROUTERS, "raises", broken)
    monkeypatch.setitem(BACKENDS, "raises", broken)
    cases = {
        '[scheduler]\npolicy = "returns_none"\n': (
            "scheduler.policy: the factory of 'returns_none' returned None, not a scheduler"
        ),
        '[scheduler]\npolicy = "raises"\n': (
            "scheduler: the plug-in factory test_a_plug_in_that_raises_or_returns_none_is_a_"
            "scenario_error.<locals>.broken raised RuntimeError: boom"
        ),
        '[cluster]\nreplicas = 2\nrouter = "raises"\n': "cluster.router: the plug-in factory",
    }
    for table, message in cases.items():
        path = write(tmp_path, "[backend]\ndecode_base_us = 1\n\n" + table)
        with pytest.raises(ScenarioError, match=re.escape(message)):
            load_scenario(path)
    path = write(tmp_path, '[backend]\nkind = "raises"\n')
    with pytest.raises(ScenarioError, match=r"backend: the plug-in factory .*RuntimeError: boom"):
        load_scenario(path)
