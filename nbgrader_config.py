"""nbgrader settings of the course: solutions/ is the source, labs/ the release, per-cell timeouts.

`make labs` regenerates labs/ from solutions/, `make grade` autogrades a folder of submissions
(tools/grade.py), and a student can check a lab with `nbgrader validate labs/<lab>/<nb>.ipynb`.
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

ROOT = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.root = ROOT
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(ROOT, "build", "gradebook.db")
c.CourseDirectory.ignore = [".ipynb_checkpoints", "__pycache__", "runs", "*.pyc"]

# Per-cell time limits while grading. A cell over its limit is interrupted, gets an error, and the
# rest of the notebook is still graded. Limits are keyed on the cell's nbgrader grade_id (restored
# from the source when grading), never on tags, which a student can delete.
DEFAULT_CELL_TIMEOUT = int(os.environ.get("DPC_CELL_TIMEOUT", "60"))
SLOW_CELLS = {
    # grade_id: seconds. Measurement cells and (later) cells that launch distributed workers.
    "tf-baseline": 180,
    "tf-measure": 240,
    "torch-baseline": 180,
    "torch-measure": 180,
    # Lab 7 (DDP + SyncBN): each cell launches torchrun once or twice (a few seconds each when the
    # machine is idle; much more on a shared, loaded node).
    "ddp-test-loss": 240,
    "ddp-test-syncbn": 240,
    "ddp-test-save": 240,
    "ddp-test-weights": 240,
    "ddp-run": 300,
}


def cell_timeout(cell):
    """Seconds one cell may run while grading, from its grade_id."""
    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
    return SLOW_CELLS.get(grade_id, DEFAULT_CELL_TIMEOUT)


c.Execute.timeout_func = cell_timeout
c.Execute.interrupt_on_timeout = True
