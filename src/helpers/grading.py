"""What the labs' test cells call so that the grader judges them outside your kernel (the labs of
chapters 1 to 9; the README says how labs are graded).

Re-exported from the runtime (`dpc_runtime.judge`, where the judge is written down)::

    from helpers.grading import record, rng   # rng: a hidden test's cases, drawn per grading run
"""
from dpc_runtime.judge import record, rng

__all__ = ["record", "rng"]
