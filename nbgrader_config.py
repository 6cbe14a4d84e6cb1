"""nbgrader settings of the course: solutions/ is the source, labs/ the release, per-cell timeouts.

`make labs` regenerates labs/ from solutions/, `make grade` autogrades a folder of submissions
(tools/grade.py, which builds its own course folders on top of these settings), and a student checks
a lab with `make check LAB=<lab>` (tools/check.py, which applies the same per-cell limits).
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
    "lab01-tf-baseline": 180,
    "lab01-tf-measure": 240,
    "lab01-torch-baseline": 180,
    "lab01-torch-measure": 180,
    "lab01-imports": 120,          # TensorFlow, Keras 3 and tf-keras on a loaded 2-core box
    "lab01-keras-workers": 240,    # one tf-keras epoch per number of workers
    "lab01-keras3-pydataset": 180,
    # lab 4: importing TensorFlow and splitting the CPU into 4 logical devices takes 40 s on a
    # loaded 2-core box; the tests themselves are small eager steps well under the default.
    "lab04-imports": 120,
    # lab 05 (ring all-reduce): torchrun launches of the student's ring (stopped after TIMEOUT s
    # if it deadlocks); the exact test launches it more than once.
    "lab05-check-run": 180,
    "lab05-test-real-exact": 300,
    # Lab 6 (Horovod): single-process references and horovodrun launches (TensorFlow ranks are slow
    # to start: every process, and horovodrun itself, imports TensorFlow).
    "lab06-torch-reference": 120,
    "lab06-torch-run": 300,
    "lab06-keras-reference": 180,
    "lab06-keras-run": 360,
    # lab 02-mirrored-strategy: tests that build strategies on 1-4 devices and trace steps on them,
    # an eager evaluation loop over replicas, and a short training run on 4 devices
    "lab02-setup": 120,
    "lab02-test-input": 120,
    "lab02-test-step": 180,
    "lab02-test-accuracy": 180,
    "lab02-train": 300,
    # Lab 7 (DDP + SyncBN): each cell launches torchrun once or twice (a few seconds each when the
    # machine is idle; much more on a shared, loaded node).
    "lab07-test-loss": 240,
    "lab07-test-syncbn": 240,
    "lab07-test-save": 240,
    "lab07-test-weights": 240,
    "lab07-run": 300,
    # Lab 9 (ZeRO): one cell launches the test worker on 2, 3 and 4 ranks (about 15 s idle; a
    # loaded 2-core box takes several times that).
    "lab09-run": 300,
}


def cell_timeout(cell):
    """Seconds one cell may run while grading, from its grade_id."""
    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
    return SLOW_CELLS.get(grade_id, DEFAULT_CELL_TIMEOUT)


c.Execute.timeout_func = cell_timeout
c.Execute.interrupt_on_timeout = True
