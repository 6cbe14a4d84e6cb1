"""nbgrader's answer and hidden-test markers, read in one place (never shipped: the release test
refuses any file that holds them): the blocks they delimit, matched anywhere in a line as nbgrader
matches them."""
from __future__ import annotations

import re
from typing import Any

from dpc_runtime.notebook import Cell, nbgrader, source

# Block delimiters: the line that opens a block -> its kind, and the kind -> the text that closes it.
MARKERS = {"BEGIN SOLUTION": "answer", "BEGIN HIDDEN TESTS": "hidden test"}
ENDS = {"answer": "END SOLUTION", "hidden test": "END HIDDEN TESTS"}
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.M | re.S)


def blocks(cell: Cell, norm: Any = str.strip) -> list[tuple[str | None, list[str]]]:
    """The cell's lines in order, in runs: (None, "answer" or "hidden test", lines).

    The marker lines themselves belong to no run. An nbgrader solution cell without markers is one
    answer (nbgrader replaces it whole). `norm` is how a line is read to find a marker.
    """
    text = source(cell)
    if nbgrader(cell).get("solution") and "BEGIN SOLUTION" not in text:
        return [("answer", text.splitlines())]
    runs: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        s = norm(line)
        block = runs[-1][0]
        opened = next((k for m, k in MARKERS.items() if m in s), None)
        if block is None and opened:
            runs.append((opened, []))
        elif block is not None and ENDS[block] in s:
            runs.append((None, []))
        else:
            runs[-1][1].append(line)
    return [(block, lines) for block, lines in runs if lines]


def without_answer_markers(cell: Cell) -> str:
    """The cell's text with its answer delimiters removed (the instructor's answer as code)."""
    return "\n".join(ln for ln in source(cell).split("\n")
                     if "BEGIN SOLUTION" not in ln and "END SOLUTION" not in ln)


def hide_hidden_tests(text: str, stand_in: str = "# (hidden tests run here)\n") -> str:
    """The text with every hidden-test block (markers included) replaced by stand_in."""
    return _HIDDEN.sub(stand_in, text)


def hidden_tests(text: str) -> list[str]:
    """The hidden-test blocks of a text, each without its markers."""
    return re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", text, re.S)


def hidden_lines(text: str) -> set[int]:
    """The numbers (from 1) of the lines of text inside a hidden-test block, markers included."""
    hidden, inside = set(), False
    for number, line in enumerate(text.splitlines(), start=1):
        if "### BEGIN HIDDEN TESTS" in line:
            inside = True
        if inside:
            hidden.add(number)
        if "### END HIDDEN TESTS" in line:
            inside = False
    return hidden


def visible_records(items: list[dict], text: str) -> list[dict]:
    """The records (dpc_runtime.judge) a test cell of source `text` made in its visible part: those
    whose line is known and outside every hidden-test block."""
    hidden = hidden_lines(text)
    return [r for r in items if isinstance(r.get("line"), int) and r["line"] not in hidden]
