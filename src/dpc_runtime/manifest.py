"""The course manifest, course.yml: each notebook's facts (chapter and lab, CI and GPU parameters,
ranks per graded notebook, slow cells), read here and nowhere else."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from dpc_runtime import notebook

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "course.yml"
DEFAULT_CELL_TIMEOUT = 60  # seconds a cell not listed in slow_cells may run (DPC_CELL_TIMEOUT overrides)


@dataclass(frozen=True)
class Chapter:
    """One chapter: its number, notebook (course/NN-slug.ipynb) and the lab that follows it, if any."""

    number: int
    notebook: str
    lab: str | None

    @property
    def slug(self) -> str:
        """'07-ddp-syncbn' for course/07-ddp-syncbn.ipynb."""
        return Path(self.notebook).stem


@cache
def _load(path: Path) -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected one entry per notebook")
    return data


def _read(path: Path | None = None) -> dict[str, dict[str, Any]]:
    return _load(path or MANIFEST)


def notebooks(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every notebook of course/ and solutions/ (path from the top folder) with its settings, in order."""
    return {nb: settings or {} for nb, settings in _read(path).items()}


def chapters() -> list[Chapter]:
    """The chapters in order."""
    found = [Chapter(int(s["chapter"]), path, s.get("lab")) for path, s in _read().items()
             if path.startswith("course/")]
    return sorted(found, key=lambda c: c.number)


def lab_settings(lab: str) -> dict[str, Any]:
    """The entry of lab `lab` ('07-ddp-syncbn'): its solution notebook's settings."""
    hits = [s for path, s in _read().items() if path.startswith(f"solutions/{lab}/")]
    if len(hits) != 1:
        raise KeyError(f"course.yml has {len(hits)} notebooks for lab {lab!r} (expected 1)")
    return hits[0]


def lab_ranks(lab: str) -> int:
    """Processes one graded notebook of `lab` starts at once (1 for a lab not in the manifest)."""
    try:
        return int(lab_settings(lab).get("ranks", 1))
    except KeyError:
        return 1


def slow_cells() -> dict[str, int]:
    """grade_id -> seconds that cell may run while grading or self-checking, over every lab."""
    return {gid: int(s) for entry in _read().values() for gid, s in (entry.get("slow_cells") or {}).items()}


def cell_timeout(cell: dict[str, Any]) -> int:
    """Seconds one cell may run while grading or self-checking: its slow_cells entry, by grade id.

    Every other cell: $DPC_CELL_TIMEOUT (the grader's --cell-timeout), default DEFAULT_CELL_TIMEOUT.
    Both times $DPC_CELL_TIME_SCALE (default 1): the grader's try after a cell ran past its limit on a
    busy machine gets more time.
    """
    default = int(os.environ.get("DPC_CELL_TIMEOUT", DEFAULT_CELL_TIMEOUT))
    scale = float(os.environ.get("DPC_CELL_TIME_SCALE", "1"))
    return round(slow_cells().get(notebook.grade_id(cell) or "", default) * scale)
