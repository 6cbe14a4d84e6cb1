"""Key numbers a notebook reports to `make solutions` (src/dpc_maintainer/solutions.py), which collects them."""
from __future__ import annotations

import json
import os
from typing import TypeVar

ENV = "DPC_METRICS"  # set by src/dpc_maintainer/solutions.py to a JSON-lines file; unset in a student's kernel
T = TypeVar("T", int, float, str, bool)


def record(name: str, value: T) -> T:
    """Append (name, value) to the file named by $DPC_METRICS, if set; return value unchanged."""
    path = os.environ.get(ENV)
    if path:
        shown = float(f"{value:.4g}") if isinstance(value, float) else value
        with open(path, "a") as f:
            f.write(json.dumps({"name": name, "value": shown}) + "\n")
    return value


def read(path: str) -> dict[str, object]:
    """The metrics recorded in a JSON-lines file, last value per name (empty if none)."""
    if not os.path.exists(path):
        return {}
    out: dict[str, object] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                item = json.loads(line)
                out[item["name"]] = item["value"]
    return out
