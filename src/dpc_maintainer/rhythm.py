"""Measure how a chapter reads against the rhythm of the tensorflow/docs tutorials (issue 21, item 6).

    python -m dpc_maintainer.rhythm            # one line per chapter, then the targets

Per notebook: lines per code cell outside `%%writefile` (median, p90, max), the longest worker script
(`%%writefile` cell), words per markdown cell (median, max; the Needs line, a measured fact the site
shows in the page's header, not counted), the share of code cells that follow
another code cell with no sentence in between (a first-line comment counts as one), and the test machinery in what students read
(`# NBVAL_CHECK_OUTPUT` markers, `record(...)` calls). tests/test_rhythm.py holds every chapter to
its figures of today (they may shrink, never grow) and prints how far each is from the targets.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from dpc_maintainer.needs import SOME_NEEDS
from dpc_runtime.notebook import source

ROOT = Path(__file__).resolve().parents[2]

# The targets of issue 21, item 6 (tensorflow/docs' distribute notebooks: code cells median 4,
# p90 10, max 12 lines; 58 words per markdown cell, so none past 200; 7 % of code cells follow another with
# no sentence).
TARGETS = {"code_max": 30, "script_max": 100, "words_max": 200, "code_after_code": 0.07, "machinery": 0}


@dataclass(frozen=True)
class Rhythm:
    """The figures of one notebook (see the module's docstring)."""

    code_median: float
    code_p90: float
    code_max: int
    script_max: int
    words_median: float
    words_max: int
    code_after_code: float
    machinery: int


def _p90(values: list[int]) -> float:
    if len(values) < 2:
        return float(values[0]) if values else 0.0
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def measure(nb: dict) -> Rhythm:
    """The rhythm figures of one notebook (a dict as json.load reads an .ipynb)."""
    code_lines: list[int] = []
    scripts: list[int] = [0]
    words: list[int] = []
    after_code = code_cells = machinery = 0
    previous = None
    for cell in nb["cells"]:
        text = source(cell)
        if cell["cell_type"] == "markdown":
            words.append(len(re.findall(r"\w+", SOME_NEEDS.sub("", text))))
        elif cell["cell_type"] == "code":
            code_cells += 1
            first = text.lstrip().split("\n", 1)[0]
            said = first.startswith("# ") and "NBVAL" not in first  # a comment that says what comes
            after_code += previous == "code" and not said
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if text.startswith("%%writefile"):
                scripts.append(len(lines) - 1)
            else:
                code_lines.append(len(lines))
                machinery += text.count("NBVAL_CHECK_OUTPUT") + len(re.findall(r"\brecord\(", text))
        previous = cell["cell_type"]
    return Rhythm(code_median=statistics.median(code_lines) if code_lines else 0.0,
                  code_p90=round(_p90(code_lines), 1), code_max=max(code_lines, default=0),
                  script_max=max(scripts), words_median=statistics.median(words) if words else 0.0,
                  words_max=max(words, default=0),
                  code_after_code=round(after_code / code_cells, 2) if code_cells else 0.0,
                  machinery=machinery)


def chapters() -> dict[str, Rhythm]:
    """The figures of every chapter, by path relative to the course's top folder."""
    return {str(p.relative_to(ROOT)): measure(json.loads(p.read_text()))
            for p in sorted((ROOT / "course").glob("[0-9][0-9]-*.ipynb"))}


def main() -> int:
    rows = chapters()
    names = list(asdict(next(iter(rows.values()))))
    print("notebook".ljust(36) + "".join(n.rjust(16) for n in names))
    for path, r in rows.items():
        print(path.ljust(36) + "".join(str(v).rjust(16) for v in asdict(r).values()))
    print("targets: " + ", ".join(f"{k} <= {v}" for k, v in TARGETS.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
