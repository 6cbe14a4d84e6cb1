"""Measurements typed into prose (issue 21, item 2): a number with a unit of time, speed or ratio
in a notebook's markdown that none of its own cells wrote or printed.

    python -m dpc_maintainer.numbers          # one line per number found; exit 1 if any

A chapter's run prints what it measured and the prose says what to look for: a measured figure
typed into the text drifts from the outputs beside it at the next run. Only measurement-like
numbers are checked (seconds, minutes, %, ×, GB/s, images/s, "times"); a number counts as the
notebook's own when it appears in a code cell or an output of the same notebook. Figures quoted from
a source are allowed in a paragraph that names it (R1-R5, "et al.", an italic title, a link, a
paper or documentation); exercise hints (`<details>`) and code spans are not prose.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from dpc_runtime import manifest
from dpc_runtime.notebook import source

ROOT = Path(__file__).resolve().parents[2]

_UNIT = (r"%|×(?!\s*\d)|x\b(?!\s*\d)|s\b|ms\b|min\b|minutes?\b|seconds?\b|hours?\b|GB/s|MB/s|Gb/s|"
         r"images/s|samples/s|steps/s|times\b")
NUMBER = re.compile(r"(?<![\w.,])(\d+(?:\.\d+)?)(?:\s*[–-]\s*(\d+(?:\.\d+)?))?\s*(?:" + _UNIT + ")")
CITED = re.compile(r"\bR[1-5]\b|et al\.|\*[A-Z][^*]{8,}\*|\]\(https?:|\bpaper\b|documentation")


@dataclass(frozen=True)
class Typed:
    """One measured-looking number in a markdown cell that the notebook's run did not produce."""

    cell: int
    number: str
    context: str


def produced(nb: dict) -> str:
    """Everything the notebook's code cells hold and printed (their source and text outputs)."""
    parts = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        parts.append(source(cell))
        for out in cell.get("outputs", []):
            texts = [out.get("text", "")] + [out.get("data", {}).get(kind, "")
                                              for kind in ("text/plain", "text/markdown", "text/html")]
            parts += ["".join(t) if isinstance(t, list) else t for t in texts]
    return "\n".join(parts)


def typed(nb: dict) -> list[Typed]:
    """The numbers of nb's prose that look measured and that none of its cells produced."""
    own = produced(nb)
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = re.sub(r"<details>.*?</details>", "", source(cell), flags=re.S)
        text = re.sub(r"`[^`]*`", "", text)
        for paragraph in re.split(r"\n\s*\n", text):
            if CITED.search(paragraph):
                continue
            for m in NUMBER.finditer(paragraph):
                if all(n in own for n in m.group(1, 2) if n):
                    continue
                around = paragraph[max(0, m.start() - 50):m.end() + 25].replace("\n", " ")
                found.append(Typed(i, m.group(0), around))
    return found


def notebooks() -> list[Path]:
    """Every committed notebook a reader sees: course.yml's chapters and solutions, and each
    solution's generated lab (labs/ mirrors solutions/)."""
    listed = list(manifest.notebooks())
    labs = [p.replace("solutions/", "labs/", 1) for p in listed if p.startswith("solutions/")]
    return sorted(ROOT / p for p in listed + labs)


def main() -> int:
    bad = 0
    for path in notebooks():
        for t in typed(json.loads(path.read_text(encoding="utf-8"))):
            bad += 1
            print(f"{path.relative_to(ROOT)} cell {t.cell}: {t.number!r} in '...{t.context}...'")
    print(f"{bad} typed measurement(s)" if bad else "no typed measurement: every measured number is printed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
