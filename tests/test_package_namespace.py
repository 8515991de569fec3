"""``dir(simsim)`` lists the public API only (issue 24, point 9)."""

from __future__ import annotations

import types

import pytest

import simsim


def test_dir_lists_the_public_api_and_lazy_imports_still_work() -> None:
    names = set(dir(simsim))
    dunders = {name for name in names if name.startswith("__") and name.endswith("__")}
    # The public API and the modules the guides use as simsim.<name> (a new user's trial
    # found simsim.schedulers and simsim.results missing from the listing).
    documented = {"admission", "gpu", "results", "scenario", "schedulers"}
    assert names - dunders == (set(simsim.__all__) | documented) - dunders
    assert all(isinstance(getattr(simsim, name), types.ModuleType) for name in documented)
    assert {"__version__", "__doc__", "__name__"} <= names
    assert not names & {"ModuleType", "importlib", "engines", "clock", "wording", "errors"}
    assert simsim.live.__name__ == "simsim.live"  # still imported on first use
    assert "live" not in dir(simsim)
    live = set(dir(simsim.live))
    assert live - {n for n in live if n.startswith("__")} == set(simsim.live.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        simsim.nothing  # noqa: B018
