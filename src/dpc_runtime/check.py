"""Check a lab the way the grader runs it: exit 0 when every visible test passes, 1 otherwise.

    python -m dpc_runtime.check labs/01-input-pipeline                 # every notebook of the lab
    python -m dpc_runtime.check labs/01-input-pipeline/input-pipeline.ipynb
    make check LAB=01-input-pipeline

The notebook runs top to bottom on a copy (your file is not changed), in a fresh kernel, with the
grader's per-cell time limits (nbgrader_config.py) and in the grader's sandbox where this machine
has one (src/dpc_runtime/sandbox.py: no network but loopback, only its own folder writable). Then a table
lists every test cell: its points, whether it passed, and under a failed one its whole message,
wrapped to the terminal's width and never cut (an assert's hint is at its end). As the grader does,
it judges a test cell outside your kernel (dpc_runtime.judge): a cell passes when it raised nothing
AND the values it recorded match the solution's (`<notebook>.checks.json` beside the lab). The
grader also runs hidden tests, so full marks here are necessary, not sufficient.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import textwrap
from pathlib import Path

from dpc_runtime import judge, manifest, sandbox
from dpc_runtime.notebook import nbgrader

ROOT = Path(__file__).resolve().parents[2]


def death_words(code: int | None) -> str:
    """How a kernel ended, in words, from its exit code: a signal (negative, or 128 + the signal's
    number as bubblewrap and shells report it) by its name, another code as a number."""
    number = -code if code is not None and code < 0 else code - 128 if code is not None and 128 < code < 160 else 0
    if number:
        words = signal.strsignal(number) or f"signal {number}"
        try:
            name = signal.Signals(number).name
        except ValueError:  # a real-time signal: its number is its name
            name = f"signal {number}"
        return f"{words[:1].lower()}{words[1:]} ({name})"
    return "it stopped answering" if code is None else f"it exited with code {code}"


def kernel_death(nb, index: int | None, process) -> dict:
    """Where and how the kernel died: the cell it was running (index in the notebook, grade id) and
    the signal that ended it, or its exit code (process: the kernel's Popen, None when unknown)."""
    gid = nbgrader(nb.cells[index]).get("grade_id", "") if index is not None else ""
    return {"index": index, "grade_id": gid, "how": death_words(process.poll() if process is not None else None)}


def died_line(died: dict) -> str:
    """The kernel's death in words: the cell and the signal."""
    where = (f"in cell {died['index']}" + (f" ({died['grade_id']})" if died["grade_id"] else "")
             if died["index"] is not None else "before the first cell ran")
    return f"the kernel died {where}: {died['how']}"


def execute(notebook: Path, result: Path) -> None:
    """Run notebook in place (its folder is a scratch copy) and write its test cells' results, and
    where the kernel died if it did."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout_func=manifest.cell_timeout, interrupt_on_timeout=True,
                            allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}})
    seen: dict = {"index": None, "process": None}

    def started(**_: object) -> None:
        seen["process"] = getattr(getattr(client.km, "provisioner", None), "process", None)

    client.on_notebook_start = started
    client.on_cell_execute = lambda cell, cell_index, **_: seen.update(index=cell_index)
    died = None
    try:
        client.execute()
    except DeadKernelError:
        died = kernel_death(nb, seen["index"], seen["process"])
    checks = notebook.with_name(f"{notebook.stem}.checks.json")
    reference = json.loads(checks.read_text()) if checks.exists() else {}
    rows = []
    for index, cell in enumerate(nb.cells):
        meta = nbgrader(cell)
        if not meta.get("grade") or cell.cell_type != "code":
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        why = f"{errors[0].get('ename')}: {errors[0].get('evalue')}".strip() if errors else ""
        wanted = reference.get(meta.get("grade_id"))
        judged = judge.verdict(wanted, judge.records(cell)) if wanted else None
        ran = cell.get("execution_count") is not None and not (died and index >= (died["index"] or 0))
        unrun = f"could not run: {died_line(died)}" if died else "did not run"
        rows.append({"cell": meta.get("grade_id", "?"), "points": float(meta.get("points", 0)),
                     "passed": not errors and ran and not judged,
                     "why": why or ("" if ran else unrun) or
                            (f"the grader's own check: {judged}" if judged else "")})
    result.write_text(json.dumps({"rows": rows, "died": died}))


def unrun_rows(notebook: Path, why: str) -> list[dict]:
    """Every test cell of notebook, failed with `why` (the notebook could not be run to the end)."""
    nb = json.loads(notebook.read_text())
    return [{"cell": nbgrader(c).get("grade_id", "?"), "points": float(nbgrader(c).get("points", 0)),
             "passed": False, "why": why}
            for c in nb["cells"] if c.get("cell_type") == "code" and nbgrader(c).get("grade")]


def check(notebook: Path, timeout: float) -> tuple[list[dict], str]:
    """Copy the notebook's folder to a scratch folder, run it there (sandboxed): its rows, and why it
    could not be run to the end ('' when it could)."""
    with tempfile.TemporaryDirectory(prefix="dpc-check-") as tmp:
        scratch = Path(tmp)
        work = scratch / notebook.parent.name
        shutil.copytree(notebook.parent, work, ignore=shutil.ignore_patterns(
            "runs", ".ipynb_checkpoints", "__pycache__"))
        for d in ("home", "tmp"):
            (scratch / d).mkdir()
        result = scratch / "result.json"
        argv = [sandbox.PYTHON, str(Path(__file__).resolve()), "--execute", str(work / notebook.name),
                "--result", str(result)]
        env = sandbox.clean_env(scratch / "home", scratch / "tmp")
        if not sandbox.disabled() and sandbox.unavailable() is None:
            argv = sandbox.bwrap_argv(argv, writable=[scratch],
                                      read=[Path(__file__).resolve(), Path(sandbox.__file__).resolve()],
                                      env=env, cwd=work)
            sandbox.hand_over(scratch)  # run by root, the notebook runs as the sandbox's user
        limits = sandbox.Limits()
        done = sandbox.run_limited(argv, work, env, timeout, limits, capture=False, watch=scratch)
        if result.exists():
            out = json.loads(result.read_text())
            return out["rows"], died_line(out["died"]) if out["died"] else ""
        if done.disk_full:
            why = f"it wrote more than {limits.disk >> 20} MiB of files in all: stopped"
        elif done.code == -1:
            why = f"it was still running after {timeout:.0f} s: stopped"
        elif done.out_of_memory:
            why = f"it used more than its {limits.memory >> 30} GiB of memory: stopped"
        elif done.code < 0 or 128 < done.code < 160:
            why = f"the check's process was killed: {death_words(done.code)}"
        else:
            why = f"the check's process exited with code {done.code} (its messages are above)"
        return unrun_rows(notebook, f"could not run: {why}"), why


def table(rows: list[dict], columns: int | None = None) -> list[str]:
    """The lines of the result table: one per test cell, and under a failed one its whole message,
    wrapped to the terminal's width (COLUMNS, else the terminal's; 100 when there is none), never cut."""
    columns = max(40, columns or shutil.get_terminal_size((100, 24)).columns)
    width = max([len("test cell"), *(len(r["cell"]) for r in rows)])
    lines = [f"{'test cell':<{width}}  points  result"]
    for r in rows:
        lines.append(f"{r['cell']:<{width}}  {r['points'] if r['passed'] else 0:>4g}/{r['points']:<3g} "
                     f"{'passed' if r['passed'] else 'FAILED'}")
        if not r["passed"]:
            for paragraph in (r["why"] or "(no message)").splitlines():
                lines += textwrap.wrap(paragraph, columns - 1, initial_indent="    ",
                                       subsequent_indent="    ", break_long_words=False,
                                       break_on_hyphens=False) or [""]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lab", type=Path, nargs="?", help="a lab folder or one of its notebooks")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for a whole notebook")
    p.add_argument("--execute", type=Path, help=argparse.SUPPRESS)  # inside the sandbox
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.execute:
        execute(a.execute, a.result)
        return 0
    if a.lab is None:
        p.error("name a lab folder or notebook, e.g. labs/01-input-pipeline")
    if not a.lab.exists():
        raise SystemExit(f"check: {a.lab} does not exist (labs: "
                         f"{', '.join(sorted(p.name for p in (ROOT / 'labs').glob('*/')))})")
    notebooks = ([a.lab] if a.lab.is_file() else
                 sorted(n for n in a.lab.glob("*.ipynb") if not n.name.startswith(".")))
    if not notebooks:
        raise SystemExit(f"check: no notebook in {a.lab}")
    where = ("in the grader's sandbox" if not sandbox.disabled() and sandbox.unavailable() is None
             else f"without a sandbox ({sandbox.unavailable() or 'DPC_SANDBOX=off'})")
    failed = 0
    for nb in notebooks:
        print(f"check: running {nb} top to bottom {where}, with the grader's time limits ...",
              flush=True)
        rows, stopped = check(nb.resolve(), a.timeout)
        print("\n" + "\n".join(table(rows)))
        got = sum(r["points"] for r in rows if r["passed"])
        total = sum(r["points"] for r in rows)
        bad = sum(not r["passed"] for r in rows)
        failed += bad or bool(stopped)
        if stopped:
            ran = [r for r in rows if not r["why"].startswith("could not run")]
            print(f"{nb.name}: {stopped}.\nThe {len(ran)} test cell(s) before it passed {got:g} of their "
                  f"{sum(r['points'] for r in ran):g} points; the other {len(rows) - len(ran)} (worth "
                  f"{total - sum(r['points'] for r in ran):g} of the {total:g} visible points) could not run.\n")
        else:
            print(f"{nb.name}: {got:g} / {total:g} visible points, {bad} test cell(s) failed "
                  f"(the grader also runs hidden tests)\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
