"""The class's steps in order, each timed on the timeline: the machine, the class environment, the accounts and
the exchange, the release, the hub, the website; then per lab the release of the assignment, the students'
work, hand-in, collection, grading, feedback and the students' feedback pages (or, with --fairness, the
measurement). The stages' own files do the steps.
"""
from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from dpc_maintainer.classroom import accounts, grading, hub, jobs, release, students
from dpc_maintainer.classroom.fairness import fairness
from dpc_maintainer.classroom.faults import queue, queue_cull_and_lost_node

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom


def up_and_run(room: Classroom) -> None:
    """Every step in order."""
    t = room.timeline
    with t.step("hub.sh (chromium, configurable-http-proxy, the hub's environment)"):
        hub.install(room)
    with t.step(f"class environment (make class-env PREFIX={room.class_env.parent})"):
        hub.ensure_class_env(room)
    with t.step(f"accounts: {len(room.students)} students and an instructor"):
        accounts.make_accounts(room)
        release.make_exchange(room)
    with t.step("student release, served by git daemon on loopback"):
        release.serve_release(room)
    if room.spawner == "slurm":
        with t.step("a two-node SLURM cluster (src/dpc_setup/cluster.py) for the students' servers"):
            hub.start_cluster(room)
    with t.step("JupyterHub and its proxy up"):
        hub.start_hub(room)
    if room.queue_only:  # --queue: the measurement alone
        queue(room)
        return
    if not room.fairness_only:
        with t.step("the course's website with this hub's link (make book)"):
            hub.build_book(room)
    for lab in room.labs:
        if os.environ.get("DPC_CLASSROOM_UP_ONLY"):  # debugging: the class up, nothing run
            return
        if room.fairness_only:
            fairness(room, lab)
        else:
            run_lab(room, lab)
    if room.cluster is not None and not room.fairness_only:  # what a student meets on a cluster
        queue_cull_and_lost_node(room, room.labs[-1])


def run_lab(room: Classroom, lab: str) -> None:
    """One lab, from the instructor's release to the feedback each student opens."""
    t = room.timeline
    with t.step(f"{lab}: instructor releases the assignment (nbgrader exchange)"):
        release.release_assignment(room, lab)
    watching: contextlib.AbstractContextManager[dict[str, set[tuple[str, str]]]] = (
        jobs.watch_launches(room) if room.cluster is not None else contextlib.nullcontext({}))
    with watching as launches, t.step(f"{lab}: students log in, click the nbgitpuller link, fill, Run All at once, "
                                      "save, hand in (make submit in a JupyterLab terminal)"):
        students.students_do(room, "work", lab)
    with t.step(f"{lab}: the exchange holds every student's hand-in"):
        release.handed_in(room, lab)
    if room.cluster is not None:
        with t.step(f"{lab}: each student's server is a SLURM job, their kernel inside it"):
            jobs.check_jobs(room, launches)
    with t.step(f"{lab}: instructor collects (nbgrader collect)"):
        submitted = release.collect(room, lab)
    with t.step(f"{lab}: grade (dpc_instructor.grade, sandboxed)"):
        grading.grade(room, lab, submitted)
    with t.step(f"{lab}: feedback (gradebook, release_feedback, fetch_feedback)"):
        grading.give_feedback(room, lab)
    refused = ", are refused a classmate's" if len(room.students) > 1 else ""
    with t.step(f"{lab}: students open their feedback{refused}"):
        students.students_do(room, "feedback", lab)
