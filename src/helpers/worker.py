"""A worker script's side of the course's launches (chapter 0; who am I and the process group: chapter 7).

Re-exported from the runtime (`dpc_runtime.worker`, where the protocol is written down), so that every
worker script of the course begins the same way::

    from helpers.worker import finish, report, start
"""
from dpc_runtime.worker import (
                                Worker,
                                backend_for,
                                finish,
                                place,
                                placement,
                                report,
                                slurm_first_host,
                                slurm_place,
                                slurm_tasks_per_node,
                                start,
)

__all__ = ["Worker", "backend_for", "finish", "place", "placement", "report", "slurm_first_host", "slurm_place",
           "slurm_tasks_per_node", "start"]
