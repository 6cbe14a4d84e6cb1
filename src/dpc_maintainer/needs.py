"""Time every notebook with its defaults, idle and at a student's share of a busy class hub, and write
the two figures into each notebook's Needs line.

    python -m dpc_maintainer.needs measure --mode idle [--only SUBSTRING] [--out build/needs]
    python -m dpc_maintainer.needs measure --mode class-node [--cpu 1.5] [--only ...]   # root
    python -m dpc_maintainer.needs write [--out build/needs]

`measure` runs the notebooks as `make solutions` does (dpc_maintainer.solutions: defaults, a fresh
kernel each) into OUT/<mode>/ (report.json has each notebook's wall time; the executed copies can be
committed with dpc_maintainer.outputs). `--mode idle` runs them alone. `--mode class-node` runs them
in a cgroup with the hub's CPU quota (`--cpu`, the cores each student gets: the classroom's and the
hub config's `cpu_limit`) while a classmate's launch runs beside them, over and over (two torchrun
ranks training examples/scaling/ddp_worker.py), in a cgroup that has the rest of the machine; both
cgroups are removed at the end with whatever is left in them. OUT/<mode>/conditions.json says what
the run had (share, the classmate's launches, the load). `write` puts both figures into the Needs line
of every notebook measured in both modes (course/ and solutions/; labs/ follow with
`python -m dpc_instructor.labs generate`) and writes OUT/needs.md, the table for the notes.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from dpc_instructor.hub.cgroups import UserCgroup, join_cgroup_then

ROOT = Path(__file__).resolve().parents[2]
MODES = ("idle", "class-node")
CLASSMATE = ROOT / "examples" / "scaling" / "ddp_worker.py"
# The Needs line of a notebook's opening (tests/test_notebook_rules.py holds every notebook to it).
NEEDS = re.compile(r"^\*\*Needs:\*\* (?P<cores>\d+) CPU cores?, (?P<gb>\d+(?:\.\d+)?) GB of memory, "
                   r"about (?P<idle>\d+) minutes? on a 2-core laptop without a GPU, about (?P<busy>\d+) "
                   r"minutes? at a class hub's share \((?P<share>\d+(?:\.\d+)?) cores, a classmate's launch "
                   r"beside it\) \(one GPU: (?P<gpu>[^)]+)\)\.$", re.M)
# The line before the class-node figure was measured: the same without it.
OLD_NEEDS = re.compile(r"^\*\*Needs:\*\* (?P<cores>\d+) CPU cores?, (?P<gb>\d+(?:\.\d+)?) GB of memory, "
                       r"about (?P<idle>\d+) minutes? on a 2-core laptop without a GPU "
                       r"\(one GPU: (?P<gpu>[^)]+)\)\.$", re.M)


def minutes(seconds: float) -> int:
    """Whole minutes, the nearest (at least 1): what a Needs line says."""
    return max(1, int(seconds / 60 + 0.5))


def _min(n: int) -> str:
    return f"{n} minute" + ("" if n == 1 else "s")


def needs_line(cores: int, gb: str, idle_s: float, busy_s: float, share: float, gpu: str) -> str:
    """The Needs line of a notebook that ran idle_s seconds alone and busy_s at a hub's share."""
    return (f"**Needs:** {cores} CPU cores, {gb} GB of memory, about {_min(minutes(idle_s))} on a 2-core "
            f"laptop without a GPU, about {_min(minutes(busy_s))} at a class hub's share ({share:g} cores, "
            f"a classmate's launch beside it) (one GPU: {gpu}).")


def rewrite_needs(text: str, idle_s: float, busy_s: float, share: float) -> str:
    """text (a notebook's opening) with its Needs line given these figures; ValueError if it has none."""
    found = NEEDS.search(text) or OLD_NEEDS.search(text)
    if not found:
        raise ValueError("no Needs line in the notebook's opening")
    line = needs_line(int(found["cores"]), found["gb"], idle_s, busy_s, share, found["gpu"])
    return text[:found.start()] + line + text[found.end():]


def _seconds(out: Path, mode: str) -> dict[str, float]:
    """notebook path -> wall seconds of the passed runs of OUT/<mode>/report.json."""
    path = out / mode / "report.json"
    if not path.exists():
        return {}
    return {r["notebook"]: r["seconds"] for r in json.loads(path.read_text())["notebooks"]
            if r["status"] == "passed"}


def write(out: Path, root: Path = ROOT) -> str:
    """Update the Needs line of every notebook (under root) measured in both modes; write and return
    OUT/needs.md."""
    idle, busy = _seconds(out, "idle"), _seconds(out, "class-node")
    share = json.loads((out / "class-node" / "conditions.json").read_text())["cpu"]
    rows = ["| notebook | idle | class hub's share | ratio |", "|---|---|---|---|"]
    for rel in sorted(set(idle) & set(busy)):
        path = root / rel
        nb = json.loads(path.read_text())
        cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown" and
                    (NEEDS.search("".join(c["source"])) or OLD_NEEDS.search("".join(c["source"]))))
        text = rewrite_needs("".join(cell["source"]), idle[rel], busy[rel], share)
        cell["source"] = text.splitlines(keepends=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        rows.append(f"| {rel} | {idle[rel]:.0f} s | {busy[rel]:.0f} s | {busy[rel] / idle[rel]:.2f} |")
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


def measure(mode: str, only: str, out: Path, cpu: float) -> int:
    """Run the notebooks (the solutions runner) in the given conditions; its exit status."""
    dest = out / mode
    dest.mkdir(parents=True, exist_ok=True)
    runner = [sys.executable, "-m", "dpc_maintainer.solutions", "--only", only, "--out", str(dest)]
    # imported here: the site builder (dpc_maintainer.book) imports NEEDS in an environment without helpers' packages
    from helpers.timing import usable_cores

    conditions: dict[str, object] = {"mode": mode, "cores": usable_cores(), "load_before": os.getloadavg()}
    if mode == "idle":
        start = time.monotonic()
        code = subprocess.call(runner, cwd=ROOT)
        conditions.update(seconds=round(time.monotonic() - start), load_after=os.getloadavg())
        (dest / "conditions.json").write_text(json.dumps(conditions, indent=2))
        return code
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
        start = time.monotonic()
        code = subprocess.call(runner, cwd=ROOT, preexec_fn=join_cgroup_then(student.join_files(), lambda: None))
        conditions.update(cpu=cpu, classmate_cpu=rest, seconds=round(time.monotonic() - start),
                          load_after=os.getloadavg())
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
    (dest / "conditions.json").write_text(json.dumps(conditions, indent=2))
    if not launches:
        print("the classmate's launch never finished once: the run had no classmate beside it", file=sys.stderr)
        return 1
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run the notebooks idle or at a class hub's share")
    m.add_argument("--mode", choices=MODES, required=True)
    m.add_argument("--only", default="", help="only notebooks whose path contains this")
    m.add_argument("--cpu", type=float, default=1.5, help="class-node: the cores each student gets")
    m.add_argument("--out", type=Path, default=ROOT / "build" / "needs")
    w = sub.add_parser("write", help="put the measured minutes into the notebooks' Needs lines")
    w.add_argument("--out", type=Path, default=ROOT / "build" / "needs")
    sub.add_parser("classmate", help="(internal) the classmate's launches, until stopped")
    args = ap.parse_args(argv)
    if args.command == "measure":
        return measure(args.mode, args.only, args.out, args.cpu)
    if args.command == "write":
        print(write(args.out), end="")
        return 0
    return classmate()


if __name__ == "__main__":
    sys.exit(main())
