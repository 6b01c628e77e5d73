"""Sphinx configuration of the polymux documentation (``scripts/docs`` builds it).

The pages are Markdown (MyST); the API reference comes from the docstrings (autodoc +
napoleon, Google style), the CLI reference from the argparse parsers and the defaults
table from ``SessionConfig`` (``_ext/polymux_docs.py``). Warnings are errors in CI, and
``nitpicky`` makes every reference to a polymux object that does not resolve one of them.
"""

from __future__ import annotations

import sys
from pathlib import Path


DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent / "src"))

import polymux


project = "polymux"
author = "the polymux authors"
copyright = "the polymux authors"
release = version = polymux.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "polymux_docs",
]

smartquotes = False  # "--total" must stay two hyphens, not become a dash
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "demo.cast", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"polymux {release}"
html_static_path: list[str] = []
html_extra_path = ["demo.cast"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Every reference to a polymux name must resolve. References to the standard library and
# to third-party packages (asyncio.StreamReader, anyio, pyarrow ...) cannot: there is no
# network for intersphinx inventories, so they are ignored by name, never by silencing
# the whole check.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(?!polymux\b).*"),
    (r"py:.*", r"polymux\._types\..*"),  # type aliases shown by their private home
    (r"py:class", r"polymux\.aio\.session\.MuxProtocol"),  # the protocol behind a Session: internal
    # The internals a public signature names: the reader of a channel, the sans-I/O core and its events.
    (r"py:class", r"polymux\.aio\.reader\.ChannelStreamReader"),
    (r"py:class", r"polymux\.session\.(SessionCore|events\.\w+)"),
    (r"py:class", r"polymux\.apps\.common\.T"),  # a TypeVar
    (r"py:.*", r"polymux\.engine\.base\.R"),  # a TypeVar (an engine's record type)
]
suppress_warnings = ["myst.header"]
