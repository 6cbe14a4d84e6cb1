"""The rhythm of the chapters (issue 21, item 6): measured by dpc_maintainer.rhythm, held to today's
figures, or the targets where those are met (they may shrink, never grow past both), while the chapters
are brought to the targets."""
from __future__ import annotations

import pytest

from dpc_maintainer import rhythm

pytestmark = pytest.mark.gate  # tests/tiers.py

# (longest code cell, longest worker script, most words in a markdown cell, share of code cells
# right after a code cell, test markers and record() calls in what students read), measured on
# 2026-11-25 with `python -m dpc_maintainer.rhythm`. Lower one when a chapter improves.
KEYS = ("code_max", "script_max", "words_max", "code_after_code", "machinery")
TODAY = {
    "course/00-setup-and-devices.ipynb": (18, 14, 190, 0.0, 0),
    "course/01-why-several-devices.ipynb": (23, 0, 200, 0.0, 0),
    "course/02-mirrored-strategy.ipynb": (24, 0, 197, 0.0, 0),
    "course/03-tf1-to-tf2.ipynb": (29, 0, 184, 0.0, 0),
    "course/04-manual-towers.ipynb": (25, 0, 198, 0.0, 0),
    "course/05-ring-allreduce.ipynb": (21, 19, 189, 0.0, 0),
    "course/06-horovod.ipynb": (25, 87, 188, 0.0, 0),
    "course/07-ddp-syncbn.ipynb": (22, 100, 196, 0.0, 0),
    "course/08-scaling-up.ipynb": (27, 19, 197, 0.0, 0),
    "course/09-sharding.ipynb": (22, 95, 200, 0.0, 0),
    "course/10-failures.ipynb": (23, 99, 196, 0.0, 0),
    "course/11-inside-ddp.ipynb": (18, 73, 199, 0.0, 0),
}


def test_no_chapter_reads_worse_than_today():
    now = rhythm.chapters()
    assert set(now) == set(TODAY), "a chapter was added or renamed: measure it and add its figures"
    worse = []
    for path, r in now.items():
        figures = (r.code_max, r.script_max, r.words_max, r.code_after_code, r.machinery)
        names = ("longest code cell", "longest script", "words in a markdown cell",
                 "code cells right after code", "test machinery")
        # Today's figure, or the target where today's is already within it (new cells may use the room).
        limits = [max(t, rhythm.TARGETS.get(key, t)) for key, t in zip(KEYS, TODAY[path])]
        worse += [f"{path}: {n} {v} > {lim}" for n, v, lim in zip(names, figures, limits) if v > lim]
    assert not worse, "\n".join(worse)


def test_the_figures_of_a_small_notebook():
    md = {"cell_type": "markdown", "source": "Train one step and print the loss:"}
    nb = {"cells": [
        md,
        {"cell_type": "code", "source": ["x = 1\n", "\n", "y = 2\n", "record('x', x)"]},
        {"cell_type": "code", "source": "# NBVAL_CHECK_OUTPUT\nprint(x)"},
        {"cell_type": "code", "source": "# the same, twice\nprint(y)"},
        md,
        {"cell_type": "code", "source": "%%writefile w.py\nimport os\nprint(os.getpid())\n"},
    ]}
    r = rhythm.measure(nb)
    assert (r.code_median, r.code_max, r.script_max) == (2, 3, 2)
    assert (r.words_median, r.words_max) == (7, 7)
    assert r.code_after_code == 0.25  # the marker is no sentence; the comment is one
    assert r.machinery == 2
