"""Before a student's notebooks are graded: what honest editing breaks, put right (repair: copied
cells, lost or edited metadata, moved or deleted locked cells; the note column says what was
repaired). nbgrader then restores the sources of test/locked cells from its database.
"""
from __future__ import annotations

import difflib
import json
import uuid

from dpc_runtime import notebook


def repair(nb: dict, release: dict) -> tuple[dict, list[str]]:
    """nb with what honest editing breaks put right, and a note for each repair.

    - a cell id used twice (a copied cell) gets a new id; a copy of a graded cell becomes a cell of
      the student's own (the first keeps the grade id);
    - every test/locked cell gets the release's nbgrader metadata: a cell keeps its grade id when
      it has one; a cell that lost its metadata is matched to the missing release cell whose source
      it most resembles;
    - graded cells are put back in the release's order, a deleted test/locked one re-added in its
      place (the student's own cells stay after the graded cell they followed). nbgrader then
      restores the sources of test/locked cells from its database.
    """
    meta = notebook.by_grade_id(release)
    seen, notes = _restore_metadata(nb, meta)
    notes += _match_lost(nb, meta, seen)
    return nb, notes + _reorder(nb, release)


def _restore_metadata(nb: dict, meta: dict[str, dict]) -> tuple[set[str], list[str]]:
    """Copied cells given ids of their own (a copy of a graded cell its grade id removed), graded cells
    the release's metadata (meta: its cells by grade id); the grade ids found, and a note per repair."""
    notes = []
    ids: set[str] = set()
    seen: set[str] = set()
    for cell in nb["cells"]:
        cid = cell.get("id")
        if isinstance(cid, str) and cid in ids:
            cell["id"] = uuid.uuid4().hex[:8]
            notes.append(f"gave a copied cell (id {cid}) an id of its own")
        if isinstance(cid, str):
            ids.add(cell["id"])
        gid = notebook.grade_id(cell)
        if gid in seen:
            cell.setdefault("metadata", {}).pop("nbgrader", None)
            notes.append(f"a copy of {gid} became a cell of your own (the first keeps the grade id)")
        elif gid in meta:
            seen.add(gid)
            want = notebook.nbgrader(meta[gid])
            have = notebook.nbgrader(cell)
            same = [k for k in want if k != "checksum"]  # the checksum differs with --parameters ci
            if not want.get("solution") and any(have.get(k) != want[k] for k in same):
                notes.append(f"restored the metadata of {gid}")
            cell["metadata"]["nbgrader"] = dict(want) if not want.get("solution") else {**have, **want}
    return seen, notes


def _match_lost(nb: dict, meta: dict[str, dict], seen: set[str]) -> list[str]:
    """Each test/locked release cell not in nb (not in seen) matched to the cell without metadata whose
    source most resembles its own, which gets its metadata back (seen grows); a note per match."""
    notes = []
    for gid, rel in meta.items():
        if gid in seen or notebook.nbgrader(rel).get("solution"):
            continue
        bare = [c for c in nb["cells"] if not notebook.nbgrader(c) and c["cell_type"] == rel["cell_type"]]

        def score(c: dict, rel: dict = rel) -> float:
            """How much c's source resembles the release cell rel's (0 to 1)."""
            return difflib.SequenceMatcher(None, notebook.source(c), notebook.source(rel)).ratio()

        best = max(bare, key=score, default=None)
        if best is not None and score(best) >= 0.6:
            best.setdefault("metadata", {})["nbgrader"] = dict(notebook.nbgrader(rel))
            notes.append(f"restored the lost metadata of {gid}")
            seen.add(gid)
    return notes


def _longest_in_order(order: list[str], fixed: list[str]) -> set[str]:
    """The most cells of order that already follow fixed's order (the rest are the moved ones)."""
    rank = [fixed.index(g) for g in order]
    best: list[list[int]] = []
    for i, r in enumerate(rank):
        prev = max((best[j] for j in range(i) if rank[j] < r), key=len, default=[])
        best.append([*prev, i])
    return {order[i] for i in max(best, key=len, default=[])}


def _reorder(nb: dict, release: dict) -> list[str]:
    """Put nb's graded cells in the release's order, deleted test/locked ones re-added (see repair)."""
    fixed = [g for g in map(notebook.grade_id, release["cells"]) if g]
    anchors = set(fixed)
    head: list[dict] = []
    after: dict[str, list[dict]] = {}
    present: dict[str, dict] = {}
    current = None
    for cell in nb["cells"]:
        gid = notebook.grade_id(cell)
        if gid and gid in anchors:
            present[gid] = cell
            current = gid
            after[gid] = []
        else:
            (after[current] if current else head).append(cell)
    notes = []
    order = [g for g in map(notebook.grade_id, nb["cells"]) if g and g in anchors]
    moved = sorted(set(order) - _longest_in_order(order, fixed), key=fixed.index)
    if moved:
        notes.append(f"put the moved cell(s) {', '.join(moved)} back in their place")
    release_cells = notebook.by_grade_id(release)
    cells = head
    for gid in fixed:
        if gid not in present and notebook.nbgrader(release_cells[gid]).get("solution"):
            continue  # a deleted answer: its tests fail (a stub would undo an answer put elsewhere)
        if gid not in present:
            cell = json.loads(json.dumps(release_cells[gid]))
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
            if "id" in cell:  # nbformat 4.5: ids are unique
                cell["id"] = uuid.uuid4().hex[:8]
            present[gid] = cell
            notes.append(f"re-added the deleted cell {gid}")
        cells += [present[gid], *after.get(gid, [])]
    nb["cells"] = cells
    return notes
