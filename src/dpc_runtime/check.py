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
import sys
import tempfile
import textwrap
from pathlib import Path

from dpc_runtime import judge, manifest, sandbox
from dpc_runtime.notebook import nbgrader

ROOT = Path(__file__).resolve().parents[2]


def execute(notebook: Path, result: Path) -> None:
    """Run notebook in place (its folder is a scratch copy) and write its test cells' results."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout_func=manifest.cell_timeout, interrupt_on_timeout=True,
                            allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}})
    client.execute()
    checks = notebook.with_name(f"{notebook.stem}.checks.json")
    reference = json.loads(checks.read_text()) if checks.exists() else {}
    rows = []
    for cell in nb.cells:
        meta = nbgrader(cell)
        if not meta.get("grade") or cell.cell_type != "code":
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        why = f"{errors[0].get('ename')}: {errors[0].get('evalue')}".strip() if errors else ""
        wanted = reference.get(meta.get("grade_id"))
        judged = judge.verdict(wanted, judge.records(cell)) if wanted else None
        ran = cell.get("execution_count") is not None
        rows.append({"cell": meta.get("grade_id", "?"), "points": float(meta.get("points", 0)),
                     "passed": not errors and ran and not judged,
                     "why": why or ("" if ran else "did not run") or
                            (f"the grader's own check: {judged}" if judged else "")})
    result.write_text(json.dumps(rows))


def check(notebook: Path, timeout: float) -> list[dict]:
    """Copy the notebook's folder to a scratch folder, run it there (sandboxed), return its rows."""
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
        if done.disk_full:
            print(f"check: {notebook.name} wrote more than {limits.disk >> 20} MiB of files in all: "
                  f"stopped", file=sys.stderr)
        elif done.code == -1:
            print(f"check: {notebook.name} still running after {timeout:.0f} s: stopped", file=sys.stderr)
        if not result.exists():
            return [{"cell": "(notebook)", "points": 0.0, "passed": False,
                     "why": "the notebook could not be run to the end (see the messages above)"}]
        return json.loads(result.read_text())


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
        rows = check(nb.resolve(), a.timeout)
        print("\n" + "\n".join(table(rows)))
        got = sum(r["points"] for r in rows if r["passed"])
        total = sum(r["points"] for r in rows)
        bad = sum(not r["passed"] for r in rows)
        failed += bad
        print(f"{nb.name}: {got:g} / {total:g} visible points, {bad} test cell(s) failed "
              f"(the grader also runs hidden tests)\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
