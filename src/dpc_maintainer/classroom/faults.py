"""With --spawner slurm, after the lab: what a student meets on a cluster. The students' idle servers are stopped by
jupyterhub-idle-culler (a service of the hub; the harness's hub culls after CULL_S) and their jobs end; the
cluster is then filled with other users' jobs but for one student's cores, and the students log in at once: one
is served, the others' spawn pages say the job is pending in SLURM's queue until a classmate's server, left idle,
is culled and frees its cores. The student served last logs in again and saves a notebook; their node is lost
(its slurmd and every job step on it killed); the hub notices, and the student starts the server again from the
hub's page: a new job on the other node, the notebook there.

The harness's side (queue_cull_and_lost_node) runs the steps and reads squeue and the hub's log; the browser's
side (run_phase, in the hub's environment like students.py) logs the students in and reads their pages.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpc_maintainer.classroom.browser import api, first_line, login, student_browser
from dpc_maintainer.classroom.common import SPAWN_S, StepFailed, wait_for

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom

CULL_S = 60  # the harness's hub stops a server idle this long (DPC_HUB_CULL_S; the culler looks every 15 s)
NOTICE_S = 240  # a lost node: SLURM's SlurmdTimeout (60 s) marks it down, the hub's poll (30 s) sees the job gone
SAVED = "saved-before-the-node-went.ipynb"  # the lost node's student saves it, finds it after
PENDING = "Pending in queue"  # what batchspawner's progress says on the spawn page while the job waits


# ---------------------------------------------------------------- the harness's side (the course's environment)


def queue_cull_and_lost_node(room: Classroom, lab: str) -> dict[str, Any]:
    """The three steps; what they measured (for the timeline's lines and the run's folder)."""
    from dpc_maintainer.classroom.jobs import student_jobs
    from dpc_maintainer.classroom.students import start_browsers

    t = room.timeline
    found: dict[str, Any] = {}
    with t.step(f"slurm: every idle server culled after {CULL_S} s (jupyterhub-idle-culler), its job ended"):
        wait_for("the culler to end every student's job", lambda: not student_jobs(room), CULL_S * 4)
        culled = [s.name for s in room.students if f"Culling server {s.name}" in hub_log(room)]
        if len(culled) != len(room.students):
            raise StepFailed(f"jobs ended but the hub's log says the culler stopped only {culled}")
    with t.step("slurm: the cluster full but for one server; one student served, the others queued until a "
                "classmate's server is culled"):
        fillers = fill_but_one(room)
        res = start_browsers(room, "queue", lab, {"cull_s": CULL_S})
        print(f"classroom:   {json.dumps(res, sort_keys=True)}", flush=True)
        bad = [f"{n}: {r['error']}" for n, r in res.items() if r.get("error")]
        first, queued = served_at_once(res)
        if bad or len(first) != 1 or len(queued) != len(room.students) - 1:
            raise StepFailed("; ".join(bad) or f"served at once: {first}, queued past a culling (their page said "
                             f"{PENDING!r}): {queued}; expected one, and all the others")
        found["queue"] = res
    last = max(res, key=lambda n: res[n]["to_lab_s"])  # the one served last: their server still runs
    with t.step(f"slurm: {last}'s node lost; the hub notices; a new job on the other node, the notebook there"):
        ready = room.dir / "lost-node.ready"
        out: dict[str, Any] = {}
        browsers = threading.Thread(target=lambda: out.update(start_browsers(
            room, "lost-node", lab, {"students": [asdict(s) for s in room.students if s.name == last],
                                     "ready": str(ready), "notice_s": NOTICE_S})), daemon=True)
        browsers.start()  # the student logs in, saves a notebook, says so (ready), waits for the hub to notice
        wait_for(f"{last} to save a notebook", lambda: ready.exists() or not browsers.is_alive(), SPAWN_S)
        (job, _, node), = student_jobs(room).get(last, [("", "", "")])
        if ready.exists() and job:
            lost_node(room, node)
            room.cluster.run("scancel", *fillers, check=False)  # the other users' jobs end: cores free elsewhere
        browsers.join()
        r = out.get(last, {})
        print(f"classroom:   {json.dumps(r, sort_keys=True)}", flush=True)
        if not job or r.get("error") or not r.get("notebook_there"):
            raise StepFailed(f"{last} and the lost node (job {job or 'none'}): {r}")
        # The lost job may still be listed COMPLETING (its node cannot report its end): not running, not counted.
        jobs = student_jobs(room).get(last, [])
        now = [j for j in jobs if j[1] == "RUNNING"]
        if len(now) != 1 or now[0][2] == node or now[0][0] == job:
            raise StepFailed(f"{last}'s server after {node} was lost: jobs {jobs}, expected one running, new, "
                             "on the other node")
        found["lost_node"] = {"student": last, "lost": node, "job": job, "now": now[0], **r}
    return found


def queue(room: Classroom) -> dict[str, Any]:
    """--queue: every student logs in at once on the empty cluster, each job asking for --cpu cores (whole): how
    many are served at once, and how long the others wait (their jobs start as the culler stops idle servers)."""
    from dpc_maintainer.classroom.students import start_browsers
    from dpc_setup.cluster import CPUS_PER_NODE, NODES

    per, cores, n = math.ceil(float(room.cpu)), CPUS_PER_NODE * len(NODES), len(room.students)
    with room.timeline.step(f"slurm: {n} students log in at once, {per} cores each, on {len(NODES)} nodes of "
                            f"{CPUS_PER_NODE} cores"):
        res = start_browsers(room, "queue", room.labs[0], {"cull_s": CULL_S})
        bad = [f"{name}: {r['error']}" for name, r in res.items() if r.get("error")]
        if bad:
            raise StepFailed("; ".join(bad))
        first, queued = served_at_once(res)
        at_once = sorted(res[x]["to_lab_s"] for x in first)
        waited = sorted(res[x]["to_lab_s"] for x in queued)
        print(f"classroom: queue: {len(at_once)} of {n} served at once ({at_once} s to JupyterLab); {len(waited)} "
              f"waited in the queue, their page saying {PENDING!r}, until the culler stopped an idle server "
              f"({waited} s to JupyterLab)", flush=True)
        if len(at_once) != min(n, cores // per):
            raise StepFailed(f"{len(at_once)} served at once, expected {min(n, cores // per)} ({cores} cores, {per} each)")
    return res


def served_at_once(res: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The students served at once, and those whose page said the job was pending for half a culling or more
    (a job that starts at once may show pending for a moment; one waiting for a culled server, a minute)."""
    queued = [n for n, r in res.items() if (r.get("pending_s") or 0) >= CULL_S / 2]
    return [n for n in res if n not in queued], queued


def hub_log(room: Classroom) -> str:
    """The hub's log so far (the culler, a service of the hub, writes into it too)."""
    return (room.dir / "hub.log").read_text(errors="replace")


def fill_but_one(room: Classroom) -> list[str]:
    """Other users' jobs (root's `sleep`) on every core of the cluster but one student's; their ids (the cluster's
    tear-down cancels root's jobs, these too, if a step fails before the lost node's step does)."""
    from dpc_setup.cluster import CPUS_PER_NODE, NODES

    per = math.ceil(float(room.cpu))  # what each student's job asks for (the hub config rounds up)
    ids = []
    for _ in range((CPUS_PER_NODE * len(NODES) - per) // per):
        ids.append(room.cluster.run("sbatch", "--parsable", "--job-name=another-users-job", f"--cpus-per-task={per}",
                                    "--output=/dev/null", "--wrap=sleep 3600").strip().split(";")[0])
    wait_for("the other users' jobs to run", lambda: "PENDING" not in room.cluster.run(
        "squeue", "-h", "-o", "%T", "-j", ",".join(ids)), 60)
    return ids


def lost_node(room: Classroom, node: str) -> None:
    """A node lost: its slurmd killed, and every job step on it (slurmstepd, and all it started) with it."""
    from dpc_runtime.reaper import marked

    jobs = set(room.cluster.run("squeue", "-h", "-w", node, "-o", "%i").split())
    os.killpg(room.cluster.procs[f"slurmd-{node}"].pid, signal.SIGKILL)
    steps = [pid for pid in marked("DPC_CLUSTER_ID", room.cluster.id) if step_of(pid) in jobs]
    for pid in sorted({d for p in steps for d in [p, *descendants(p)]}):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"classroom:   {node} lost: slurmd and {len(steps)} job step(s) of jobs {sorted(jobs)} killed", flush=True)


def step_of(pid: int) -> str:
    """The job of a slurmstepd process ("slurmstepd: [<job>.<step>]"), '' for any other process."""
    try:
        m = re.match(rb"slurmstepd: \[(\d+)", Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return ""
    return m.group(1).decode() if m else ""


def descendants(pid: int) -> list[int]:
    """Every process below pid (children, their children, ...): psutil's tree, as the launcher's kill uses."""
    import psutil  # the harness's side (the course's environment; the browser's has none)

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# ---------------------------------------------------------------- the browser (hub's environment)


async def queued_login(ctx: Any, plan: dict, s: dict) -> dict[str, Any]:
    """Log in and watch the spawn page until JupyterLab: whether it said the job is pending, and for how long."""
    page = ctx.pages[0] if ctx.pages else await ctx.new_page()
    t0 = time.monotonic()
    first_seen = last_seen = 0.0  # when the page said the job is pending, first and last (0: never)
    await page.goto(f"{plan['base']}/hub/login")
    if await page.locator("#username_input").count():
        await page.fill("#username_input", s["name"])
        await page.fill("#password_input", s["password"])
        await page.click("#login_submit")
    else:  # logged in already (the lab's phases): to their server, which the hub starts
        await page.goto(f"{plan['base']}/hub/user-redirect/lab")
    deadline = t0 + SPAWN_S + plan["cull_s"] * 4
    while "/lab" not in page.url:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no JupyterLab within {deadline - t0:.0f} s ({page.url})")
        try:
            body = await page.inner_text("body")
        except Exception:  # noqa: BLE001 (the page is navigating: read it again)
            body = ""
        if PENDING in body:
            if not first_seen:
                await page.screenshot(path=str(Path(plan["screens"]) / f"slurm-{s['name']}-queued.png"))
            last_seen = time.monotonic()
            first_seen = first_seen or last_seen
        await asyncio.sleep(0.5)  # watching the spawn page's progress, with a deadline
    await page.wait_for_selector("#jp-main-dock-panel", timeout=SPAWN_S * 1000)
    return {"pending_s": round(last_seen - first_seen, 1) if first_seen else None,
            "to_lab_s": round(time.monotonic() - t0, 1), "page": page}


async def lose_the_node(ctx: Any, plan: dict, s: dict) -> dict[str, Any]:
    """Log in (the running server), save a notebook, say so; once the hub lists the server as stopped (the node
    under it was lost), start it again from the hub's page and find the notebook in the new server."""
    user = f"/user/{s['name']}"
    page = await login(ctx, plan, s)
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "written before the node went"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    st, _ = await api(page, "PUT", f"{user}/api/contents/{SAVED}", {"type": "notebook", "format": "json", "content": nb})
    if st not in (200, 201):
        raise RuntimeError(f"saving {SAVED}: HTTP {st}")
    Path(plan["ready"]).touch()  # the harness now takes the node away
    t0 = time.monotonic()
    while True:  # the hub's home page: "Start My Server" once the hub knows the server is gone
        await page.goto(f"{plan['base']}/hub/home")
        if await page.locator("#start", has_text="Start My Server").count():
            break
        if time.monotonic() - t0 > plan["notice_s"]:
            raise RuntimeError(f"the hub still lists the server as running {plan['notice_s']} s after the node went")
        await asyncio.sleep(2)  # polling the hub's page, with a deadline
    noticed = round(time.monotonic() - t0, 1)
    await page.screenshot(path=str(Path(plan["screens"]) / f"slurm-{s['name']}-server-gone.png"))
    await page.click("#start")
    await page.wait_for_url("**/lab**", timeout=SPAWN_S * 1000)
    await page.wait_for_selector("#jp-main-dock-panel", timeout=SPAWN_S * 1000)
    st, model = await api(page, "GET", f"{user}/api/contents/{SAVED}?content=0")
    await page.screenshot(path=str(Path(plan["screens"]) / f"slurm-{s['name']}-after-lost-node.png"))
    return {"noticed_s": noticed, "restart_s": round(time.monotonic() - t0 - noticed, 1),
            "notebook_there": st == 200 and isinstance(model, dict)}


async def run_phase(phase: str, plan: dict) -> dict[str, Any]:
    """queue: every student logs in at once and leaves once in JupyterLab (the server goes idle: culled), the
    one served first at once, the others after waiting in the queue. lost-node: the plan's one student."""
    from playwright.async_api import async_playwright

    out: dict[str, Any] = {}
    async with async_playwright() as p:

        async def one(s: dict) -> None:
            """One student's browser and result."""
            ctx = await student_browser(p, plan, s)
            try:
                if phase == "queue":
                    r = await queued_login(ctx, plan, s)
                    r.pop("page")
                    out[s["name"]] = r
                else:
                    out[s["name"]] = await lose_the_node(ctx, plan, s)
            except Exception as e:  # noqa: BLE001 (reported per student)
                out[s["name"]] = {"error": first_line(e)}
            finally:
                await ctx.close()

        await asyncio.gather(*(one(s) for s in plan["students"]))
    return out
