"""The students' browser work: every student logs in in Chromium, first follows chapter 5's "Open on your class
hub" on the course's website (the first lab only: nbgitpuller clones the release into their home, JupyterLab
opens the chapter), clicks the lab's nbgitpuller link, gets the lab's answer cells from the reference solution
through their own Jupyter server (odd students; even ones hand in the lab unfilled), all press Run All at the
same time, save, and hand in the way the student README says: `make submit LAB=<lab>` typed in a JupyterLab
terminal, which hands in the copy they worked on. After grading, each student opens their own feedback page (HTTP 200) and is refused a
classmate's.

The harness's side (start_browsers, students_do) writes a plan and starts this package again in the hub's
environment (Playwright is not in the course's) as `... classroom --browser work|feedback --plan FILE`; the
browser's side (run_browsers and what it calls) reads the plan and writes each student's result.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpc_maintainer.classroom.browser import (
    JS_PROMPTS,
    api,
    click_menu,
    first_line,
    kernel_idle,
    login,
    save_run,
    student_browser,
)
from dpc_maintainer.classroom.common import CHAPTER, FOLDER, ROOT, RUN_ALL_S, SPAWN_S, StepFailed, run
from dpc_maintainer.classroom.grading import feedback_pages
from dpc_maintainer.classroom.release import pull_link, submissions

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom


def start_browsers(room: Classroom, phase: str, lab: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a browser phase (work, feedback, fairness; on SLURM queue, lost-node) for every student at once in the
    hub's environment; extra overrides entries of the plan (its students, say)."""
    plan = {"base": room.base, "repo": room.repo, "lab": lab, "folder": FOLDER, "exchange": str(room.exchange),
            "screens": str(room.dir / "screens"), "profiles": str(room.dir / "profiles"),
            "students": [asdict(s) for s in room.students],
            "answers": answers(lab) if phase in ("work", "fairness") else {},
            "mem": room.mem,
            "book": str(room.book or ""), "chapter": CHAPTER if lab == room.labs[0] else "",
            "chapter_title": chapter_title(),
            "feedback": feedback_pages(room, lab) if phase == "feedback" else {}, **(extra or {})}
    plan_file = room.dir / f"plan-{phase}-{lab}.json"
    plan_file.write_text(json.dumps(plan))
    plan_file.chmod(0o600)
    result = room.dir / f"result-{phase}-{lab}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("VIRTUAL_ENV", None)
    run([str(room.cache / "venv/bin/python"), "-m", "dpc_maintainer.classroom", "--browser", phase,
         "--plan", str(plan_file), "--result", str(result)], f"browser {phase}", room.log,
        timeout=SPAWN_S + RUN_ALL_S + 300, env=env, cwd=ROOT)
    out: dict[str, Any] = json.loads(result.read_text())
    return out


def students_do(room: Classroom, phase: str, lab: str) -> None:
    """A browser phase for every student; print what each did, StepFailed naming those that failed."""
    res = start_browsers(room, phase, lab)
    for name, r in sorted(res.items()):
        print(f"classroom:   {name}: {json.dumps(r, sort_keys=True)}")
    bad = [f"{n}: {r['error']}" for n, r in res.items() if r.get("error")]
    if bad:
        raise StepFailed("; ".join(bad))


def answers(lab: str) -> dict[str, dict[str, str]]:
    """Per notebook of the lab, the reference's answer cells (grade id -> the cell's whole source)."""
    out = {}
    for nb_path in sorted((ROOT / "solutions" / lab).glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        cells = {}
        for c in nb["cells"]:
            meta = c.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") and not meta.get("grade"):
                src = c["source"]
                cells[meta["grade_id"]] = src if isinstance(src, str) else "".join(src)
        out[nb_path.name] = cells
    return out


def chapter_title() -> str:
    """CHAPTER's title (its first heading), as JupyterLab shows it at the top of the notebook."""
    from dpc_instructor.release import first_heading  # the harness's side (the course's environment)

    return first_heading(ROOT / CHAPTER)


# ---------------------------------------------------------------- the browser (hub's environment)


async def open_chapter(page: Any, plan: dict, name: str) -> float:
    """From the course's website (file://), follow a chapter's "Open on your class hub": nbgitpuller pulls the
    release into the student's home and JupyterLab opens the chapter there. Seconds it took."""
    t0 = time.monotonic()
    chapter, folder = plan["chapter"], plan["folder"]
    await page.goto((Path(plan["book"]) / chapter).with_suffix(".html").as_uri())
    await page.click("a.dpc-hub")
    await page.wait_for_url(f"**/user/{name}/lab/tree/{folder}/{chapter}**", timeout=SPAWN_S * 1000)
    await page.wait_for_function(
        "t => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) h1')].some(h => h.textContent.includes(t))",
        arg=plan["chapter_title"], timeout=SPAWN_S * 1000, polling=200)
    await kernel_idle(page, f"/user/{name}", f"{folder}/{chapter}", SPAWN_S)  # the chapter, ready to run
    st, model = await api(page, "GET", f"/user/{name}/api/contents/{folder}/{chapter}?content=0")
    if st != 200 or not isinstance(model, dict) or model.get("type") != "notebook":
        raise RuntimeError(f"{chapter} is open but not in the home's {folder}/ (HTTP {st})")
    await page.screenshot(path=str(Path(plan["screens"]) / f"chapter-{name}.png"))
    return round(time.monotonic() - t0, 1)


async def pull_lab(page: Any, plan: dict, name: str) -> float:
    """Click the lab's nbgitpuller link (on a page, as students get it) until the lab's folder is listed; seconds."""
    t0 = time.monotonic()
    lab, folder = plan["lab"], plan["folder"]
    link = pull_link(plan["base"], plan["repo"], f"labs/{lab}")
    # The link as students get it: on a page, clicked.
    await page.set_content(f'<a id="lab-link" href="{link}">Lab {lab}</a>')
    await page.click("#lab-link")
    await page.wait_for_url(f"**/user/{name}/lab/tree/{folder}/labs/{lab}**", timeout=SPAWN_S * 1000)
    await page.wait_for_selector(".jp-DirListing-item", timeout=SPAWN_S * 1000)
    await page.screenshot(path=str(Path(plan["screens"]) / f"{lab}-{name}-1-pulled.png"))
    return round(time.monotonic() - t0, 1)


async def open_alone(page: Any, plan: dict, user: str, path: str) -> None:
    """Open the notebook as the only one, its kernel idle: other sessions end and the workspace is reset."""
    # A student moving on from an earlier lab (CLASSROOM_LAB=all): its kernels end (they would hold
    # memory under the user's limit) and the workspace is reset, so only this lab's notebook is open.
    st, sessions = await api(page, "GET", f"{user}/api/sessions")
    for x in sessions if st == 200 else []:
        if x.get("path") != path:
            await api(page, "DELETE", f"{user}/api/sessions/{x['id']}")
    await page.goto(f"{plan['base']}{user}/lab/tree/{path}?reset")
    await page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell", timeout=SPAWN_S * 1000)
    await kernel_idle(page, user, path, SPAWN_S)


async def run_all(page: Any, plan: dict, name: str, path: str) -> float:
    """Run > Run All Cells, until no cell's prompt shows '*'; the seconds that took (then a screenshot)."""
    t0 = time.monotonic()
    await click_menu(page, "Run", "Run All Cells")
    await page.wait_for_function(
        f"() => ({JS_PROMPTS})().some(p => /[0-9*]/.test(p))", timeout=60_000, polling=200)
    await page.wait_for_function(
        f"() => !({JS_PROMPTS})().some(p => p.includes('*'))", timeout=RUN_ALL_S * 1000, polling=500)
    run_s = round(time.monotonic() - t0, 1)
    await kernel_idle(page, f"/user/{name}", path, 60)
    shot = Path(plan["screens"]) / f"{plan['lab']}-{name}-2-ran-{Path(path).stem}.png"
    await page.screenshot(path=str(shot), full_page=False)
    return run_s


def check_run(nb_name: str, filled: bool, code: list[dict], errors: list[str], ran: int) -> None:
    """The saved run as it must be: filled, every cell ran without error; unfilled, an error shows."""
    if filled and (errors or ran != len(code)):
        raise RuntimeError(f"{nb_name}: {ran}/{len(code)} cells ran, errors {errors}")
    if not filled and not errors:
        raise RuntimeError(f"{nb_name}: the unfilled lab's saved run shows no error ({ran}/{len(code)} cells ran)")


async def work(ctx: Any, plan: dict, s: dict, start_together: asyncio.Barrier) -> dict[str, Any]:
    """One student: log in, pull the lab by the link, fill it (or not), Run All, save, check the result."""
    name = s["name"]
    res: dict[str, Any] = {"filled": s["filled"]}
    t0 = time.monotonic()
    page = await login(ctx, plan, s)
    res["login_s"] = round(time.monotonic() - t0, 1)
    if plan["chapter"] and plan["book"]:
        res["chapter_s"] = await open_chapter(page, plan, name)
    res["pull_s"] = await pull_lab(page, plan, name)
    user = f"/user/{name}"
    await harness_settings(page, user)
    res["notebooks"] = {}
    for nb_name, cells in plan["answers"].items():
        path = f"{plan['folder']}/labs/{plan['lab']}/{nb_name}"
        if s["filled"]:
            await fill(page, user, path, cells)
        await open_alone(page, plan, user, path)
        await start_together.wait()  # every student presses Run All at the same moment
        run_s = await run_all(page, plan, name, path)
        code, errors, ran = await save_run(page, user, path, s["filled"])
        res["notebooks"][nb_name] = {"run_all_s": run_s, "cells": len(code), "ran": ran, "errors": errors}
        check_run(nb_name, s["filled"], code, errors, ran)
    res["submit_s"] = await hand_in(page, plan, name)
    return res


async def hand_in(page: Any, plan: dict, name: str) -> float:
    """File > New > Terminal, then `make submit LAB=<lab>` typed in it, as the student README says; the seconds
    until the exchange holds the hand-in (then a screenshot of the terminal)."""
    t0 = time.monotonic()
    lab, had = plan["lab"], len(submissions(Path(plan["exchange"]), name, plan["lab"]))
    await click_menu(page, "File", "New", "Terminal")
    term = page.locator(".jp-Terminal .xterm").last
    await term.wait_for(timeout=SPAWN_S * 1000)
    await term.click()
    await page.keyboard.type(f"cd ~/{plan['folder']} && make submit LAB={lab}\n")
    deadline = time.monotonic() + SPAWN_S
    while len(submissions(Path(plan["exchange"]), name, lab)) == had:
        if time.monotonic() > deadline:
            raise RuntimeError(f"make submit LAB={lab}: no hand-in in the exchange within {SPAWN_S} s")
        await asyncio.sleep(0.5)  # polling the exchange for the hand-in, with a deadline
    await page.screenshot(path=str(Path(plan["screens"]) / f"{lab}-{name}-2-handed-in.png"))
    return round(time.monotonic() - t0, 1)


async def fill(page: Any, user: str, path: str, cells: dict[str, str]) -> None:
    """Write the answer cells (by their nbgrader grade_id) into the student's copy, through their server, before
    JupyterLab opens it."""
    st, model = await api(page, "GET", f"{user}/api/contents/{path}?content=1&type=notebook")
    if st != 200:
        raise RuntimeError(f"GET {path}: HTTP {st}")
    nb = model["content"]
    n = 0
    for c in nb["cells"]:
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in cells:
            c["source"] = cells[gid]
            n += 1
    if n != len(cells):
        raise RuntimeError(f"{Path(path).name}: {n} of {len(cells)} answer cells found in the student's copy")
    st, _ = await api(page, "PUT", f"{user}/api/contents/{path}", {"type": "notebook", "format": "json", "content": nb})
    if st not in (200, 201):
        raise RuntimeError(f"PUT {path}: HTTP {st}")


async def harness_settings(page: Any, user: str) -> None:
    """The student's JupyterLab settings the harness needs (read as JupyterLab next loads): every cell in the page
    (no windowing), so that the prompts of all cells can be read; no autosave, so that every save of a notebook
    is one the harness pressed and waits for (browser.save) before it reads the notebook back."""
    for plugin, raw in (("notebook-extension:tracker", {"windowingMode": "none"}),
                        ("docmanager-extension:plugin", {"autosave": False})):
        st, _ = await api(page, "PUT", f"{user}/lab/api/settings/@jupyterlab/{plugin}", {"raw": json.dumps(raw)})
        if st not in (200, 204):
            raise RuntimeError(f"settings PUT {plugin}: HTTP {st}")


async def feedback(ctx: Any, plan: dict, s: dict, others: dict[str, list[str]]) -> dict[str, Any]:
    """One student opens their feedback pages (200) and a classmate's (must be refused)."""
    shots = Path(plan["screens"])
    res: dict[str, Any] = {"own": {}, "classmate": {}}
    page = await login(ctx, plan, s)
    for rel in plan["feedback"][s["name"]]:
        r = await page.goto(f"{plan['base']}/user/{s['name']}/files/{rel}")
        status = r.status if r is not None else 0
        res["own"][rel] = status
        await page.screenshot(path=str(shots / f"{plan['lab']}-{s['name']}-3-feedback.png"), full_page=True)
        text = await page.inner_text("body")
        if status != 200 or plan["lab"] not in text and "score" not in text.lower():
            raise RuntimeError(f"own feedback {rel}: HTTP {status}, page {text[:200]!r}")
    for other, rels in others.items():
        r = await page.goto(f"{plan['base']}/user/{other}/files/{rels[0]}")
        status = r.status if r is not None else 0
        res["classmate"][other] = status
        await page.screenshot(path=str(shots / f"{plan['lab']}-{s['name']}-4-refused.png"))
        if status not in (403, 404):
            raise RuntimeError(f"{other}'s feedback: HTTP {status}, not refused")
    return res


async def run_browsers(phase: str, plan: dict) -> dict[str, Any]:
    """Every student in their own Chromium (a profile folder each), all at once (work or feedback)."""
    from playwright.async_api import async_playwright

    out: dict[str, Any] = {}
    together = asyncio.Barrier(len(plan["students"]))
    async with async_playwright() as p:

        async def one(s: dict) -> None:
            """One student's browser, its result or its failure (with screenshots)."""
            ctx = await student_browser(p, plan, s)
            try:
                if phase == "work":
                    out[s["name"]] = await work(ctx, plan, s, together)
                else:
                    others = {k: v for k, v in plan["feedback"].items() if k != s["name"]}
                    out[s["name"]] = await feedback(ctx, plan, s, others)
            except Exception as e:  # noqa: BLE001 (reported per student, with a screenshot)
                out[s["name"]] = {"error": first_line(e)}
                if phase == "work":
                    await together.abort()  # the classmates waiting to press Run All stop too
                for i, pg in enumerate(ctx.pages):
                    with contextlib.suppress(Exception):
                        await pg.screenshot(path=str(Path(plan["screens"]) / f"{plan['lab']}-{s['name']}-failed-{i}.png"))
            finally:
                await ctx.close()

        await asyncio.gather(*(one(s) for s in plan["students"]))
    return out
