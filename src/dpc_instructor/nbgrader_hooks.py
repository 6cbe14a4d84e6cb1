"""What the grader changes in nbgrader's autograde (configured per job by grading.job).

nbgrader gives a test cell no points when it printed anything to stderr, even a warning that a
library raised for a correct answer (a torch UserWarning): `StderrIsOutput` makes a test cell's
stderr plain output after it ran, so that only an error (a failed assert, an exception) costs its
points, as in the self-check (dpc_runtime.check).

`Judge` takes each test cell's verdict outside the kernel (dpc_runtime.judge): in nbgrader's
process, it compares the values the cell recorded with the reference run's; a cell whose records
differ gets an error output, so nbgrader gives it no points whatever the kernel printed. In the
reference run (`record_to`), it writes the reference's records instead.

`TimedExecute` is nbgrader's Execute that logs each cell it interrupts at its time limit: its grade id,
the limit and the moment (TIMEOUT_LINE), so that the grader can tell, from what the job's threads did
meanwhile (dpc_runtime.cpuwait), a slow or stuck cell from one starved by a busy machine. When the
kernel dies it logs where and how (KERNEL_DIED_LINE) and fails every cell it could not run, so the
notebook is still graded: the cells before the death keep what they earned.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from nbclient.exceptions import DeadKernelError
from nbconvert.preprocessors import ClearMetadataPreprocessor, Preprocessor
from nbformat.v4 import new_output
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    Execute,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)
from nbgrader.utils import is_grade
from traitlets import Bool, Unicode

from dpc_instructor import markers
from dpc_runtime import check, judge

# nbgrader's own list, in its order (tests/test_grade_units.py checks it still is)
NBGRADER_AUTOGRADE = [Execute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
                      AssignLatePenalties, CheckCellMetadata]


# what TimedExecute logs, as grading.failures.cell_timeouts reads it: grade id (or "cell N"), limit (s), time.time()
TIMEOUT_LINE = r"dpc-timeout (\S+) (\d+) s at (\d+\.\d+)"


# what TimedExecute logs when the kernel dies: where and how, in dpc_runtime.check's words
KERNEL_DIED_LINE = r"dpc-kernel-died (the kernel died .*)"


class TimedExecute(Execute):
    """nbgrader's Execute; a cell interrupted at its time limit is logged (TIMEOUT_LINE). When the
    kernel dies (a segmentation fault, an abort) the cell it ran and every later code cell get an
    error saying so (nbgrader would give an unrun test cell its points), it is logged
    (KERNEL_DIED_LINE), and the cells before it are graded as usual."""

    died = ""  # "the kernel died in cell N (gid): how" once it has, for this notebook

    def preprocess(self, nb, resources=None, km=None):
        """Execute nb's cells (a fresh record of the kernel's death per notebook)."""
        self.died = ""
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        """Execute one cell; after the kernel's death, say why it could not run."""
        if not self.died:
            try:
                return super().preprocess_cell(cell, resources, index)
            except DeadKernelError:
                process = getattr(getattr(self.km, "provisioner", None), "process", None)
                self.died = check.died_line(check.kernel_death(self.nb, index, process))
                self.log.error("dpc-kernel-died %s", self.died)
        if cell.cell_type == "code":
            cell.outputs = [new_output("error", ename="KernelDied", evalue=f"could not run: {self.died}",
                                       traceback=[f"KernelDied: could not run: {self.died}"])]
        return cell, resources

    async def _async_handle_timeout(self, timeout: int, cell: Any = None) -> Any:
        """Log the cell interrupted at its time limit (TIMEOUT_LINE), then interrupt it as nbclient does."""
        gid = (cell.metadata.get("nbgrader", {}).get("grade_id") if cell is not None else None) or (
            f"cell-{self.code_cells_executed}")
        self.log.error("dpc-timeout %s %d s at %.3f", gid, timeout, time.time())
        return await super()._async_handle_timeout(timeout, cell)


class StderrIsOutput(Preprocessor):
    """In test cells, stderr streams become stdout streams (the text is kept)."""

    enabled = Bool(True)  # nbconvert's preprocessors are off unless enabled

    def preprocess_cell(self, cell, resources, index):
        """The cell, its stderr streams made stdout when it is a test cell."""
        if cell.cell_type == "code" and is_grade(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream" and output.get("name") == "stderr":
                    output["name"] = "stdout"
        return cell, resources


class Judge(Preprocessor):
    """Test cells judged on their records (dpc_runtime.judge), outside the kernel.

    Also, in every test cell: an `execute_result` becomes a plain display (nbgrader reads one as
    *partial credit*, and gives full points for anything it cannot read as a number, before looking
    at the cell's errors: a student's function could print one from inside a failing test).
    """

    enabled = Bool(True)
    reference = Unicode("", help="the reference run's records (JSON: notebook -> grade id -> records)").tag(config=True)
    record_to = Unicode("", help="the reference run: write the records here, judge nothing").tag(config=True)

    def preprocess(self, nb, resources):
        """Judge every test cell of nb on its records against the reference's (or keep them: record_to)."""
        name = resources["nbgrader"]["notebook"]
        reference = {} if self.record_to or not self.reference else (
            json.loads(Path(self.reference).read_text()).get(name, {}))
        found = {}
        for cell in nb.cells:
            if cell.cell_type != "code" or not is_grade(cell):
                continue
            gid = cell.metadata["nbgrader"]["grade_id"]
            found[gid] = judge.records(cell)
            if any(o.get("ename") == "KernelDied" for o in cell.get("outputs", [])):
                continue  # it could not run (TimedExecute): nothing to judge
            outputs = []
            for output in cell.get("outputs", []):
                if judge.MIME in output.get("data", {}):
                    continue
                if output.output_type == "execute_result":
                    output = new_output("display_data", data=output.get("data", {}),
                                        metadata=output.get("metadata", {}))
                outputs.append(output)
            if self.record_to:  # the reference must pass its own records (same_as, bounds, ...)
                why = judge.verdict(found[gid], found[gid]) if found[gid] else None
            else:
                why = judge.verdict(reference[gid], found[gid]) if reference.get(gid) else None
                hidden = markers.hidden_lines(cell.source)  # (a record of no known line is shown)
                shown_part = [r for r in reference.get(gid) or [] if r.get("line") not in hidden]
                if why and len(shown_part) < len(reference[gid]):  # name visible records only
                    why = judge.verdict(shown_part, found[gid][:len(shown_part)]) or (
                        "the values a hidden test recorded are missing or differ from the reference's")
            head = [new_output("error", ename="GraderCheck", evalue=why, traceback=[
                f"the grader's own check (outside your kernel): {why}"])] if why else []
            shown = [new_output("stream", name="stdout", text=(
                f"({len(found[gid])} value(s) recorded for the grader, checked outside your kernel)\n"))
            ] if found[gid] else []
            cell.outputs = head + outputs + shown
        if self.record_to:
            path = Path(self.record_to)
            saved = json.loads(path.read_text()) if path.exists() else {}
            saved[name] = {gid: items for gid, items in found.items() if items}
            path.write_text(json.dumps(saved))
        return nb, resources


AUTOGRADE = [TimedExecute, Judge, StderrIsOutput, *NBGRADER_AUTOGRADE[1:]]


def job_config(reference: Path | None = None, record_to: Path | None = None) -> str:
    """The lines the grader (grading.job.tries) adds to a job's nbgrader_config.py (the judge's reference, or where the
    reference run writes its records)."""
    return ("from dpc_instructor.nbgrader_hooks import AUTOGRADE\n"
            "c.Autograde.autograde_preprocessors = AUTOGRADE  # warnings never cost points; the judge\n"
            + (f"c.Judge.reference = {str(reference)!r}\n" if reference else "")
            + (f"c.Judge.record_to = {str(record_to)!r}\n" if record_to else ""))
