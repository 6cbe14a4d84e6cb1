"""Sphinx configuration of the course's website (`make book`; src/dpc_maintainer/book.py stages the sources).

MyST-NB reads the committed notebooks and never executes them; every asset is served from the site
(MathJax's SVG build from the sphinx-mathjax-offline package), so pages work offline and over file://.
"""
from __future__ import annotations

import importlib
from pathlib import Path

project = "Data-parallel training on many devices"
author = "the dp-course authors"
copyright = "the dp-course authors"
extensions = ["myst_nb", "sphinx_copybutton"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
html_copy_source = False  # the staged copies are not the release's notebooks: book.py adds those (notebooks/)
html_show_sourcelink = False

# MyST-NB: the outputs are the committed ones.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "html_image"]
myst_heading_anchors = 3  # `[text](#a-heading)` links inside a notebook resolve
# A `%%writefile` cell of a shell script is shown without colours (its lexer is IPython's).
suppress_warnings = ["misc.highlighting_failure"]

# MathJax 3 (SVG output: one self-contained script, no font files) from the site itself.
_MATHJAX = Path(importlib.import_module("sphinx-mathjax-offline").__file__).parent / "static/mathjax/tex-svg-full.js"
html_static_path = ["_static", str(_MATHJAX)]
mathjax_path = "tex-svg-full.js"

html_theme = "sphinx_book_theme"
html_title = "Data-parallel training"
html_css_files = ["book.css"]
html_favicon = "_static/favicon.svg"  # a ring of four devices (and no 404 for /favicon.ico)
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": False,  # its links lead to _sources/, which is not shipped: each page has its own
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "navigation_with_keys": False,
    # the licences (LICENSE, LICENSE-CONTENT.md): on every page
    "extra_footer": "<p>Text and notebooks: CC BY 4.0; code: BSD-3-Clause.</p>",
}
html_context = {"default_mode": "auto"}  # light or dark as the reader's system is (the switch in the header)
