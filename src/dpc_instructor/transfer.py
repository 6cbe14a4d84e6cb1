"""How much of each lab's answer a student could paste from the chapters (the labs must test transfer).

For every lab in solutions/, the answer lines (between ``### BEGIN SOLUTION`` and ``### END
SOLUTION``, as src/dpc_instructor/release.py reads them) are compared, whitespace-stripped, with every line of the chapters' code cells and of
their committed outputs (which include any source a chapter prints). Blank lines, comments and lines
without content of their own (``else:``, ``)``, ``pass``) are not counted. Two numbers per lab:
the share of answer lines found verbatim in a chapter, and the longest run of consecutive answer
lines all found there (a pasteable block).

    python -m dpc_instructor.transfer          # a table, every lab
    python -m dpc_instructor.transfer --show 04-manual-towers   # the lines found, and where
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from dpc_instructor import release  # the rule of what an answer line is

ROOT = Path(__file__).resolve().parents[2]

MAX_SHARE = 0.20   # at most this share of a lab's answer lines may appear in a chapter
MAX_RUN = 2        # and never more than this many consecutive ones
TRIVIAL = re.compile(r"^(?:[\)\]\}:,;]+|else:|try:|finally:|pass|continue|break|return|\"\"\"|''')$")


def _text(value: object) -> str:
    """A notebook field's text (a list of lines joined)."""
    return "".join(value) if isinstance(value, list) else str(value)


def chapter_lines(course: Path = ROOT / "course") -> dict[str, str]:
    """Every stripped line of the chapters' code and outputs, mapped to the first chapter showing it."""
    seen: dict[str, str] = {}
    for nb in sorted(course.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            texts = [_text(cell["source"])]
            for out in cell.get("outputs", []):
                texts.append(_text(out.get("text", "")))
                texts.append(_text(out.get("data", {}).get("text/plain", "")))
            for text in texts:
                for line in text.splitlines():
                    seen.setdefault(line.strip(), nb.name)
    return seen


def counts(line: str) -> bool:
    """Whether an answer line has content of its own (not blank, a comment or a lone keyword)."""
    s = line.strip()
    return bool(s) and not s.startswith("#") and not TRIVIAL.match(s)


def answer_blocks(notebook: Path) -> list[list[str]]:
    """The counted lines of each solution block of a notebook, in order."""
    return [[line.strip() for line in lines if counts(line)]
            for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == "code"
            for block, lines in release.blocks(cell) if block == "answer"]


@dataclass
class Overlap:
    """One lab's answer lines against the chapters."""
    lab: str
    total: int = 0
    found: list[tuple[str, str]] = field(default_factory=list)  # (line, chapter)
    longest_run: int = 0
    run: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        """The part of the lab's answer lines a chapter holds."""
        return len(self.found) / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        """Whether the chapters give away little enough of the lab (MAX_SHARE, MAX_RUN)."""
        return self.share <= MAX_SHARE and self.longest_run <= MAX_RUN


def overlap(lab_dir: Path, seen: dict[str, str]) -> Overlap:
    """Measure one lab folder of solutions/ against the chapters' lines."""
    result = Overlap(lab_dir.name)
    for nb in sorted(lab_dir.glob("*.ipynb")):
        for block in answer_blocks(nb):
            run: list[str] = []
            for line in block:
                result.total += 1
                if line in seen:
                    result.found.append((line, seen[line]))
                    run.append(line)
                    if len(run) > result.longest_run:
                        result.longest_run, result.run = len(run), list(run)
                else:
                    run = []
    return result


def labs(solutions: Path = ROOT / "solutions") -> list[Path]:
    """The lab folders of solutions/."""
    return sorted(p for p in solutions.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def main() -> int:
    """The command line: every lab's overlap with the chapters, or the lines of one (--show)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", metavar="LAB", help="print the lines of LAB found in chapters")
    args = parser.parse_args()
    seen = chapter_lines()
    bad = 0
    print(f"{'lab':<22} {'answer lines':>12} {'in chapters':>11} {'share':>6} {'longest run':>11}")
    for lab in labs():
        o = overlap(lab, seen)
        bad += not o.ok
        print(f"{o.lab:<22} {o.total:>12} {len(o.found):>11} {o.share:>6.0%} {o.longest_run:>11}"
              + ("" if o.ok else "   <- over the limit"))
        if args.show and args.show in lab.name:
            for line, chapter in o.found:
                print(f"    {chapter}: {line}")
            print("    longest run:", *o.run, sep="\n      ")
    print(f"limits: share <= {MAX_SHARE:.0%}, run <= {MAX_RUN}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
