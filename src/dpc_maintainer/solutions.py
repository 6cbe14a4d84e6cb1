"""Execute every course and solution notebook on the hardware present and write a report.

    python -m dpc_maintainer.solutions [--ci] [--only SUBSTRING] [--out build/solutions]

`make solutions` runs this. The notebooks and what they need are declared in course.yml:

    solutions/07-ddp-syncbn/ddp-syncbn.ipynb:
      ci: {N_STEPS: 2}                 # small parameters (CI, --ci)
      gpu: {N_RANKS: gpus}             # parameters on a machine with GPUs; `gpus` = their number
                                       # when >= 2 (with one GPU the notebook's default stands:
                                       # logical GPUs carved from it, or ranks sharing it)
      sections:                        # parts that need hardware, switched by a bool parameter
        RUN_TORCH_SYNCBN: {gpus: 2, what: "torch.nn.SyncBatchNorm (one GPU per rank)"}

The hardware is looked at once (GPUs torch and TensorFlow see). A section whose need is not met
is reported as skipped with the reason, never silently, and its parameter is set to False, unless
the notebook's default is None (the notebook then decides from the hardware itself, and a run
with no GPU stays a run with the defaults, the one whose outputs are committed); one whose need
is met gets True. Each notebook runs in a fresh kernel beside its source (papermill),
the executed copy goes to OUT/<path>, and OUT/report.md + OUT/report.json list per notebook: the
devices used, the parameters, wall time, skipped sections, the key numbers the notebook printed
(`reported`: read from the outputs of the cells that name them in their metadata, so that nothing in
what students read exists for this report), and pass/fail (with the error). The exit status is 1 if
any failed.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpc_runtime import manifest, notebook as nb_cells

ROOT = Path(__file__).resolve().parents[2]
METRICS = "dpc-metrics"  # cell metadata: {name: a regex over the cell's printed text, its last group the value}


def _value(text: str) -> object:
    """A printed value as a number or a bool where it reads as one, 4 significant digits."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return float(f"{number:.4g}") if kind is float else number
    return text


def reported(nb: dict) -> dict[str, object]:
    """The key numbers an executed notebook printed, found with the regexes of its cells' metadata.

    A name with `{}` is a family: every match fills it with the regex's first group and takes the
    last group as the value. A cell that printed no match (a skipped section) reports nothing."""
    found: dict[str, object] = {}
    for cell in nb["cells"]:
        wanted = cell.get("metadata", {}).get(METRICS)
        if cell["cell_type"] != "code" or not wanted:
            continue
        printed = ""
        for out in cell.get("outputs", []):
            text = out.get("text", "") or out.get("data", {}).get("text/plain", "")
            printed += "".join(text) if isinstance(text, list) else text
        for name, pattern in wanted.items():
            for match in re.finditer(pattern, printed, re.M):
                found[name.format(match.group(1)) if "{}" in name else name] = _value(match.groups()[-1])
    return found


@dataclass
class Hardware:
    """What the notebooks will run on."""

    cpu_cores: int
    gpus: int
    gpu_names: list[str]
    line: str


@dataclass
class Plan:
    """How one notebook is run: its parameters and the sections switched off (with why)."""

    notebook: str
    parameters: dict[str, object]
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class Result:
    """What running one notebook gave."""

    notebook: str
    status: str  # "passed" or "failed"
    seconds: float
    devices: str
    parameters: dict[str, object]
    skipped: dict[str, str]
    metrics: dict[str, object]
    error: str = ""


def look_at_hardware() -> Hardware:
    """Count the GPUs (in a child process, so this one never initialises CUDA) and the cores."""
    code = ("import json, helpers; inv = helpers.inventory(); "
            "print(json.dumps([inv.cpu_cores, inv.torch_gpus, inv.tf_gpus, inv.line()]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stdout.strip().splitlines()[-1]
    cores, torch_gpus, tf_gpus, line = json.loads(out)
    names = torch_gpus or tf_gpus
    return Hardware(cores, max(len(torch_gpus), len(tf_gpus)), names, line)


def defaults(notebook: Path) -> dict[str, object]:
    """The literal values the notebook's `parameters` cell assigns (chapter 0 explains the cell)."""
    nb = json.loads(notebook.read_text())
    found: dict[str, object] = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or "parameters" not in cell.get("metadata", {}).get("tags", []):
            continue
        for node in ast.parse(nb_cells.source(cell)).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    found[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
    return found


def plan(notebook: str, settings: dict, hw: Hardware, ci: bool,
         default: dict[str, object] | None = None) -> Plan:
    """The parameters for this notebook on this hardware (CI-sized when ci), sections decided.

    default: the notebook's own parameter values (defaults()); a section flag whose default is
    None is left to the notebook where the hardware lacks what it needs.
    """
    params: dict[str, object] = dict(settings.get("ci", {})) if ci else {}
    if hw.gpus:
        for name, value in settings.get("gpu", {}).items():
            if value != "gpus":
                params[name] = value
            elif hw.gpus >= 2:  # one GPU per replica/rank; with one GPU the default stands
                params[name] = hw.gpus
    skipped = {}
    for flag, need in settings.get("sections", {}).items():
        wanted = int(need.get("gpus", 0))
        if hw.gpus >= wanted or (default or {}).get(flag, False) is not None:
            params[flag] = hw.gpus >= wanted
        if hw.gpus < wanted:
            skipped[flag] = (f"{need.get('what', flag)} needs {wanted} GPU(s); this machine has "
                             f"{hw.gpus}")
    return Plan(notebook, params, skipped)


def run(p: Plan, out: Path, hw: Hardware, cell_timeout: int) -> Result:
    """Execute one notebook in a fresh kernel beside its source; never raises for its errors."""
    import papermill as pm

    src = Path(p.notebook) if Path(p.notebook).is_absolute() else ROOT / p.notebook
    rel = src.relative_to(ROOT) if src.is_relative_to(ROOT) else Path(src.name)
    dst = out / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    error = ""
    try:
        pm.execute_notebook(str(src), str(dst), parameters=p.parameters, cwd=str(src.parent),
                            kernel_name="python3", execution_timeout=cell_timeout,
                            log_output=False, progress_bar=False)
    except pm.PapermillExecutionError as e:
        error = f"cell {e.exec_count}: {e.ename}: {e.evalue}".strip()
    except Exception as e:  # kernel died, timeout, unreadable notebook
        error = f"{type(e).__name__}: {e}".strip()
    seconds = time.monotonic() - start
    metrics = reported(json.loads(dst.read_text())) if dst.exists() else {}
    return Result(str(rel), "failed" if error else "passed", round(seconds, 1), hw.line,
                  p.parameters, p.skipped, metrics, error[:2000])


def report(results: list[Result], hw: Hardware, out: Path, ci: bool) -> str:
    """Write OUT/report.json and OUT/report.md; return the markdown."""
    (out / "report.json").write_text(json.dumps(
        {"hardware": asdict(hw), "ci_parameters": ci, "notebooks": [asdict(r) for r in results]},
        indent=2))
    size = "CI (small)" if ci else "realistic (the notebooks' defaults)"
    lines = [f"# Solution notebooks on {hw.line}", "",
             f"Parameters: {size}"
             f"{' + GPU settings' if hw.gpus else ''}.", "",
             "| notebook | result | wall s | parameters | skipped sections | key numbers |",
             "|---|---|---|---|---|---|"]
    for r in results:
        params = ", ".join(f"{k}={v}" for k, v in r.parameters.items()) or "defaults"
        skipped = "; ".join(f"{k}: {v}" for k, v in r.skipped.items()) or "-"
        metrics = ", ".join(f"{k}={v}" for k, v in r.metrics.items()) or "-"
        result = "passed" if r.status == "passed" else f"**FAILED**: {r.error.splitlines()[0]}"
        lines.append(f"| {r.notebook} | {result} | {r.seconds:.0f} | {params} | {skipped} | {metrics} |")
    failed = [r for r in results if r.status != "passed"]
    lines += ["", f"{len(results) - len(failed)} passed, {len(failed)} failed."]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ci", action="store_true", help="use the small CI parameters")
    ap.add_argument("--only", default="", help="run only notebooks whose path contains this")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "solutions")
    ap.add_argument("--manifest", type=Path, default=manifest.MANIFEST)
    ap.add_argument("--cell-timeout", type=int, default=1800, help="seconds per cell")
    a = ap.parse_args(argv)
    chosen = {k: v for k, v in manifest.notebooks(a.manifest).items() if a.only in k}
    if not chosen:
        print(f"solutions: no notebook in {a.manifest} matches {a.only!r}", file=sys.stderr)
        return 2
    hw = look_at_hardware()
    print(f"solutions: {len(chosen)} notebook(s) on {hw.line}", flush=True)
    a.out = a.out.resolve()  # kernels run beside their notebook: the executed copies need a full path
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for notebook, settings in chosen.items():
        source = Path(notebook) if Path(notebook).is_absolute() else ROOT / notebook
        p = plan(notebook, settings, hw, a.ci, defaults(source))
        for flag, why in p.skipped.items():
            print(f"  {notebook}: section {flag} skipped: {why}", flush=True)
        r = run(p, a.out, hw, a.cell_timeout)
        print(f"  {r.notebook}: {r.status} in {r.seconds:.0f} s"
              f"{': ' + r.error.splitlines()[0] if r.error else ''}", flush=True)
        results.append(r)
    print(report(results, hw, a.out, a.ci))
    print(f"solutions: executed notebooks and report.md in {a.out}")
    return 1 if any(r.status != "passed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
