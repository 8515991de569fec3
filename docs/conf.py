"""Sphinx configuration: the Markdown guides in this folder plus the API reference.

Build it with ``python -m sphinx -W -b html docs docs/_build`` (``pip install
'.[docs]'``); ``tests/test_docs.py`` builds it on every test run, warnings as errors.
"""

project = "simsim"
author = "The simsim developers"
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
myst_heading_anchors = 3
html_theme = "alabaster"
