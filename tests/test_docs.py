"""The documentation builds: the Markdown guides and the generated API reference.

Sphinx runs with warnings as errors, so a broken cross-reference, a docstring that does
not parse or a guide missing from the table of contents fails the suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import simsim

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            str(DOCS),
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_every_guide_is_in_the_site(site: Path) -> None:
    guides = sorted(path.stem for path in DOCS.glob("*.md"))
    assert guides == sorted(path.stem for path in site.glob("*.html") if path.stem in guides)


MODULES = {"cluster", "run_folder", "sweeps", "traces", "workloads"}
OBJECTS = sorted(set(simsim.__all__) - MODULES - {"__version__"})


@pytest.mark.parametrize("name", OBJECTS)
def test_every_public_name_is_in_the_api_reference(site: Path, name: str) -> None:
    page = (site / "api.html").read_text(encoding="utf-8")
    assert f'id="simsim.{name}"' in page


@pytest.mark.parametrize("module", sorted(MODULES | {"scenario", "results"}))
def test_the_public_modules_have_sections(site: Path, module: str) -> None:
    page = (site / "api.html").read_text(encoding="utf-8")
    assert f'id="module-simsim.{module}"' in page
