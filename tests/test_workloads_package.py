"""The workloads package: one idea per module, imports pointing downward only."""

from __future__ import annotations

import ast
from pathlib import Path

import simsim.workloads

# Each module may import only the modules before it in this order (a lower floor).
_FLOORS = ("base", "arrivals", "lengths", "submission", "open_loop", "classes", "closed_loop")
_PACKAGE = Path(simsim.workloads.__file__).parent


def _workload_imports(module: str) -> set[str]:
    tree = ast.parse((_PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith("simsim.workloads."):
                found.add(node.module.removeprefix("simsim.workloads."))
            elif node.module == "simsim.workloads" or node.module == "simsim":
                found.update(
                    alias.name for alias in node.names if alias.name in (*_FLOORS, "workloads")
                )
    return found


def test_every_module_of_the_package_is_on_a_floor() -> None:
    modules = {path.stem for path in _PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(_FLOORS)


def test_each_module_imports_only_modules_below_it() -> None:
    for height, module in enumerate(_FLOORS):
        above = set(_FLOORS[height:]) | {"workloads"}
        assert not _workload_imports(module) & above, module


def test_the_package_still_offers_every_public_name_it_had_as_one_module() -> None:
    names = {
        "MAX_GENERATED_REQUESTS", "ArrivalProcess", "ClassMix", "ClosedLoopRun",
        "ClosedLoopSubmission", "ClosedLoopWorkload", "Empirical", "Exponential", "Fixed",
        "FixedRateArrivals", "GammaArrivals", "GeneratedWorkload", "LengthDistribution",
        "LogNormal", "OpenLoopWorkload", "PatienceDeadline", "PoissonArrivals", "RequestClass",
        "SharedPrefixes", "Uniform", "WorkloadEngine", "check_request_count", "check_seed",
    }  # fmt: skip
    assert names <= set(simsim.workloads.__all__)
    for name in names:
        value = getattr(simsim.workloads, name)
        home = getattr(value, "__module__", "simsim.workloads.base")
        assert home.startswith("simsim.workloads"), name
