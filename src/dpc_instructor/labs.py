"""Generate the student labs (labs/) from their single source (solutions/) with nbgrader, or check
that labs/ is up to date.

Beside each lab notebook goes `<notebook>.checks.json`: the values the solution's test cells
recorded in their visible parts (dpc_runtime.judge), from the solution's committed outputs. The
self-check (dpc_runtime.check) compares a student's records with them, as the grader compares all
of them (hidden parts included) with a fresh run of the solution.

    python -m dpc_instructor.labs generate   # what `make labs` runs
    python -m dpc_instructor.labs check      # exit 1 and list the stale files when labs/ is out of date
"""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dpc_instructor import markers
from dpc_runtime import judge, notebook

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NBGRADER = str(BIN / "nbgrader")
# nbgrader runs `alembic` from PATH: make sure it finds this environment's.
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def lab_names() -> list[str]:
    """Every lab: one folder of solutions/ holding at least one notebook."""
    return sorted(p.name for p in (ROOT / "solutions").iterdir()
                  if p.is_dir() and any(p.glob("*.ipynb")))


def generate(release_dir: Path, db_dir: Path) -> None:
    """Run nbgrader generate_assignment for every lab into release_dir."""
    db_dir.mkdir(parents=True, exist_ok=True)
    for lab in lab_names():
        subprocess.run(
            [NBGRADER, "generate_assignment", lab, "--force", "--log-level=ERROR",
             f"--CourseDirectory.release_directory={release_dir}",
             f"--CourseDirectory.db_url=sqlite:///{db_dir / 'gradebook.db'}"],
            cwd=ROOT, env=ENV, check=True)
        for generated in sorted((release_dir / lab).glob("*.ipynb")):
            unstamp(generated)
        for source in sorted((ROOT / "solutions" / lab).glob("*.ipynb")):
            checks = visible_records(json.loads(source.read_text()))
            if checks:
                out = release_dir / lab / f"{source.stem}.checks.json"
                out.write_text(json.dumps(checks, indent=1, sort_keys=True) + "\n")


def unstamp(path: Path) -> None:
    """Drop the solution run's fingerprints (cell metadata 'dpc', dpc_maintainer.outputs) from a
    generated lab: a student's copy has no run to vouch for."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    if any("dpc" in cell.metadata for cell in nb.cells):
        for cell in nb.cells:
            cell.metadata.pop("dpc", None)
        nbformat.write(nb, path)


def visible_records(nb: dict) -> dict[str, list[dict]]:
    """{grade id: the records its visible part made} from a solution notebook's outputs (records
    whose line is unknown are left out: they could come from a hidden part)."""
    found = {}
    for cell in nb["cells"]:
        gid = notebook.grade_id(cell)
        if gid and notebook.nbgrader(cell).get("grade") and cell["cell_type"] == "code":
            shown = markers.visible_records(judge.records(cell), notebook.source(cell))
            if shown:
                found[gid] = shown
    return found


def stale(release_dir: Path) -> list[str]:
    """Files that differ between a fresh generation in release_dir and labs/ (either side)."""
    labs = ROOT / "labs"
    fresh = {p.relative_to(release_dir) for p in release_dir.rglob("*") if p.is_file()}
    have = {p.relative_to(labs) for p in labs.rglob("*") if p.is_file()} if labs.exists() else set()
    diff = sorted(str(p) for p in fresh ^ have)
    diff += sorted(str(p) for p in fresh & have
                   if not filecmp.cmp(release_dir / p, labs / p, shallow=False))
    return diff


def main(argv: list[str]) -> int:
    """The command line (`generate`: labs/ made again from solutions/)."""
    if argv[1:] == ["generate"]:
        generate(ROOT / "labs", ROOT / "build")
        print(f"labs/ regenerated from solutions/: {', '.join(lab_names())}")
        return 0
    if argv[1:] == ["check"]:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp) / "release", Path(tmp))
            bad = stale(Path(tmp) / "release")
        if bad:
            print("labs/ is out of date with solutions/ (run `make labs`):\n  " + "\n  ".join(bad))
            return 1
        print("labs/ is up to date")
        return 0
    if argv[1:] in (["--help"], ["-h"]):
        print(__doc__)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
