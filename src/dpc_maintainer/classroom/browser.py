"""The students' browser, the tools: each student's own Chromium (Playwright driving /usr/bin/chromium, a profile
folder each), logging in on the hub, REST calls of the user's Jupyter server from their page, JupyterLab's
menus, a kernel that is idle, and saving a notebook until its copy on disk shows the run.

Runs in the hub's environment (Playwright is not in the course's): started as `... classroom --browser PHASE`.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any

from dpc_maintainer.classroom.common import CHROMIUM, CHROMIUM_FLAGS, PRESS_S, SAVE_S, SPAWN_S

JS_API = """async ([method, url, body]) => {
  const m = document.cookie.match(/(?:^|; )_xsrf=([^;]*)/);
  const headers = {'Content-Type': 'application/json'};
  if (m) headers['X-XSRFToken'] = decodeURIComponent(m[1]);
  const r = await fetch(url, {method, headers, credentials: 'same-origin',
                              body: body === null ? undefined : JSON.stringify(body)});
  return {status: r.status, text: await r.text()};
}"""
JS_PROMPTS = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
  .map(e => e.textContent.trim())"""


async def api(page: Any, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """A REST call of the user's Jupyter server from their page (their cookies, their XSRF token)."""
    r = await page.evaluate(JS_API, [method, url, body])
    try:
        return int(r["status"]), json.loads(r["text"]) if r["text"] else None
    except json.JSONDecodeError:
        return int(r["status"]), r["text"]


async def login(ctx: Any, plan: dict, s: dict) -> Any:
    """Log in on the hub's page; returns the page once the user's JupyterLab is up."""
    page = ctx.pages[0] if ctx.pages else await ctx.new_page()
    await page.goto(f"{plan['base']}/hub/login")
    if await page.locator("#username_input").count():
        await page.fill("#username_input", s["name"])
        await page.fill("#password_input", s["password"])
        await page.click("#login_submit")
    else:  # logged in already (this browser's profile has the hub's cookie)
        await page.goto(f"{plan['base']}/hub/user-redirect/lab")
    # The user's JupyterLab, or the hub's error (a refused login, a failed spawn): whichever comes first.
    await page.wait_for_function(
        "() => location.pathname.includes('/lab') || document.querySelector('div.error, .progress-bar.bg-danger') !== null",
        timeout=SPAWN_S * 1000, polling=500)
    if "/lab" not in page.url:
        text = " ".join((await page.inner_text("body")).split())[:300]
        raise RuntimeError(f"login/spawn failed at {page.url}: {text}")
    await page.wait_for_selector("#jp-main-dock-panel", timeout=SPAWN_S * 1000)
    return page


async def student_browser(p: Any, plan: dict, s: dict) -> Any:
    """A student's own Chromium: a persistent context with a profile folder of its own (their cookies)."""
    profile = Path(plan["profiles"]) / s["name"]
    profile.mkdir(parents=True, exist_ok=True)
    ctx = await p.chromium.launch_persistent_context(
        str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
        viewport={"width": 1400, "height": 900})
    ctx.set_default_timeout(120_000)
    return ctx


def first_line(e: BaseException) -> str:
    """A student's failure as one line: the exception's type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


async def save(page: Any, user: str, path: str, deadline: float) -> None:
    """File > Save Notebook, then wait for the save itself: JupyterLab's PUT of the notebook, answered (2xx).

    Only then may the harness read the notebook back through the contents API. A GET while the PUT still writes
    reads a half-written file, which jupyter_server takes for a corrupt one and repairs: it moves the file aside
    (.invalid) and restores the save's .~ backup, which the save removes as it ends: the notebook is gone and the
    save ends in 'File Save Error ... No such file or directory' (classroom run 20261128-060211, student 2).
    A press that starts no save within PRESS_S (the menu did not take the click; seen once: lab 9's unfilled
    notebook reached the disk only by autosave, which the harness turns off) is pressed again, to the deadline.
    """
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    target = f"{user}/api/contents/{path}"

    def is_save(r: Any) -> bool:
        """The response to JupyterLab's PUT of this notebook."""
        return r.request.method == "PUT" and urllib.parse.unquote(urllib.parse.urlsplit(r.url).path) == target

    while True:
        try:
            async with page.expect_response(is_save, timeout=PRESS_S * 1000) as saved:
                await click_menu(page, "File", "Save Notebook")
            r = await saved.value
            break
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise RuntimeError(f"File > Save Notebook: no save of {path} began (no PUT)") from None
    if not r.ok:
        raise RuntimeError(f"saving {path}: HTTP {r.status} {(await r.text())[:200]}")


async def save_run(page: Any, user: str, path: str, filled: bool) -> tuple[list[dict], list[str], int]:
    """Save the notebook until its copy on disk shows the run (every cell ran; the unfilled lab: its error), or
    SAVE_S passes; returns that copy's code cells, error names and cells that ran. Each read follows a finished
    save (save()); a saved copy that lacks the run (outputs that reached the page after the save) is saved again."""
    deadline = time.monotonic() + SAVE_S
    while True:
        await save(page, user, path, deadline)
        st, after = await api(page, "GET", f"{user}/api/contents/{path}?content=1&type=notebook")
        if st != 200 or not isinstance(after, dict) or not isinstance(after.get("content"), dict):
            raise RuntimeError(f"{Path(path).name}: GET after saving: HTTP {st}")
        code = [c for c in after["content"]["cells"] if c["cell_type"] == "code"]
        errors = [o.get("ename", "") for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        ran = sum(c.get("execution_count") is not None for c in code)
        if (ran == len(code) if filled else bool(errors)) or time.monotonic() > deadline:
            return code, errors, ran
        await asyncio.sleep(0.5)  # polling the saved file, with a deadline


async def click_menu(page: Any, menu: str, *items: str) -> None:
    """Click a JupyterLab menu, then one of its items, and so on down its submenus (by their labels)."""
    await page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    for item in items:
        await page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()


async def kernel_idle(page: Any, user: str, path: str, timeout: float) -> None:
    """Wait until the notebook's kernel exists and is idle (the server's sessions API)."""
    deadline = time.monotonic() + timeout
    while True:
        st, sessions = await api(page, "GET", f"{user}/api/sessions")
        states = [x["kernel"]["execution_state"] for x in (sessions if st == 200 else [])
                  if x.get("path") == path and x.get("kernel")]
        if states and all(s == "idle" for s in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the kernel of {path} is not idle within {timeout:.0f} s (states {states})")
        await asyncio.sleep(0.25)  # polling the kernel's state, with a deadline
