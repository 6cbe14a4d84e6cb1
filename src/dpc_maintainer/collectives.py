"""A rule over every worker's collectives: a tensor handed to torch.distributed is made on a device (issue 34).

    python -m dpc_maintainer.collectives      # every offending line of every worker, or 'none'

On a CPU every tensor is on the CPU, so a worker that makes its statistics tensor with
`torch.tensor([...])` and all-reduces it runs everywhere the course is tested; on a GPU rank with
NCCL the same line fails ("No backend type associated with device type cpu", chapter 8's
`ddp_worker.py bench`, first seen on an H100). This rule finds that kind on the CPU: a tensor
passed to a collective (or point-to-point call) that was made by a factory (`torch.tensor`,
`torch.zeros`, `torch.from_numpy`, ...) with no `device=` and no `.to(...)` / `.cuda()` after it.
A tensor meant for the CPU says so: `device="cpu"` (the ring's point-to-point work, a gloo side group).

Workers are the Python files of examples/, benchmarks/, tests/workers/, src/helpers/ and every
`%%writefile *.py` cell of course/ and solutions/ (labs/ are generated from solutions/).
"""
from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dpc_runtime.worker import NEW_NAMES, TORCH_MIN

ROOT = Path(__file__).resolve().parents[2]

# torch.distributed names that every torch since TORCH_MIN (2.6) has, of those the course calls or may;
# with NEW_NAMES (torch 2.13's, which worker.start() gives an older torch), what a worker may use.
STABLE = frozenset({
    "Backend", "GroupMember", "P2POp", "ProcessGroup", "ReduceOp", "_DEFAULT_FIRST_BUCKET_BYTES",
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "destroy_process_group", "gather", "gather_object", "get_backend", "get_global_rank",
    "get_process_group_ranks", "get_rank", "get_world_size", "init_device_mesh", "init_process_group",
    "irecv", "is_available", "is_gloo_available", "is_initialized", "is_nccl_available", "isend",
    "monitored_barrier", "new_group", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "send",
})

# torch.distributed calls that move tensors between ranks (their tensor arguments must be on the
# group's device: CUDA for NCCL, CPU or CUDA for gloo).
COLLECTIVES = frozenset({
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
    "isend", "irecv", "all_reduce_coalesced", "P2POp",
})
# Factories that make a tensor on the default device (the CPU) unless given device=.
FACTORIES = frozenset({
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "rand", "randn",
    "randint", "from_numpy", "eye", "stack_numpy",
})
MOVES = frozenset({"to", "cuda", "cpu"})  # a tensor moved after it was made says where it goes
_WRITEFILE = re.compile(r"^%%writefile\s+(?:-a\s+)?(\S+\.py)\s*$")


@dataclass(frozen=True)
class Finding:
    """One tensor handed to a collective without a device: where, which call, which name."""

    where: str
    line: int
    call: str
    tensor: str

    def text(self) -> str:
        """One readable line."""
        return (f"{self.where}:{self.line}: dist.{self.call}({self.tensor}): {self.tensor} is made "
                "without device= (CPU): give it the rank's device, or device='cpu' on purpose")


def _is_dist_call(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in COLLECTIVES:
        base = func.value
        if isinstance(base, ast.Name) and base.id in ("dist", "torch_dist", "c10d"):
            return func.attr
        if isinstance(base, ast.Attribute) and base.attr == "distributed":
            return func.attr
    return None


def _deviceless(expr: ast.expr) -> bool:
    """True if expr makes a tensor with a factory and neither a device= nor a move after it."""
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    if isinstance(func, ast.Attribute) and func.attr in MOVES:
        return False
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch" \
            and func.attr in FACTORIES:
        return not any(k.arg == "device" for k in expr.keywords)
    return False


def _assignments(scope: ast.AST) -> dict[str, list[tuple[int, ast.expr]]]:
    """name -> [(line, value)] of plain assignments in scope (nested functions included)."""
    found: dict[str, list[tuple[int, ast.expr]]] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append((node.lineno, node.value))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            found.setdefault(node.target.id, []).append((node.lineno, node.value))
    return found


def check_source(code: str, where: str) -> list[Finding]:
    """The findings of one worker's source (a SyntaxError names the file)."""
    tree = ast.parse(code, filename=where)
    scopes: list[ast.AST] = [tree, *(n for n in ast.walk(tree)
                                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    findings: set[Finding] = set()
    for scope in scopes:
        names = _assignments(scope)
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or not (call := _is_dist_call(node)):
                continue
            args = [*node.args[:2], *(k.value for k in node.keywords if k.arg in ("tensor", "tensor_list"))]
            for arg in args:
                if _deviceless(arg):
                    findings.add(Finding(where, node.lineno, call, ast.unparse(arg)[:40]))
                elif isinstance(arg, ast.Name):
                    before = [v for line, v in names.get(arg.id, []) if line <= node.lineno]
                    if before and _deviceless(before[-1]):
                        findings.add(Finding(where, node.lineno, call, arg.id))
    return sorted(findings, key=lambda f: (f.where, f.line))


def notebook_scripts(path: Path) -> Iterator[tuple[str, str]]:
    """(name, code) of each `%%writefile x.py` cell of a notebook (the last cell of a name wins)."""
    nb = json.loads(path.read_text())
    scripts: dict[str, str] = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        text = "".join(cell["source"])
        first, _, body = text.partition("\n")
        m = _WRITEFILE.match(first.strip())
        if m:
            scripts[m.group(1)] = body
    yield from scripts.items()


def workers(root: Path = ROOT) -> Iterator[tuple[str, str]]:
    """(where, code) of every worker the rule covers."""
    for folder in ("examples", "benchmarks", "tests/workers", "src/helpers", "src/dpc_runtime"):
        for path in sorted((root / folder).rglob("*.py")):
            yield str(path.relative_to(root)), path.read_text()
    for folder in ("course", "solutions"):
        for path in sorted((root / folder).rglob("*.ipynb")):
            for name, code in notebook_scripts(path):
                yield f"{path.relative_to(root)}[{name}]", code


def check(root: Path = ROOT) -> list[Finding]:
    """Every finding of every worker under root."""
    return [f for where, code in workers(root) for f in check_source(code, where)]


def names_used(root: Path = ROOT) -> dict[str, set[str]]:
    """dist.<name> -> the workers that use it (for the rule that they all exist since TORCH_MIN)."""
    used: dict[str, set[str]] = {}
    for where, code in workers(root):
        for node in ast.walk(ast.parse(code, filename=where)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "dist":
                used.setdefault(node.attr, set()).add(where)
    return used


def too_new(root: Path = ROOT) -> dict[str, set[str]]:
    """dist.<name> used by a worker that an older torch (>= TORCH_MIN) lacks, with no shim: name -> workers."""
    return {n: w for n, w in names_used(root).items() if n not in STABLE and n not in NEW_NAMES}


def main() -> int:
    found = check()
    for f in found:
        print(f.text())
    for name, where in sorted(too_new().items()):
        print(f"dist.{name} is not in every torch since {'.'.join(map(str, TORCH_MIN))}: {', '.join(sorted(where))}")
    print(f"collectives: {len(found)} tensor(s) handed to a collective without a device" if found
          else "collectives: none")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
