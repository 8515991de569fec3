"""``dir(simsim)`` lists the public API only (issue 24, point 9)."""

from __future__ import annotations

import pytest

import simsim


def test_dir_lists_the_public_api_and_lazy_imports_still_work() -> None:
    names = set(dir(simsim))
    dunders = {name for name in names if name.startswith("__") and name.endswith("__")}
    assert names - dunders == set(simsim.__all__) - dunders
    assert {"__version__", "__doc__", "__name__"} <= names
    assert not names & {"ModuleType", "importlib", "engines", "results", "clock"}
    assert simsim.live.__name__ == "simsim.live"  # still imported on first use
    assert "live" not in dir(simsim)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        simsim.nothing  # noqa: B018
