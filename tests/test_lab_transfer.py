"""Labs test transfer, not recall: little of an answer can be pasted from the chapters (src/dpc_instructor/transfer.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from dpc_instructor import transfer

pytestmark = pytest.mark.gate  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]

SEEN = transfer.chapter_lines()


@pytest.mark.parametrize("lab", transfer.labs(), ids=lambda p: p.name)
def test_answers_are_not_in_the_chapters(lab):
    o = transfer.overlap(lab, SEEN)
    assert o.total >= 5, f"{lab.name}: only {o.total} answer lines: the lab asks too little to measure"
    assert o.share <= transfer.MAX_SHARE, (
        f"{lab.name}: {len(o.found)} of {o.total} answer lines ({o.share:.0%}) appear in a chapter: "
        + "; ".join(f"{c}: {line}" for line, c in o.found))
    assert o.longest_run <= transfer.MAX_RUN, (
        f"{lab.name}: {o.longest_run} consecutive answer lines can be pasted from a chapter: {o.run}")


def test_the_measure_sees_a_pasted_answer(tmp_path):
    """A lab whose answer is a chapter's code is caught (the check can fail)."""
    import json
    lab = tmp_path / "99-copy"
    lab.mkdir()
    lines = ["### BEGIN SOLUTION", "x = tf.constant(1.0)", "y = x + 1", "z = y * 2", "### END SOLUTION"]
    cell = {"cell_type": "code", "metadata": {}, "source": "\n".join(lines), "outputs": []}
    (lab / "copy.ipynb").write_text(json.dumps({"cells": [cell]}))
    o = transfer.overlap(lab, {"x = tf.constant(1.0)": "c", "y = x + 1": "c", "z = y * 2": "c"})
    assert (o.total, len(o.found), o.longest_run, o.ok) == (3, 3, 3, False)
