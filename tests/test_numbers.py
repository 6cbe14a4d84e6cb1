"""A notebook says what it measured (issue 21, item 2): no measured-looking number in the prose of a
chapter, solution or lab that its own cells did not print (dpc_maintainer.numbers)."""
from __future__ import annotations

import json

import pytest

from dpc_maintainer import numbers

pytestmark = pytest.mark.gate  # tests/tiers.py


def test_no_notebook_types_a_measurement_its_run_did_not_print():
    found = [f"{path.relative_to(numbers.ROOT)} cell {t.cell}: {t.number!r} in '...{t.context}...'"
             for path in numbers.notebooks() for t in numbers.typed(json.loads(path.read_text(encoding="utf-8")))]
    assert not found, "say what to look for, and let the cell print the number:\n" + "\n".join(found)


def markdown(text: str) -> dict:
    return {"cell_type": "markdown", "source": text}


def test_a_typed_measurement_is_found_and_a_printed_or_quoted_one_is_not():
    nb = {"cells": [
        markdown("Two ranks ran 1.7× faster, in 12.5 s; the ring took 3–4 ms per step."),
        {"cell_type": "code", "source": "print(f'{t:.1f} s')",
         "outputs": [{"output_type": "stream", "name": "stdout", "text": ["12.5 s\n"]}]},
        markdown("Goyal et al. lost 0.1 % of accuracy at 8k.\n\nA 224 × 224 image, `sleep(30 s)`."),
        markdown("<details><summary>Hint</summary>\n\n2 × 63 = 126 elements, 45 s.</details>"),
    ]}
    assert [(t.cell, t.number) for t in numbers.typed(nb)] == [(0, "1.7×"), (0, "3–4 ms")]
