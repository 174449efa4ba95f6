"""Sphinx configuration: the docs are Markdown (MyST), the API reference is autodoc.

Build with ``make docs`` (HTML with warnings as errors, then the examples as doctests).
"""

from __future__ import annotations

import sys
from pathlib import Path

# The package from this checkout, whether or not it is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery_redislock._version import __version__  # found through the path above

project = "celery-redislock"
author = "celery-redislock contributors"
copyright = "celery-redislock contributors"
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# "page.md#a-heading" links resolve, as they do on GitHub.
myst_heading_anchors = 4

# Autodoc: members in source order, as each module's __all__ lists them.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
# LockedTask derives from Celery's Task: document what this package writes, not Celery's own
# docstrings (they use Celery's Sphinx roles).
autodoc_inherit_docstrings = False

# Doctests: every ">>>" example in these pages and in the docstrings autodoc pulls in. Those
# that need a Redis or a Celery app carry "# doctest: +SKIP".
doctest_global_setup = """
import celery_redislock
from celery_redislock import *
"""

html_theme = "alabaster"
html_title = "celery-redislock"
