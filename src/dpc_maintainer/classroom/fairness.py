"""The fairness measurement (`make classroom-fairness`): the class up, then student 1 runs a heavy lab (default
06-horovod) while student 2's kernel round trip is timed, idle and during that run; then student 2's kernel
allocates past its memory limit and must die alone (the classmate's kernel lives). The harness's side prints
the benchmark's lines (fairness_lines) and keeps build/classroom/<run>/fairness.json; the browser's side
(measure) runs in the hub's environment like the students' work.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpc_maintainer.classroom.browser import api, first_line, login, student_browser
from dpc_maintainer.classroom.common import SPAWN_S, StepFailed
from dpc_maintainer.classroom.students import start_browsers, work

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom


def fairness(room: Classroom, lab: str) -> dict[str, Any]:
    """Student 1 runs a heavy lab while student 2's kernel is timed, then goes past its memory limit."""
    t = room.timeline
    with t.step(f"fairness: {room.students[0].name} runs {lab}, {room.students[1].name}'s kernel timed"):
        res = start_browsers(room, "fairness", lab)
        r = res.get("fairness", {})
        for line in fairness_lines(r, lab, room.mem):
            print(f"classroom: {line}", flush=True)
        bad = [f"{n}: {x['error']}" for n, x in res.items() if isinstance(x, dict) and x.get("error")]
        if bad:
            raise StepFailed("; ".join(bad))
        (room.dir / "fairness.json").write_text(json.dumps(r, indent=1))
    return r


def _stats(ms: list[float]) -> str:
    """'median M ms, max X ms (n N)' of round-trip times."""
    if not ms:
        return "no sample"
    s = sorted(ms)
    return f"median {s[len(s) // 2]:.0f} ms, max {s[-1]:.0f} ms (n {len(s)})"


def fairness_lines(r: dict[str, Any], lab: str, mem: str) -> list[str]:
    """The benchmark's lines: the classmate's round trips idle and busy, their ratio, the memory kill."""
    if not r.get("idle_ms"):
        return ["fairness: no measurement"]
    idle, busy = sorted(r["idle_ms"]), sorted(r.get("busy_ms", []))
    lines = [f"fairness: classmate's kernel round trip, class idle: {_stats(idle)}",
             f"fairness: classmate's kernel round trip while a student runs {lab} (Run All "
             f"{r.get('heavy_run_all_s', '?')} s): {_stats(busy)}"]
    if busy:
        med = busy[len(busy) // 2]
        lines.append(f"fairness: busy/idle median ratio {med / max(idle[len(idle) // 2], 1e-3):.1f}; "
                     f"goal median <= 1000 ms: {'met' if med <= 1000 else 'MISSED'}")
    if "oom" in r:
        o = r["oom"]
        lines.append(f"fairness: a kernel that allocates past the {mem} limit: {o.get('state', '?')} after "
                     f"{o.get('after_s', '?')} s; the other student's kernel: {o.get('other', '?')}")
    return lines


JS_ROUND_TRIPS = """async ([url, n, gapMs, code, untilFlag]) => {
  // Kernel round trips over the kernel's websocket (the way JupyterLab talks to it): send an
  // execute_request, wait for its execute_reply. Returns milliseconds per request.
  const ws = new WebSocket(url);
  await new Promise((ok, bad) => { ws.onopen = ok; ws.onerror = () => bad(new Error('websocket failed')); });
  const session = crypto.randomUUID(), times = [];
  const one = (src) => new Promise((ok) => {
    const id = crypto.randomUUID();
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.parent_header && m.parent_header.msg_id === id && m.msg_type === 'execute_reply') ok(m.content.status);
    };
    ws.send(JSON.stringify({channel: 'shell', buffers: [], metadata: {}, parent_header: {},
      header: {msg_id: id, session, username: '', msg_type: 'execute_request', version: '5.3',
               date: new Date().toISOString()},
      content: {code: src, silent: false, store_history: false, user_expressions: {}, allow_stdin: false,
                stop_on_error: true}}));
  });
  for (let i = 0; untilFlag ? !window[untilFlag] : i < n; i++) {
    const t0 = performance.now();
    await one(code);
    times.push(performance.now() - t0);
    await new Promise((ok) => setTimeout(ok, gapMs));  // the sampling interval, not a wait for an event
  }
  ws.close();
  return times;
}"""
JS_PAST_LIMIT = """async ([url, code, timeoutMs]) => {
  // Run code that allocates past the memory limit; resolve with the first kernel status that says it
  // died ('restarting', 'dead'), or 'finished' when it ran to its reply, or 'no answer' at the deadline.
  const ws = new WebSocket(url);
  await new Promise((ok, bad) => { ws.onopen = ok; ws.onerror = () => bad(new Error('websocket failed')); });
  const id = crypto.randomUUID(), t0 = performance.now();
  const state = await new Promise((ok) => {
    setTimeout(() => ok('no answer'), timeoutMs);
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.msg_type === 'status' && ['restarting', 'dead'].includes(m.content.execution_state)) ok(m.content.execution_state);
      if (m.parent_header && m.parent_header.msg_id === id && m.msg_type === 'execute_reply') ok('finished');
    };
    ws.send(JSON.stringify({channel: 'shell', buffers: [], metadata: {}, parent_header: {},
      header: {msg_id: id, session: crypto.randomUUID(), username: '', msg_type: 'execute_request',
               version: '5.3', date: new Date().toISOString()},
      content: {code, silent: false, store_history: false, user_expressions: {}, allow_stdin: false,
                stop_on_error: true}}));
  });
  ws.close();
  return {state, after_s: Math.round((performance.now() - t0) / 100) / 10};
}"""
IDLE_SAMPLES = 20
GAP_MS = 250


def past_limit_code(mem: str) -> str:
    """Python that touches 1.5 times the memory limit (numpy ones, page by page), then prints."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    n = int(float(mem[:-1]) * units[mem[-1].upper()]) if mem[-1:].upper() in units else int(mem)
    return f"import numpy as np\nx = np.ones({int(n * 1.5) // 8}, dtype=np.float64)\nprint(x.sum())"


async def probe_kernel(page: Any, plan: dict, user: str) -> tuple[str, str]:
    """A fresh kernel in the user's server (the kernels API), answering; returns its id and websocket URL."""
    st, k = await api(page, "POST", f"{user}/api/kernels", {"name": "python3"})
    if st not in (200, 201):
        raise RuntimeError(f"starting a kernel: HTTP {st} {k}")
    ws = plan["base"].replace("http://", "ws://") + f"{user}/api/kernels/{k['id']}/channels"
    # The server calls a kernel 'starting' until a client talks to it: the first request is the wait.
    try:
        await asyncio.wait_for(page.evaluate(JS_ROUND_TRIPS, [ws, 1, 0, "1 + 1", None]), SPAWN_S)
    except asyncio.TimeoutError:
        raise RuntimeError(f"the probe kernel did not answer within {SPAWN_S} s") from None
    return k["id"], ws


@dataclass
class Measurement:
    """One measurement in the browser: the heavy student, the probe student, and what they share (the moment
    of Run All, the end of the heavy run, their browsers and the results)."""

    plan: dict
    heavy: dict
    probe: dict
    ctxs: list[Any] = field(default_factory=list)
    together: asyncio.Barrier = field(default_factory=lambda: asyncio.Barrier(2))
    done: asyncio.Event = field(default_factory=asyncio.Event)
    out: dict[str, Any] = field(default_factory=lambda: {"fairness": {}})

    async def run_heavy(self) -> None:
        """Student 1: the lab, filled, Run All with the classmate; its Run All seconds go in the result."""
        try:
            self.out[self.heavy["name"]] = await work(self.ctxs[0], self.plan, self.heavy, self.together)
            nb = next(iter(self.out[self.heavy["name"]]["notebooks"].values()))
            self.out["fairness"]["heavy_run_all_s"] = nb["run_all_s"]
        except BaseException:
            await self.together.abort()  # the classmate waiting for Run All stops too
            raise
        finally:
            self.done.set()

    async def run_probe(self) -> None:
        """Student 2: the probe's steps; a failure stops the classmate waiting to press Run All too."""
        try:
            await self.probe_steps()
        except BaseException:
            await self.together.abort()  # the classmate waiting to press Run All stops too
            raise

    async def probe_steps(self) -> None:
        """Log in, start a probe kernel, time it idle and busy, then take it past the memory limit."""
        page = await login(self.ctxs[1], self.plan, self.probe)
        user = f"/user/{self.probe['name']}"
        kid, ws = await probe_kernel(page, self.plan, user)
        await self.round_trips(page, ws)
        if self.out.get(self.heavy["name"], {}).get("error"):
            return
        await self.past_the_limit(page, user, kid, ws)

    async def round_trips(self, page: Any, ws: str) -> None:
        """The probe kernel's round trips with the class idle, then for as long as the classmate's Run All lasts."""
        r = self.out["fairness"]
        r["idle_ms"] = await page.evaluate(JS_ROUND_TRIPS, [ws, IDLE_SAMPLES, GAP_MS, "1 + 1", None])
        await self.together.wait()  # the classmate presses Run All now
        await page.evaluate("() => { window.dpcHeavyDone = false; }")
        busy = asyncio.ensure_future(page.evaluate(JS_ROUND_TRIPS, [ws, 0, GAP_MS, "1 + 1", "dpcHeavyDone"]))
        await self.done.wait()
        await page.evaluate("() => { window.dpcHeavyDone = true; }")
        r["busy_ms"] = await busy

    async def past_the_limit(self, page: Any, user: str, kid: str, ws: str) -> None:
        """The probe kernel allocates past the memory limit: it is killed (and restarted), the classmate's lives."""
        r = self.out["fairness"]
        hpage = self.ctxs[0].pages[0]
        huser = f"/user/{self.heavy['name']}"
        st, before = await api(hpage, "GET", f"{huser}/api/kernels")
        r["oom"] = await page.evaluate(JS_PAST_LIMIT, [ws, past_limit_code(self.plan["mem"]), 300_000])
        st2, after = await api(hpage, "GET", f"{huser}/api/kernels")
        ids = {k["id"] for k in before or []} if st == 200 else set()
        alive = st2 == 200 and ids and ids <= {k["id"] for k in after or []}
        _, mine = await api(page, "GET", f"{user}/api/kernels/{kid}")
        r["oom"]["other"] = "alive, same kernel" if alive else f"LOST (before {before}, after {after})"
        r["oom"]["own_kernel_after"] = mine.get("execution_state") if isinstance(mine, dict) else mine
        if r["oom"]["state"] not in ("restarting", "dead") or not alive:
            raise RuntimeError(f"past the memory limit: {r['oom']}")


async def measure(plan: dict) -> dict[str, Any]:
    """The browser phase 'fairness': student 1 runs the lab (filled, Run All); student 2's kernel is timed idle,
    then during that run; then student 2's kernel allocates past the memory limit and must die alone."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        m = Measurement(plan, {**plan["students"][0], "filled": True}, plan["students"][1])
        for s in (m.heavy, m.probe):
            m.ctxs.append(await student_browser(p, plan, s))
        try:
            results = await asyncio.gather(m.run_heavy(), m.run_probe(), return_exceptions=True)
            for name, res in zip((m.heavy["name"], m.probe["name"]), results):
                if isinstance(res, BaseException):
                    m.out[name] = {"error": first_line(res)}
        finally:
            for ctx in m.ctxs:
                await ctx.close()
    return m.out
