"""Commit an executed notebook: copy it over its source without run metadata or this machine's paths.

    python -m dpc_maintainer.outputs writeback build/solutions/course/07-ddp-syncbn.ipynb course/07-ddp-syncbn.ipynb
    python -m dpc_maintainer.outputs scrub course/10-failures.ipynb      # in place: only the paths
    python -m dpc_maintainer.outputs check     # exit 1 if a committed output has them, or is stale

Chapters are committed executed with their default parameters (CONTRIBUTING). Papermill's and the
executor's cell metadata change on every run and carry nothing for a reader, and absolute paths of
the checkout (tracebacks, file names a worker prints) show a developer's machine: both go. A path
under the checkout becomes relative to it (`course/runs/10/train.py`).

Outputs belong to their source: writeback stamps every executed code cell with a fingerprint of the
code that produced its outputs (cell metadata `dpc.ran`: the code cells up to it, since a notebook
runs top to bottom), and `check` names the cells of a stamped notebook whose code changed since.
"""
from __future__ import annotations

import argparse
import hashlib
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


STAMP = "dpc"  # cell metadata key: {"ran": fingerprint of the code whose run made the outputs}


def fingerprints(nb: dict) -> list[str | None]:
    """Per cell, a fingerprint of every code cell's source up to and including it (None: not code).
    An edit of a code cell changes its own fingerprint and those of all code cells after it."""
    h = hashlib.sha256()
    found: list[str | None] = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            found.append(None)
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        h.update(source.encode() + b"\0")
        found.append(h.hexdigest()[:16])
    return found


def executed(cell: dict) -> bool:
    """A code cell that shows a run: outputs or an execution count."""
    return cell["cell_type"] == "code" and bool(cell.get("outputs") or cell.get("execution_count"))


def stamp(nb: dict) -> dict:
    """The notebook with each executed code cell stamped with its fingerprint (others unstamped)."""
    for cell, fp in zip(nb["cells"], fingerprints(nb)):
        meta = cell.setdefault("metadata", {})
        meta.pop(STAMP, None)
        if executed(cell):
            meta[STAMP] = {"ran": fp}
    return nb


def stamped(nb: dict) -> bool:
    """True when the notebook was written back with fingerprints."""
    return any(STAMP in c.get("metadata", {}) for c in nb["cells"])


def stale(nb: dict) -> list[int]:
    """Indices of executed code cells whose stamp is not the fingerprint of the code now above them."""
    return [i for i, (cell, fp) in enumerate(zip(nb["cells"], fingerprints(nb)))
            if executed(cell) and cell.get("metadata", {}).get(STAMP, {}).get("ran") != fp]


def committed() -> list[Path]:
    """The notebooks committed with outputs: chapters and solutions."""
    return [p for d in ("course", "solutions") for p in sorted((ROOT / d).rglob("*.ipynb"))
            if "runs" not in p.parts and ".ipynb_checkpoints" not in p.parts]


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
    sub.add_parser("check", help="exit 1 if a committed notebook's outputs hold the checkout's path, "
                                 "or a stamped notebook's code changed since its run")
    a = ap.parse_args()
    if a.cmd == "writeback":
        nb = json.loads(a.executed.read_text())
        if any("injected-parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]):
            raise SystemExit(f"{a.executed} was run with injected parameters: commit a run with the defaults")
        write(stamp(scrub(nb)), a.source)
        print("wrote", a.source)
    elif a.cmd == "scrub":
        for p in a.notebooks:
            write(scrub(json.loads(p.read_text())), p)
            print("scrubbed", p)
    else:
        bad = 0
        for p in committed():
            nb = json.loads(p.read_text())
            name = p.relative_to(ROOT)
            if leaks(nb):
                bad += 1
                print(f"{name}: the outputs of cells {leaks(nb)} show an absolute path of a checkout")
            if stamped(nb) and stale(nb):
                bad += 1
                print(f"{name}: cells {stale(nb)} show outputs of other code than theirs (a code cell at or "
                      "above them changed since the run): re-execute it and write it back")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
