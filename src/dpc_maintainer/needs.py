"""Time every notebook with its defaults (idle, at a student's share of a busy class hub, and on a busy
node) and write the three figures into each notebook's Needs line.

    python -m dpc_maintainer.needs measure --mode idle [--only SUBSTRING] [--out build/needs]
    python -m dpc_maintainer.needs measure --mode class-node [--cpu 1.5] [--only ...]   # root
    python -m dpc_maintainer.needs measure --mode busy-node [--load 8] [--only ...]
    python -m dpc_maintainer.needs write [--out build/needs]

`measure` runs the notebooks as `make solutions` does (dpc_maintainer.solutions: defaults, a fresh
kernel each) into OUT/<mode>/ (report.json has each notebook's wall time; the executed copies can be
committed with dpc_maintainer.outputs). `--mode idle` runs them alone. `--mode class-node` runs them
in a cgroup with the hub's CPU quota (`--cpu`, the cores each student gets: the classroom's and the
hub config's `cpu_limit`) while a classmate's launch runs beside them, over and over (two torchrun
ranks training examples/scaling/ddp_worker.py), in a cgroup that has the rest of the machine; both
cgroups are removed at the end with whatever is left in them. `--mode busy-node` runs them beside
CPU hogs (busy loops, `--load` minus the cores of them: on 2 cores, load 8 is six hogs beside the
notebook's own two threads, four runnable threads per core: a node shared with other users' jobs
and no quota), stopped at the end; it samples the load average while it runs. OUT/<mode>/
conditions.json says what the run had (share, the classmate's launches, the hogs, the load). `write`
puts the measured figures into the Needs line of every notebook measured (course/ and solutions/;
labs/ follow with `python -m dpc_instructor.labs generate`), keeping a figure no run measured this
time, and writes OUT/needs.md, the table for the notes.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dpc_instructor.hub.cgroups import UserCgroup, join_cgroup_then

ROOT = Path(__file__).resolve().parents[2]
MODES = ("idle", "class-node", "busy-node")
CLASSMATE = ROOT / "examples" / "scaling" / "ddp_worker.py"
_START = (r"^\*\*Needs:\*\* (?P<cores>\d+) CPU cores?, (?P<gb>\d+(?:\.\d+)?) GB of memory, "
          r"about (?P<idle>\d+) minutes? on a 2-core laptop without a GPU")
_SHARE = (r", about (?P<busy>\d+) minutes? at a class hub's share \((?P<share>\d+(?:\.\d+)?) cores, "
          r"a classmate's launch beside it\)")
_LOADED = r", about (?P<loaded>\d+) minutes? on a busy node \(load (?P<load>\d+) on 2 cores\)"
_GPU = r" \(one GPU: (?P<gpu>[^)]+)\)\.$"
# The Needs line of a notebook's opening (tests/test_notebook_rules.py holds every notebook to it).
NEEDS = re.compile(_START + _SHARE + _LOADED + _GPU, re.M)
# Any line a measurement can update: the same with figures not measured yet (older lines) left out.
SOME_NEEDS = re.compile(_START + f"(?:{_SHARE})?(?:{_LOADED})?" + _GPU, re.M)


def minutes(seconds: float) -> int:
    """Whole minutes, the nearest (at least 1): what a Needs line says."""
    return max(1, int(seconds / 60 + 0.5))


def _min(n: int) -> str:
    return f"{n} minute" + ("" if n == 1 else "s")


def needs_line(cores: int, gb: str, idle_s: float, busy_s: float, share: float, gpu: str,
               loaded_s: float, load: int) -> str:
    """The Needs line of a notebook that ran idle_s seconds alone, busy_s at a hub's share and loaded_s on
    a busy node at this load."""
    return (f"**Needs:** {cores} CPU cores, {gb} GB of memory, about {_min(minutes(idle_s))} on a 2-core "
            f"laptop without a GPU, about {_min(minutes(busy_s))} at a class hub's share ({share:g} cores, "
            f"a classmate's launch beside it), about {_min(minutes(loaded_s))} on a busy node (load {load} "
            f"on 2 cores) (one GPU: {gpu}).")


def rewrite_needs(text: str, idle_s: float | None = None, busy_s: float | None = None,
                  share: float | None = None, loaded_s: float | None = None, load: int | None = None) -> str:
    """text (a notebook's opening) with its Needs line given these figures (None: the line's own);
    ValueError if it has no Needs line or lacks a figure not given."""
    found = SOME_NEEDS.search(text)
    if not found:
        raise ValueError("no Needs line in the notebook's opening")

    def given(value: float | None, group: str, what: str, unit: float = 60.0) -> float:
        if value is not None:
            return value
        if found[group] is None:
            raise ValueError(f"the Needs line has no {what} yet: measure it (dpc_maintainer.needs measure)")
        return float(found[group]) * unit  # minutes -> seconds; a share or a load as it is

    line = needs_line(int(found["cores"]), found["gb"], given(idle_s, "idle", "idle figure"),
                      given(busy_s, "busy", "class hub's figure"), given(share, "share", "class hub's share", 1),
                      found["gpu"], given(loaded_s, "loaded", "busy node's figure"),
                      int(given(load, "load", "busy node's load", 1)))
    return text[:found.start()] + line + text[found.end():]


def _seconds(out: Path, mode: str) -> dict[str, float]:
    """notebook path -> wall seconds of the passed runs of OUT/<mode>/report.json."""
    path = out / mode / "report.json"
    if not path.exists():
        return {}
    return {r["notebook"]: r["seconds"] for r in json.loads(path.read_text())["notebooks"]
            if r["status"] == "passed"}


def _conditions(out: Path, mode: str) -> dict:
    path = out / mode / "conditions.json"
    return json.loads(path.read_text()) if path.exists() else {}


def write(out: Path, root: Path = ROOT) -> str:
    """Update the Needs line of every notebook (under root) measured in any mode (a figure not measured
    keeps the line's); write and return OUT/needs.md."""
    idle, busy, loaded = (_seconds(out, m) for m in MODES)
    share, load = _conditions(out, "class-node").get("cpu"), _conditions(out, "busy-node").get("load")
    rows = ["| notebook | idle | class hub's share | busy node | share / idle | busy / idle |",
            "|---|---|---|---|---|---|"]
    updated: dict[Path, dict] = {}  # every line first: a figure missing writes no notebook
    for rel in sorted(set(idle) | set(busy) | set(loaded)):
        nb = updated[root / rel] = json.loads((root / rel).read_text())
        cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown" and
                    SOME_NEEDS.search("".join(c["source"])))
        text = rewrite_needs("".join(cell["source"]), idle.get(rel), busy.get(rel),
                             share if rel in busy else None, loaded.get(rel), load if rel in loaded else None)
        cell["source"] = text.splitlines(keepends=True)
        figures = [f"{d[rel]:.0f} s" if rel in d else "-" for d in (idle, busy, loaded)]
        ratios = [f"{d[rel] / idle[rel]:.2f}" if rel in d and rel in idle else "-" for d in (busy, loaded)]
        rows.append("| " + " | ".join([rel, *figures, *ratios]) + " |")
    for path, nb in updated.items():
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    table = "\n".join(rows) + "\n"
    (out / "needs.md").write_text(table)
    return table


def classmate() -> int:
    """Launch the classmate's training again and again until stopped (SIGTERM)."""
    from helpers import LaunchError, launch

    done = 0
    while True:
        try:
            launch(CLASSMATE, 2, args=["train", "--epochs", "3"], echo=False, timeout=600)
        except LaunchError as e:  # a classmate's failure is theirs: they launch again
            print(f"classmate: a launch failed: {str(e).splitlines()[0]}", flush=True)
            continue
        done += 1
        print(f"classmate: launch {done} done", flush=True)


HOG = "while True: pass"


def _timed(runner: list[str], conditions: dict[str, object], **popen: Any) -> int:
    """Run the notebooks (the solutions runner); its wall seconds and the load after it go to conditions."""
    start = time.monotonic()
    code = subprocess.call(runner, cwd=ROOT, **popen)
    conditions.update(seconds=round(time.monotonic() - start), load_after=os.getloadavg())
    return code


def _write_conditions(dest: Path, conditions: dict[str, object]) -> None:
    (dest / "conditions.json").write_text(json.dumps(conditions, indent=2))


def _busy_node(runner: list[str], dest: Path, conditions: dict[str, object], load: int) -> int:
    """Run the notebooks beside (load - cores) CPU hogs, sampling the 1-minute load; the runner's status."""
    hogs = max(0, load - int(conditions["cores"]))  # type: ignore[call-overload]
    procs = [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True) for _ in range(hogs)]
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(15):
            samples.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        code = _timed(runner, conditions)
    finally:
        stop.set()
        for proc in procs:
            proc.kill()
            proc.wait(timeout=60)
    conditions.update(load=load, hogs=hogs, hog_pids=[p.pid for p in procs], load_samples=len(samples),
                      load_median=statistics.median(samples) if samples else None)
    _write_conditions(dest, conditions)
    return code


def measure(mode: str, only: str, out: Path, cpu: float, load: int = 8) -> int:
    """Run the notebooks (the solutions runner) in the given conditions; its exit status."""
    dest = out / mode
    dest.mkdir(parents=True, exist_ok=True)
    runner = [sys.executable, "-m", "dpc_maintainer.solutions", "--only", only, "--out", str(dest)]
    # imported here: the site builder (dpc_maintainer.book) imports NEEDS in an environment without helpers' packages
    from helpers.timing import usable_cores

    conditions: dict[str, object] = {"mode": mode, "cores": usable_cores(), "load_before": os.getloadavg()}
    if mode == "idle":
        code = _timed(runner, conditions)
        _write_conditions(dest, conditions)
        return code
    if mode == "busy-node":
        return _busy_node(runner, dest, conditions, load)
    if os.geteuid() != 0:
        raise SystemExit("--mode class-node writes cgroups: run it as root")
    tag = f"dpc-needs-{os.getpid()}"
    student, mate = UserCgroup(tag, "student"), UserCgroup(tag, "classmate")
    rest = max(0.5, usable_cores() - cpu)
    student.create(cpu, 0, 0)
    mate.create(rest, 0, 0)
    log = (dest / "classmate.log").open("w")
    try:
        neighbour = subprocess.Popen([sys.executable, "-m", "dpc_maintainer.needs", "classmate"], cwd=ROOT,
                                     stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=join_cgroup_then(mate.join_files(), lambda: None))
        code = _timed(runner, conditions, preexec_fn=join_cgroup_then(student.join_files(), lambda: None))
        conditions.update(cpu=cpu, classmate_cpu=rest)
        neighbour.terminate()
        neighbour.wait(timeout=60)
    finally:
        for group in (mate, student):
            asyncio.run(group.remove())
        for d in {p for g in (mate, student) for p in g.parents}:
            d.rmdir()
        log.close()
    launches = len(re.findall(r"^classmate: launch \d+ done$", (dest / "classmate.log").read_text(), re.M))
    conditions["classmate_launches"] = launches
    _write_conditions(dest, conditions)
    if not launches:
        print("the classmate's launch never finished once: the run had no classmate beside it", file=sys.stderr)
        return 1
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run the notebooks idle, at a class hub's share or on a busy node")
    m.add_argument("--mode", choices=MODES, required=True)
    m.add_argument("--only", default="", help="only notebooks whose path contains this")
    m.add_argument("--cpu", type=float, default=1.5, help="class-node: the cores each student gets")
    m.add_argument("--load", type=int, default=8,
                   help="busy-node: the load to hold (the notebook's own threads count as the cores)")
    m.add_argument("--out", type=Path, default=ROOT / "build" / "needs")
    w = sub.add_parser("write", help="put the measured minutes into the notebooks' Needs lines")
    w.add_argument("--out", type=Path, default=ROOT / "build" / "needs")
    sub.add_parser("classmate", help="(internal) the classmate's launches, until stopped")
    args = ap.parse_args(argv)
    if args.command == "measure":
        return measure(args.mode, args.only, args.out, args.cpu, args.load)
    if args.command == "write":
        print(write(args.out), end="")
        return 0
    return classmate()


if __name__ == "__main__":
    sys.exit(main())
