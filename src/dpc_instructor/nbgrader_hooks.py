"""What the grader changes in nbgrader's autograde (configured per job by grade.py).

nbgrader gives a test cell no points when it printed anything to stderr, even a warning that a
library raised for a correct answer (a torch UserWarning): `StderrIsOutput` makes a test cell's
stderr plain output after it ran, so that only an error (a failed assert, an exception) costs its
points, as in the self-check (dpc_runtime.check).
"""
from __future__ import annotations

from nbconvert.preprocessors import ClearMetadataPreprocessor, Preprocessor
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    Execute,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)
from nbgrader.utils import is_grade
from traitlets import Bool

# nbgrader's own list, in its order (tests/test_grade_units.py checks it still is)
NBGRADER_AUTOGRADE = [Execute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
                      AssignLatePenalties, CheckCellMetadata]


class StderrIsOutput(Preprocessor):
    """In test cells, stderr streams become stdout streams (the text is kept)."""

    enabled = Bool(True)  # nbconvert's preprocessors are off unless enabled

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and is_grade(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream" and output.get("name") == "stderr":
                    output["name"] = "stdout"
        return cell, resources


AUTOGRADE = [Execute, StderrIsOutput, *NBGRADER_AUTOGRADE[1:]]


def job_config() -> str:
    """The lines grade.py adds to a job's nbgrader_config.py."""
    return ("from dpc_instructor.nbgrader_hooks import AUTOGRADE\n"
            "c.Autograde.autograde_preprocessors = AUTOGRADE  # warnings never cost points\n")
