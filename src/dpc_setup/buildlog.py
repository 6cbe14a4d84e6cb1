"""Read Horovod's build log for horovod/build.sh: a progress line while it builds, the first error and its fix.

Standard library only: build.sh runs this file as a script with the Python it builds for.
  python buildlog.py progress LOG   one line: configure, compile N % (files), link or package
  python buildlog.py failure LOG    the first error line(s) of the log, and the fix the course knows
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

# The first line that says what went wrong: CMake's, the compiler's, make's, the kernel's OOM kill.
ERROR = re.compile(r"CMake Error|(?:^|\s)(?:fatal )?error:|\*\*\* \[.*\] Error \d+|Killed signal|"
                   r"No space left on device|command not found")
# Lines that look like an error and are not the cause (pip's own summary comes after the real one).
NOT_CAUSE = re.compile(r"subprocess-exited-with-error|legacy-install-failure|Failed to build|"
                       r"failed-wheel-build|metadata-generation-failed")
# pip wheel -v indents what the build prints by two spaces.
STEP = re.compile(r"^\s*\[\s*(\d+)%\]\s+(Building|Linking)\s.*\s(\S+)$")
# What the course knows how to fix, by a phrase of the error.
FIXES = (
    ("Could NOT find CUDAToolkit",
     "torch here is a CUDA build and the CUDA toolkit (nvcc) is missing. Without a GPU the course "
     "builds Horovod's CPU (Gloo) variant: run `make horovod` again with DPC_GPU=0; on a GPU machine, "
     "install the CUDA toolkit that matches torch.version.cuda"),
    ("No CMAKE_CXX_COMPILER could be found",
     "no C++ compiler: install g++ (Debian/Ubuntu: sudo apt-get install g++), then `make horovod`"),
    ("Python.h: No such file",
     "Python's headers are missing: install them (Debian/Ubuntu: sudo apt-get install python3-dev)"),
    ("No space left on device",
     "the disk is full: the build needs about 2 GB in $TMPDIR (default /tmp) and the course's cache"),
    ("Killed signal",
     "the compiler ran out of memory: build one file at a time with DPC_HOROVOD_JOBS=1 make horovod"),
    ("cmake: command not found",
     "CMake is missing from the environment: `make setup` installs it (requirements.txt)"),
)


def progress(log: str) -> str:
    """Where the build is, from its log so far: configure, compile N % (the last file), link, package."""
    steps = [m for m in map(STEP.match, log.splitlines()) if m]
    if not steps:
        return "configure (CMake looks for TensorFlow, PyTorch and a compiler)"
    last = steps[-1]
    percent, kind, target = last.group(1), last.group(2), Path(last.group(3)).name
    if "installing to" in log or "creating build/bdist" in log or percent == "100" and kind == "Linking":
        return "package (the wheel)"
    compiled = sum(1 for m in steps if m.group(2) == "Building")
    if kind == "Linking":
        return f"link {target} ({percent} %)"
    return f"compile {percent} % ({compiled} files so far, now {target.removesuffix('.o')})"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def first_error(log: str, context: int = 6) -> list[str]:
    """The first line that names the cause, with the lines indented deeper after it (CMake's message)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if ERROR.search(line) and not NOT_CAUSE.search(line):
            block = [line.strip()]
            for nxt in lines[i + 1:i + 1 + context]:
                if not nxt.strip() or _indent(nxt) <= _indent(line):
                    break
                block.append(" " * (_indent(nxt) - _indent(line)) + nxt.strip())
            return block
    return []


def fix(log: str) -> str | None:
    """The one-line fix the course knows for this log's failure, if any."""
    return next((how for phrase, how in FIXES if phrase in log), None)


def failure(log: str, path: str) -> str:
    """The message a failed build prints: the first error, the fix if known, where the whole log is."""
    error = first_error(log)
    out = ["Horovod's build failed. First error:" if error else
           "Horovod's build failed, with no error line the course recognises; the log's last lines:"]
    out += ["  " + line for line in (error or log.splitlines()[-15:])]
    how = fix(log)
    if how:
        out.append(f"Fix: {how}.")
    out.append(f"The whole build log: {path}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    """`progress LOG` or `failure LOG`: print that, exit 0."""
    if len(argv) != 2 or argv[0] not in {"progress", "failure"}:
        print("usage: buildlog.py progress|failure LOG", file=sys.stderr)
        return 2
    path = Path(argv[1])
    log = path.read_text(errors="replace") if path.exists() else ""
    print(progress(log) if argv[0] == "progress" else failure(log, argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
