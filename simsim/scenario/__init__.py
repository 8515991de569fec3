"""Scenario files: a whole simulation described in TOML, checked before it runs.

A scenario names a cost model, a scheduler, the requests (listed inline, read from a
CSV trace, or generated from a seed) and cancellations at given times. Loading checks
every key and value and raises :class:`ScenarioError` naming the file, the key and the
rule at fault; nothing runs until the whole file is valid. See ``docs/scenarios.md``.

The package, one idea per module:

* ``checker``: reading TOML, :class:`TomlChecker` (typed look-ups, did-you-mean),
  :class:`ScenarioError` and :class:`ScenarioMemoryError` (out of memory, naming what
  was being made);
* ``model``: :class:`Scenario` and its parts (:class:`RequestSpec`,
  :class:`Cancellation`, :class:`BatchingSpec`, :class:`ClusterSpec` and its
  :class:`PoolSpec`, :class:`BackendSpec`, :class:`PhysicsBackendSpec`) and
  ``Server`` (the :class:`simsim.Server` protocol: an engine or a cluster);
* ``engine_kinds``: :data:`ENGINE_KINDS` (also :data:`ENGINE_BUILDERS`), the one
  registry of the engines a scenario can choose, each an :class:`EngineKind` record of
  what it can do;
* ``parse``: the document's tables into a :class:`Scenario`, with ``trace_table``
  (``[trace]``), ``workload_table`` (``[workload]``) and ``gpu_tables`` (``[vllm]``,
  ``[gpus.<name>]``, ``[backend] kind = "physics"``) beside it;
* ``run``: building the engine, checking what it refuses at submission, running it;
  ``defaults``: the built-in scenario.
"""

from __future__ import annotations

from simsim.scenario.checker import (
    ScenarioError,
    ScenarioMemoryError,
    TomlChecker,
    lost_allocation,
    out_of_memory_while,
    read_toml,
)
from simsim.scenario.defaults import default_scenario, default_serve_scenario
from simsim.scenario.engine_kinds import ENGINE_KINDS, EngineKind
from simsim.scenario.model import (
    ENGINE_BUILDERS,
    ENGINES,
    BackendSpec,
    BatchingSpec,
    Cancellation,
    ClusterSpec,
    PhysicsBackendSpec,
    PoolSpec,
    RequestSpec,
    Scenario,
    Server,
    Workload,
)
from simsim.scenario.parse import load_backend, load_scenario, parse_scenario
from simsim.scenario.run import check_scenario, run_scenario
from simsim.scenario.trace_table import read_trace_csv

__all__ = [
    "ENGINES",
    "ENGINE_BUILDERS",
    "ENGINE_KINDS",
    "BackendSpec",
    "BatchingSpec",
    "Cancellation",
    "ClusterSpec",
    "EngineKind",
    "PhysicsBackendSpec",
    "PoolSpec",
    "RequestSpec",
    "Scenario",
    "ScenarioError",
    "ScenarioMemoryError",
    "Server",
    "TomlChecker",
    "Workload",
    "check_scenario",
    "default_scenario",
    "default_serve_scenario",
    "load_backend",
    "load_scenario",
    "lost_allocation",
    "out_of_memory_while",
    "parse_scenario",
    "read_toml",
    "read_trace_csv",
    "run_scenario",
]
