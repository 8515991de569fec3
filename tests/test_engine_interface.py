"""The engine's hooks are an interface: a server that forgets one cannot be built."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import EASY_CONFIG

import simsim
from simsim.engines.base import EngineBase
from simsim.request import Request

ENGINES = Path(simsim.__file__).parent / "engines"


class AdmitsNothing(EngineBase):
    """A server without _cancel_active and max_active_requests."""

    def _is_idle(self) -> bool:
        return True

    def _admit(self) -> None:
        return None


class Complete(AdmitsNothing):
    @property
    def max_active_requests(self) -> int:
        return 1

    def _cancel_active(self, request: Request, now: int) -> None:
        return None


def test_a_server_missing_a_hook_fails_at_construction_naming_it() -> None:
    backend = simsim.SimulatedBackend(EASY_CONFIG)
    with pytest.raises(TypeError, match=r"_cancel_active.*max_active_requests"):
        AdmitsNothing(backend, None, None)  # type: ignore[abstract]
    assert Complete(backend, None, None).has_pending_events is False


def test_every_hook_is_abstract() -> None:
    assert EngineBase.__abstractmethods__ == frozenset(
        {"_is_idle", "_admit", "_cancel_active", "max_active_requests"}
    )


@pytest.mark.parametrize("name", ["_queue", "_eid", "_processing", "_stopped_at"])
def test_engines_leave_simpy_internals_to_the_clock_and_the_event_class(name: str) -> None:
    # Only events.py (the engine's own event) may touch the heap directly; everything
    # else goes through simsim.Environment's methods.
    offenders = []
    for path in sorted(ENGINES.glob("*.py")):
        if path.name == "events.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == name:
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


PACKAGE = Path(simsim.__file__).parent

# The measured hot paths that read env._now directly, each with its benchmark figure in
# a comment (docs/performance.md, "Hot paths"): (module, function).
_HOT_PATHS = {
    ("engines/single_slot.py", "_on_decode_step"),  # once per token
    ("engines/fast_single_slot.py", "_on_work_done"),  # once per request: most of its time
    ("engines/base.py", "submit"),  # once per request, as the next three
    ("engines/base.py", "_enqueue_arrival"),
    ("engines/single_slot.py", "_admit"),
    ("engines/single_slot.py", "_finish"),
}


def _attribute_uses(name: str) -> list[str]:
    """Where simsim reads or writes an attribute *name*, outside clock.py, the engine's
    own event class and the commented hot paths: ``module:line``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module in ("clock.py", "engines/events.py"):
            continue
        tree = ast.parse(path.read_text())
        exempt: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (module, node.name) in _HOT_PATHS:
                exempt.update(id(inner) for inner in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == name and id(node) not in exempt:
                found.append(f"{module}:{node.lineno}")
    return found


@pytest.mark.parametrize("name", ["_now", "_ok", "_value"])
def test_simpy_event_state_and_the_clock_are_read_through_the_clock(name: str) -> None:
    # Events born processed, boundary events and scheduled events come from
    # simsim.clock's helpers; the time is env.now except on the measured hot paths.
    assert _attribute_uses(name) == []


def _private_reads(folder: str) -> list[str]:
    """Where code in simsim/*folder*/ reads a private name of an object other than
    ``self`` (or ``cls``): ``module:line name``."""
    found = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{folder}/{path.name}:{node.lineno} {name}")
    return found


@pytest.mark.parametrize("folder", ["cluster", "live"])
def test_clusters_and_the_live_layer_use_engines_through_public_names_and_the_port(
    folder: str,
) -> None:
    # A cluster drives its replicas as a user does, plus engine.replica_port; the live
    # layer serves any simsim.Server. Neither reaches into an engine's (or a request's)
    # private state.
    assert _private_reads(folder) == []
