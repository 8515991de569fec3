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
