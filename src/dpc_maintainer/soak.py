"""Soak: every kind of distributed launch the course makes, again and again, on a loaded machine.

    python -m dpc_maintainer.soak [--rounds 12] [--parallel 3] [--burst 20] [--hog N] [--only a,b]
                              [--legacy-exit] [--json build/soak/soak.json]

`make soak` runs this. A classroom node is one shared machine where many students launch jobs at
once: a launch that fails there at random costs a correct student their points. So this starts a
CPU hog on every core (busy-looping processes, stopped at the end), then makes every kind of
launch of the chapters and labs — the real worker files, extracted from the notebooks'
`%%writefile` cells (labs: from their solutions) or taken from helpers/examples — ROUNDS times
each (the short ones 3 x ROUNDS), PARALLEL at a time, in shuffled order, and finally a burst of
BURST concurrent launches. The defaults make 308 launches.

It prints one line per kind (launches, failures by kind of failure, median and p95 wall time)
and ends with `soak: N launches, F failed`; the exit status is 1 if any launch failed.

--legacy-exit rewrites the copied worker scripts to end the way the course's scripts ended before
helpers.worker.finish (barrier, destroy_process_group, normal interpreter exit): the same soak
then measures how often that exit path fails, side by side with the protocol's.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import helpers
from dpc_runtime.launch import LaunchError, LaunchResult
from helpers.multinode import launch_nodes

ROOT = Path(__file__).resolve().parents[2]

TIMEOUT = 600.0  # per launch; a launch still running then counts as a failure (a hang)
LEGACY_END = ("import torch.distributed as _dist\n"
              "if _dist.is_initialized():\n"
              "    _dist.barrier()\n"
              "    _dist.destroy_process_group()\n")


@dataclass
class Kind:
    """One kind of launch: what to start and what must be true of the result."""

    name: str
    run: Callable[[Path], LaunchResult]  # given a fresh folder, make one launch
    check: Callable[[LaunchResult], None] = lambda res: None
    legacy: bool = False  # its worker files can be rewritten by --legacy-exit
    weight: int = 1  # launches per round: the short launches run more often


def writefiles(notebook: Path) -> dict[str, str]:
    """{relative path: source} of every `%%writefile` cell of a notebook."""
    files = {}
    for cell in json.loads(notebook.read_text())["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code" and src.startswith("%%writefile"):
            first, _, body = src.partition("\n")
            files[first.split()[-1]] = body
    return files


def legacy(source: str) -> str:
    """A worker's source with helpers.worker.finish(...) replaced by the old ending."""
    return re.sub(r"^(\s*)finish\([^)]*\)\s*(#.*)?$",
                  lambda m: "".join(m.group(1) + ln for ln in LEGACY_END.splitlines(True)),
                  source, flags=re.M)


class Workspace:
    """The worker files of the course, copied once into a scratch folder."""

    def __init__(self, root: Path, legacy_exit: bool) -> None:
        self.root, self.legacy_exit = root, legacy_exit
        for nb in ["course/00-setup-and-devices.ipynb", "course/05-ring-allreduce.ipynb",
                   "course/07-ddp-syncbn.ipynb", "solutions/05-ring-allreduce/ring-allreduce.ipynb",
                   "solutions/07-ddp-syncbn/ddp-syncbn.ipynb"]:
            for rel, body in writefiles(ROOT / nb).items():
                self.write(rel, body)
        for rel in ["tests/workers/ranks.py", "tests/workers/ring_worker.py",
                    "tests/workers/syncbn_check.py", "tests/workers/hvd_torch.py",
                    "tests/workers/hvd_keras.py", "examples/scaling/ddp_worker.py",
                    "examples/scaling/tf_worker.py"]:
            self.write(rel, (ROOT / rel).read_text())

    def write(self, rel: str, body: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(legacy(body) if self.legacy_exit else body)

    def __truediv__(self, rel: str) -> Path:
        return self.root / rel


def reported(*keys: str, ranks: tuple[int, ...] = (0,)) -> Callable[[LaunchResult], None]:
    """A check: those ranks reported those keys."""
    def check(res: LaunchResult) -> None:
        for r in ranks:
            got = res.report(r)
            missing = [k for k in keys if k not in got]
            if missing:
                raise AssertionError(f"rank {r} did not report {missing}: {got}")
    return check


def equal(key: str, value: object, ranks: tuple[int, ...]) -> Callable[[LaunchResult], None]:
    """A check: those ranks reported key=value."""
    def check(res: LaunchResult) -> None:
        bad = {r: res.report(r).get(key) for r in ranks if res.report(r).get(key) != value}
        if bad:
            raise AssertionError(f"{key} should be {value!r}; got {bad}")
    return check


def kinds(ws: Workspace) -> list[Kind]:
    """Every kind of launch the chapters and labs make, with the workers they use."""
    def torchrun(rel: str, n: int, *args: str, env: dict[str, str] | None = None) -> Callable[[Path], LaunchResult]:
        return lambda d: helpers.launch(ws / rel, n, args=list(args), timeout=TIMEOUT, echo=False,
                                        cwd=d, env=env)

    def lab7_weights(d: Path) -> LaunchResult:
        return helpers.launch(ws / "runs/07/check.py", 2, args=["weights", "4", "6", str(d / "w.pt")],
                              timeout=TIMEOUT, echo=False, cwd=d)

    return [
        Kind("ch0 all-reduce hello (torchrun 2)", torchrun("runs/00/allreduce_hello.py", 2), legacy=True, weight=3),
        Kind("ch5 ring check (torchrun 3)", torchrun("tests/workers/ring_worker.py", 3),
             reported("checked", ranks=(0, 1, 2)), legacy=True, weight=3),
        Kind("ch5 ring vs gloo vs PS (torchrun 2)",
             lambda d: helpers.launch(ROOT / "benchmarks/ring_allreduce.py", 2, timeout=TIMEOUT, echo=False,
                                      args=["--worker", "--sizes", "65536", "262144", "--repeat", "1"], cwd=d),
             reported("rows"), weight=3),
        Kind("lab5 ring check (torchrun 3)", torchrun("runs/05/ring_check.py", 3, "60", "1,4,1000,65537"),
             legacy=True, weight=3),
        Kind("ch7 syncbn check (torchrun 3)", torchrun("tests/workers/syncbn_check.py", 3, "--sizes", "3,5,2"),
             equal("equal", True, (0, 1, 2)), weight=3),
        Kind("ch7 DDP training (torchrun 2)", torchrun("runs/07/train_digits.py", 2, "--epochs", "1"),
             legacy=True),
        Kind("lab7 DDP weights check (torchrun 2)", lab7_weights, legacy=True, weight=3),
        Kind("lab7 training (torchrun 2)", torchrun("runs/07/train.py", 2, "1", "32"), legacy=True),
        Kind("horovod torch (horovodrun 2)",
             lambda d: helpers.launch(ws / "tests/workers/hvd_torch.py", 2, launcher="horovodrun",
                                      timeout=TIMEOUT, echo=False, cwd=d),
             equal("same_weights", True, (0, 1))),
        Kind("horovod tf-keras (horovodrun 2)",
             lambda d: helpers.launch(ws / "tests/workers/hvd_keras.py", 2, launcher="horovodrun",
                                      timeout=TIMEOUT, echo=False, cwd=d),
             equal("same_weights", True, (0, 1))),
        Kind("TF multi-worker (tf 2)",
             lambda d: helpers.launch(ws / "examples/scaling/tf_worker.py", 2, launcher="tf",
                                      timeout=TIMEOUT, echo=False, cwd=d),
             reported("checksum", ranks=(0, 1))),
        Kind("two-node rendezvous (2 torchrun agents)",
             lambda d: launch_nodes(ws / "examples/scaling/ddp_worker.py", nnodes=2, nproc_per_node=1,
                                    args=["train", "--epochs", "1"], timeout=TIMEOUT, echo=False, cwd=d),
             equal("same_weights", True, (0, 1)), legacy=True),
    ]


def classify(err: BaseException) -> str:
    """A short name for what went wrong."""
    text = str(err)
    if isinstance(err, AssertionError):
        return "wrong result"
    if not isinstance(err, LaunchError):
        return type(err).__name__
    if "terminate called without an active exception" in text or "SIGABRT" in text:
        return "teardown abort"
    if "timed out" in text:
        return "hang"
    if "stopped taking part" in text:
        return "rank left"
    return "rank failed"


@dataclass
class Outcome:
    kind: str
    seconds: float
    failure: str | None = None
    message: str = ""
    notes: int = 0  # launches that succeeded with a teardown note (a rank ended badly after DONE)


def attempt(kind: Kind, scratch: Path) -> Outcome:
    """One launch of a kind in its own folder; never raises."""
    d = Path(tempfile.mkdtemp(dir=scratch))
    start = time.monotonic()
    try:
        res = kind.run(d)
        kind.check(res)
        return Outcome(kind.name, time.monotonic() - start, notes=len(res.notes))
    except Exception as err:  # noqa: BLE001  (every failure is counted, none stops the soak)
        return Outcome(kind.name, time.monotonic() - start, classify(err), str(err)[-2000:])


def start_hog(n: int) -> list[subprocess.Popen[bytes]]:
    """n busy-looping processes: a loaded classroom node."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            for _ in range(n)]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def summary(outcomes: list[Outcome]) -> list[str]:
    """One line per kind, then the total line."""
    by: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by.setdefault(o.kind, []).append(o)
    width = max(len(k) for k in by)
    lines = [f"{'kind':<{width}}  launches  failed  median s  p95 s  teardown notes  failures by kind"]
    for name, got in by.items():
        times = [o.seconds for o in got]
        fails = Counter(o.failure for o in got if o.failure)
        lines.append(f"{name:<{width}}  {len(got):>8}  {sum(fails.values()):>6}  {statistics.median(times):>8.1f}  "
                     f"{p95(times):>5.1f}  {sum(o.notes for o in got):>14}  "
                     f"{', '.join(f'{k}: {v}' for k, v in fails.items()) or '-'}")
    failed = sum(1 for o in outcomes if o.failure)
    lines.append(f"soak: {len(outcomes)} launches, {failed} failed")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line's options (see the module's docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12,
                   help="rounds; each kind is launched rounds x its weight times (short kinds: 3)")
    p.add_argument("--parallel", type=int, default=3, help="launches running at the same time")
    p.add_argument("--burst", type=int, default=20, help="concurrent launches at the end (0: none)")
    p.add_argument("--hog", type=int, default=helpers.cpu_cores(), help="busy processes (default: one per core)")
    p.add_argument("--only", default="", help="comma-separated substrings of kind names")
    p.add_argument("--legacy-exit", action="store_true", help="end the copied workers the pre-protocol way")
    p.add_argument("--json", default=str(ROOT / "build" / "soak" / "soak.json"))
    return p.parse_args(argv)


def chosen_kinds(ws: Workspace, only: str, legacy_exit: bool) -> list[Kind]:
    """The kinds whose name contains one of the comma-separated substrings of only (all when empty)."""
    chosen = [k for k in kinds(ws) if not only or any(s and s in k.name for s in only.split(","))]
    if legacy_exit:
        chosen = [k for k in chosen if k.legacy]
    return chosen


def recorder(scratch: Path, outcomes: list[Outcome], total: int, start: float) -> Callable[[Kind], None]:
    """A function that makes one launch of a kind, keeps its outcome, prints a failure and the progress."""
    lock = threading.Lock()

    def one(kind: Kind) -> None:
        o = attempt(kind, scratch)
        with lock:
            outcomes.append(o)
            done = len(outcomes)
            if o.failure:
                print(f"[{done}/{total}] FAILED {o.kind} ({o.failure}) after {o.seconds:.0f} s:\n"
                      + "\n".join("    " + ln for ln in o.message.splitlines()[-12:]), flush=True)
            elif done % 10 == 0:
                print(f"[{done}/{total}] {time.monotonic() - start:.0f} s", flush=True)

    return one


def launch_all(one: Callable[[Kind], None], plan: list[Kind], parallel: int, burst: int, ws: Workspace) -> None:
    """The plan, parallel launches at a time, then a burst of concurrent torchrun launches."""
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, plan))
    if burst:
        kind = Kind(f"burst: {burst} concurrent launches (torchrun 2)",
                    lambda d: helpers.launch(ws / "tests/workers/ranks.py", 2, args=["ok"],
                                             timeout=TIMEOUT, echo=False, cwd=d),
                    equal("sum", 3.0, (0, 1)))
        with ThreadPoolExecutor(burst) as pool:
            list(pool.map(one, [kind] * burst))


def write_json(a: argparse.Namespace, lines: list[str], outcomes: list[Outcome]) -> None:
    """Write the options, the summary and every outcome to the --json file."""
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"legacy_exit": a.legacy_exit, "hog": a.hog, "parallel": a.parallel,
                               "cores": helpers.cpu_cores(), "summary": lines,
                               "outcomes": [o.__dict__ for o in outcomes]}, indent=1))


def main(argv: list[str] | None = None) -> int:
    """Command line: every kind of launch again and again under a CPU hog; exit 1 if any failed."""
    a = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dpc-soak-", ignore_cleanup_errors=True) as scratch:
        return _soak(a, Path(scratch))  # the workers and each launch's folder, removed at the end


def _soak(a: argparse.Namespace, scratch: Path) -> int:
    """The soak of main, its files under scratch."""
    ws = Workspace(scratch / "files", a.legacy_exit)
    chosen = chosen_kinds(ws, a.only, a.legacy_exit)
    if not chosen:
        print(f"soak: no kind matches --only {a.only!r}", file=sys.stderr)
        return 2
    plan = [k for k in chosen for _ in range(a.rounds * k.weight)]
    random.Random(0).shuffle(plan)
    hog = start_hog(a.hog)
    outcomes: list[Outcome] = []
    start = time.monotonic()
    print(f"soak: {len(plan)} launches of {len(chosen)} kinds, {a.parallel} at a time, then a burst "
          f"of {a.burst}; CPU hog: {a.hog} busy process(es) on {helpers.cpu_cores()} core(s)"
          + ("; LEGACY exit path" if a.legacy_exit else ""), flush=True)
    try:
        launch_all(recorder(scratch, outcomes, len(plan) + a.burst, start), plan, a.parallel, a.burst, ws)
    finally:
        for h in hog:
            h.kill()
            h.wait()
    lines = summary(outcomes)
    print(f"\n{time.monotonic() - start:.0f} s in all\n" + "\n".join(lines), flush=True)
    write_json(a, lines, outcomes)
    return 1 if any(o.failure for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
