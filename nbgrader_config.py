"""nbgrader settings of the course: solutions/ is the source, labs/ the release, per-cell timeouts (course.yml).

`make labs` regenerates labs/ from solutions/, `make grade` autogrades a folder of submissions
(src/dpc_instructor/grade.py; its stages in src/dpc_instructor/grading/ build their own course folders on top of
these settings), and a student checks
a lab with `make check LAB=<lab>` (src/dpc_runtime/check.py, which applies the same per-cell limits).
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
# rest of the notebook is still graded. The limits are each lab's `slow_cells` in course.yml, keyed on
# the cell's nbgrader grade_id (restored from the source when grading), never on tags, which a student
# can delete; every other cell gets DPC_CELL_TIMEOUT (default 60 s).
from dpc_runtime.manifest import cell_timeout  # noqa: E402  (the one reader of course.yml)

c.Execute.timeout_func = cell_timeout
c.Execute.interrupt_on_timeout = True
