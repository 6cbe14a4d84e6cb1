"""Commit an executed notebook: copy it over its source without run metadata or this machine's paths.

    python -m dpc_maintainer.outputs writeback build/solutions/course/07-ddp-syncbn.ipynb course/07-ddp-syncbn.ipynb
    python -m dpc_maintainer.outputs scrub course/10-failures.ipynb      # in place: only the paths
    python -m dpc_maintainer.outputs check                               # exit 1 if a committed output has them

Chapters are committed executed with their default parameters (CONTRIBUTING). Papermill's and the
executor's cell metadata change on every run and carry nothing for a reader, and absolute paths of
the checkout (tracebacks, file names a worker prints) show a developer's machine: both go. A path
under the checkout becomes relative to it (`course/runs/10/train.py`).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _scrub_text(value: object, root: str) -> object:
    if isinstance(value, list):
        return [_scrub_text(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(root + "/", "").replace(root, ".")
    return value


def scrub(nb: dict, root: Path = ROOT) -> dict:
    """The notebook with run metadata dropped and `root` made relative in every output."""
    nb["metadata"].pop("papermill", None)
    for cell in nb["cells"]:
        meta = cell.get("metadata", {})
        meta.pop("papermill", None)
        meta.pop("execution", None)
        if meta.get("tags") == []:
            meta.pop("tags")  # papermill adds an empty list to every cell
        for out in cell.get("outputs", []):
            for key in ("text", "traceback", "evalue"):
                if key in out:
                    out[key] = _scrub_text(out[key], str(root))
            for mime, data in out.get("data", {}).items():
                if mime.startswith("text/"):
                    out["data"][mime] = _scrub_text(data, str(root))
    return nb


# An absolute path into some checkout of the course (any machine's): /x/y/course/..., /x/.venv/...
CHECKOUT_PATH = re.compile(r"(?<![\w.~:/-])/(?:[\w.-]+/)+(?:course|solutions|src|examples|tools|\.venv)/")


def leaks(nb: dict, root: Path = ROOT) -> list[int]:
    """Indices of cells whose outputs hold an absolute path into a checkout (this one or another)."""
    found = []
    for i, c in enumerate(nb["cells"]):
        text = json.dumps(c.get("outputs", []))
        if str(root) in text or CHECKOUT_PATH.search(text.replace("\\n", "\n")):
            found.append(i)
    return found


def write(nb: dict, path: Path) -> None:
    """Write a notebook the way Jupyter does (one-space indent, UTF-8, final newline)."""
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    wb = sub.add_parser("writeback", help="copy an executed notebook over its source")
    wb.add_argument("executed", type=Path)
    wb.add_argument("source", type=Path)
    sc = sub.add_parser("scrub", help="remove this machine's paths and run metadata in place")
    sc.add_argument("notebooks", type=Path, nargs="+")
    sub.add_parser("check", help="exit 1 if a committed notebook's outputs hold the checkout's path")
    a = ap.parse_args()
    if a.cmd == "writeback":
        nb = json.loads(a.executed.read_text())
        if any("injected-parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]):
            raise SystemExit(f"{a.executed} was run with injected parameters: commit a run with the defaults")
        write(scrub(nb), a.source)
        print("wrote", a.source)
    elif a.cmd == "scrub":
        for p in a.notebooks:
            write(scrub(json.loads(p.read_text())), p)
            print("scrubbed", p)
    else:
        bad = {str(p.relative_to(ROOT)): leaks(json.loads(p.read_text()))
               for d in ("course", "solutions") for p in sorted((ROOT / d).rglob("*.ipynb"))
               if "runs" not in p.parts and ".ipynb_checkpoints" not in p.parts}
        bad = {k: v for k, v in bad.items() if v}
        for k, v in bad.items():
            print(f"{k}: the outputs of cells {v} show an absolute path of a checkout")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
