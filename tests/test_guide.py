"""The instructor's guide (book/guide/, pages of the website): every command it names exists and answers.

Its commands come from the pages themselves: each line of their shell blocks (heredoc bodies left out,
`a && b`, `a | b` and `a; b` taken apart) and each inline code span that starts with `make`, `nbgrader` or
`python -m`. Each one is checked where it runs:

* `make T ...`: `make -n` of the repository's Makefile (a block that opens with `# a student` is the
  student's, run with the release's Makefile, src/dpc_instructor/student_files/Makefile; an inline span
  may name either), with the names the guide sets (names.md) in the environment: it must succeed, know
  every target, and use every variable the command sets;
* `python -m M ...`: the module answers `--help` (and `M SUB --help` for a subcommand), which lists every
  option the command uses; `python -c ...` runs;
* `nbgrader SUB ...`: the subcommand exists (nbgrader's own table of them), answers `--help-all`, and
  knows every option the command uses; `bash`/`sbatch` scripts and the repository's files a command
  names exist; any other program is one of a known few (a typo is not).

Also here: the names the guide sets once (course id, exchange root, the three folders) are set on one
page and used as they are everywhere else; the term plan's machine minutes are the notebooks' Needs lines;
the pages are in the site's sources (book.py stages book/guide/) and in its navigation; the collector
catches commands that do not exist (a page made here); and the guide's own snippets run: the course CSV's
pivot and columns, a manual score, a backup, the hub's site configurations. The full tier runs the
nbgrader hand-in path as the pages write it (release, a student's `make submit`, collect, a due date,
feedback returned and fetched), with a temporary exchange, hand-in folder and gradebook.
"""
from __future__ import annotations

import csv
import functools
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gradekit import ROOT

from dpc_maintainer import book

GUIDE = ROOT / "book" / "guide"
NAMES_PAGE = GUIDE / "names.md"
MAKEFILE = ROOT / "Makefile"
STUDENT_MAKEFILE = ROOT / "src" / "dpc_instructor" / "student_files" / "Makefile"
BIN = Path(sys.executable).parent
NBGRADER = BIN / "nbgrader"
SHELLS = {"", "bash", "sh", "shell"}
STUDENT_MARK = "# a student"
PYTHONS = {"python", "python3"}
# Programs a line may start with besides make, python and nbgrader (checked only for being one of these).
KNOWN = {"cd", "export", "mkdir", "cp", "cat", "git", "install", "groupadd", "useradd", "chpasswd", "while",
         "do", "done", "echo", "tar", "flock", "systemctl", "conda", "bash", "sbatch", "jupyterhub", "journalctl",
         "watch"}
STANDARD_VARS = {"HOME", "PWD", "PATH", "USER"}
ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
VAR = re.compile(r"\$\{?([A-Z][A-Z0-9_]*)")
# Files of the repository a command names (checked to exist), once $REPO/ is dropped.
REPO_PATH = re.compile(r"(?<![\w.$/<-])((?:src|tests|slurm|book|labs|solutions|examples|benchmarks|course)/[\w./-]*\w)")


# --- the pages and their commands ------------------------------------------------------------------------

@dataclass
class Block:
    """One fenced shell block of a page: its lines (dedented), whether it is a student's, its heredocs."""

    page: str
    lines: list[str]
    student: bool = False
    heredocs: list[tuple[str, bool, list[str]]] = field(default_factory=list)  # (command line, quoted, body)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass(frozen=True)
class Command:
    """One command: its text (a segment of a line), where it is, and whose it is."""

    text: str
    where: str
    student: bool | None  # True: a student's block; False: an instructor's block; None: inline prose

    @property
    def words(self) -> list[str]:
        """Its words after VAR=value ones (and after flock and its lock file): the program, then its arguments."""
        words = shlex.split(substituted(self.text))
        words = words[next((i for i, w in enumerate(words) if not ASSIGNMENT.match(w)), len(words)):]
        return words[2:] if words[:1] == ["flock"] and len(words) > 2 else words

    @property
    def program(self) -> str:
        return Path(self.words[0]).name if self.words else ""

    @property
    def args(self) -> list[str]:
        return self.words[1:]


def substituted(text: str) -> str:
    """text with each `$(...)` (quotes and parentheses inside it followed) standing as one word."""
    out, i = "", 0
    while i < len(text):
        if not text.startswith("$(", i):
            out, i = out + text[i], i + 1
            continue
        depth, i, quote = 1, i + 2, ""
        while i < len(text) and depth:
            ch = text[i]
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch in "()":
                depth += 1 if ch == "(" else -1
            i += 1
        out += "SUBSTITUTED"
    return out


FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


def blocks(text: str, page: str) -> list[Block]:
    """The shell blocks of a page's markdown, in order."""
    found = []
    for m in FENCE.finditer(text):
        if m["lang"].strip() not in SHELLS:
            continue
        indent = len(m["indent"])
        lines = [line[indent:] if line[:indent].strip() == "" else line for line in m["body"].splitlines()]
        b = Block(page, lines, student=bool(lines) and lines[0].startswith(STUDENT_MARK))
        found.append(b)
    return found


def command_lines(block: Block) -> list[str]:
    """The block's command lines: continuations joined, comments dropped, heredoc bodies kept aside."""
    out: list[str] = []
    lines = "\n".join(block.lines).replace("\\\n", " ").splitlines()
    i = 0
    block.heredocs = []
    while i < len(lines):
        line = re.sub(r"(^|\s)#(\s.*)?$", "", lines[i]).strip()
        i += 1
        if not line:
            continue
        out.append(line)
        doc = HEREDOC.search(line)
        if doc:
            body = []
            while i < len(lines) and lines[i].strip() != doc[2]:
                body.append(lines[i])
                i += 1
            i += 1
            block.heredocs.append((line, bool(doc[1]), body))
    return out


def segments(line: str) -> list[str]:
    """A command line cut at `&&`, `||`, `|` and `;` outside quotes and `$(...)`; heredoc markers dropped."""
    parts, cur, quote, depth, i = [], "", "", 0, 0
    while i < len(line):
        ch = line[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif line.startswith("$(", i):
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif depth == 0 and (line.startswith("&&", i) or line.startswith("||", i)):
            parts.append(cur)
            cur, i = "", i + 2
            continue
        elif depth == 0 and ch in "|;":
            parts.append(cur)
            cur, i = "", i + 1
            continue
        cur += ch
        i += 1
    parts.append(cur)
    return [HEREDOC.sub("", p).strip() for p in parts if p.strip()]


def inline_commands(text: str) -> list[str]:
    """Inline code spans of the prose that name a make target, an nbgrader subcommand or a python module,
    with `...` and `<...>` placeholders filled with a dummy value."""
    prose = FENCE.sub("", text)
    found = []
    for span in re.findall(r"`([^`\n]+)`", prose):
        words = span.split()
        rest = [w for w in words if not ASSIGNMENT.match(w)]
        if len(rest) < 2 or rest[0] not in {"make", "nbgrader", *PYTHONS}:
            continue
        if rest[0] in PYTHONS and (rest[1] != "-m" or len(rest) < 3):
            continue
        span = re.sub(r"<[^>]*>", "x", span)
        span = re.sub(r"=\.\.\.(?=\s|$)", "=x", span)
        span = " ".join(w for w in span.split() if w != "...")
        found.append(span)
    return found


def pages() -> list[Path]:
    return sorted(GUIDE.glob("*.md"))


def guide_commands(paths: list[Path] | None = None) -> list[Command]:
    """Every command of the pages (each distinct text and kind once, at its first place)."""
    seen: dict[tuple[str, bool | None], Command] = {}
    for path in paths if paths is not None else pages():
        text = path.read_text()
        for b in blocks(text, path.name):
            for line in command_lines(b):
                for seg in segments(line):
                    seen.setdefault((seg, b.student), Command(seg, path.name, b.student))
        for span in inline_commands(text):
            seen.setdefault((span, None), Command(span, f"{path.name} (inline)", None))
    return list(seen.values())


# --- the names the guide sets ----------------------------------------------------------------------------

def names_lines() -> list[str]:
    """The `export NAME=value` lines of names.md."""
    return [line for b in blocks(NAMES_PAGE.read_text(), NAMES_PAGE.name) for line in command_lines(b)
            if line.startswith("export ")]


def defined_names() -> list[str]:
    return [line.split()[1].split("=")[0] for line in names_lines()]


@functools.cache
def names_env() -> dict[str, str]:
    """The environment names.md's exports give a shell opened in the repository."""
    script = "\n".join(names_lines()) + "\nenv -0"
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, "PWD": str(ROOT)})
    return dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)


# --- checking a command ----------------------------------------------------------------------------------

def run(cmd: list[str] | str, env: dict[str, str] | None = None, cwd: Path = ROOT,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env or names_env(), capture_output=True, text=True, timeout=timeout,
                          shell=isinstance(cmd, str), executable="/bin/bash" if isinstance(cmd, str) else None)


def make_problems(c: Command) -> list[str]:
    """`make -n` of the command with the Makefile it is for; its targets and its variables."""
    candidates = [STUDENT_MAKEFILE] if c.student else [MAKEFILE] if c.student is False \
        else [MAKEFILE, STUDENT_MAKEFILE]
    targets = [a for a in c.args if "=" not in a and not a.startswith("-")]
    problems = []
    for mf in candidates:
        dry = re.sub(r"^((?:[A-Za-z_]\w*=(?:\"[^\"]*\"|'[^']*'|\S)*\s+)*)make\b", rf"\1make -n -f {mf}", c.text)
        done = run(dry, timeout=120)
        out = done.stdout + done.stderr
        if done.returncode == 0 and "No rule to make target" not in out:
            text = mf.read_text()
            unused = [a.split("=")[0] for a in c.args if "=" in a and f"$({a.split('=')[0]})" not in text]
            return [f"{mf.relative_to(ROOT)} has no variable {v}" for v in unused]
        problems.append(f"make -n -f {mf.relative_to(ROOT)} {' '.join(targets)}: exit {done.returncode}: "
                        f"{out.strip()[-300:]}")
    return problems


@functools.cache
def module_help(module: str, sub: str = "") -> tuple[int, str]:
    """(exit status, output) of `python -m module [sub] --help`."""
    done = run([sys.executable, "-m", module, *([sub] if sub else []), "--help"], timeout=300)
    return done.returncode, done.stdout + done.stderr


def options(args: list[str]) -> list[str]:
    """The option names (`--name`) among a command's words."""
    return [a.split("=")[0] for a in args if a.startswith("--")]


def python_problems(c: Command) -> list[str]:
    args = c.args
    if args[:1] == ["-c"]:
        done = run(c.text, timeout=300)
        return [] if done.returncode == 0 else [f"exit {done.returncode}: {(done.stdout + done.stderr)[-300:]}"]
    if args[:1] == ["-"]:
        return []  # a heredoc script: the tests below run the ones the guide has
    if args[:1] != ["-m"] or len(args) < 2:
        return [f"python {' '.join(args[:1])}: only `python -m`, `python -c` and `python -` are known here"]
    module, rest = args[1], args[2:]
    code, text = module_help(module)
    if code != 0:
        return [f"python -m {module} --help: exit {code}: {text.strip()[-300:]}"]
    sub = rest[0] if rest and re.fullmatch(r"[a-z][\w-]*", rest[0]) else ""
    if sub:
        choices = {w for group in re.findall(r"\{([\w,-]+)\}", text) for w in group.split(",")}
        if sub in choices:
            code, text = module_help(module, sub)
            if code != 0:
                return [f"python -m {module} {sub} --help: exit {code}: {text.strip()[-300:]}"]
        elif sub not in text:
            return [f"python -m {module}: no subcommand {sub!r} in its --help"]
    return [f"python -m {module}{' ' + sub if sub else ''}: no option {o} in its --help"
            for o in options(rest) if o not in text]


def nbgrader_app(words: list[str]) -> tuple[list[str], type | None]:
    """The subcommand words of an nbgrader command and the app class they lead to (None: no such one)."""
    from nbgrader.apps import NbGraderApp
    from traitlets.utils.importstring import import_item

    app: type = NbGraderApp
    subs: list[str] = []
    for w in words:
        table = getattr(app, "subcommands", None) or {}
        if not re.fullmatch(r"[a-z_]+", w) or not table:
            break
        if w not in table:
            return subs + [w], None
        target = table[w][0]
        app = import_item(target) if isinstance(target, str) else target
        subs.append(w)
    return subs, app


@functools.cache
def configurables() -> dict[str, list[type]]:
    """nbgrader's configurable classes by name (CourseDirectory, Exchange, ExchangeCollect, ...): every class
    of that name (the exchange's abstract Exchange and its default one)."""
    import nbgrader.apps  # noqa: F401 (imports every app and what it configures)
    import nbgrader.coursedir  # noqa: F401
    import nbgrader.exchange.default  # noqa: F401
    from traitlets.config import Configurable

    found: dict[str, list[type]] = {}
    todo = [Configurable]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, []).append(cls)
        todo += cls.__subclasses__()
    return found


@functools.cache
def nbgrader_help(subs: tuple[str, ...]) -> tuple[int, str]:
    done = run([str(NBGRADER), *subs, "--help-all"], timeout=300)
    return done.returncode, done.stdout + done.stderr


def nbgrader_problems(c: Command) -> list[str]:
    subs, app = nbgrader_app(c.args)
    if app is None or not subs:
        return [f"nbgrader has no subcommand {' '.join(subs) or '(none given)'}"]
    code, text = nbgrader_help(tuple(subs))
    if code != 0:
        return [f"nbgrader {' '.join(subs)} --help-all: exit {code}: {text.strip()[-300:]}"]
    problems = []
    for opt in options(c.args[len(subs):]):
        name = opt[2:]
        if "." in name:  # --Class.trait: a configurable of nbgrader with that trait
            cls_name, trait = name.split(".", 1)
            if not any(trait in cls.class_traits(config=True) for cls in configurables().get(cls_name, [])):
                problems.append(f"nbgrader {' '.join(subs)}: no configurable {name}")
        elif not re.search(rf"^{re.escape(opt)}(=|\s*$)", text, re.M):
            problems.append(f"nbgrader {' '.join(subs)}: no option {opt} in its --help-all")
    return problems


def file_problems(c: Command) -> list[str]:
    """The repository's files the command names exist (a bash or sbatch script too)."""
    text = c.text.replace('"$REPO/', "").replace("$REPO/", "")
    missing = [p for p in REPO_PATH.findall(text) if not (ROOT / p).exists()]
    if c.program in {"bash", "sbatch"}:
        script = next((a for a in c.args if not a.startswith("-")), "")
        script = script.replace("$REPO/", "")
        if "$" not in script and not (ROOT / script).is_file():
            missing.append(script)
    return [f"no file {p} in the repository" for p in sorted(set(missing))]


def problems(c: Command) -> list[str]:
    """What is wrong with one command ([] when it exists and answers)."""
    prog = c.program
    found = file_problems(c)
    if prog == "":  # assignments alone (a shell variable of the block)
        pass
    elif prog == "make":
        found += make_problems(c)
    elif prog in PYTHONS:
        found += python_problems(c)
    elif prog == "nbgrader":
        found += nbgrader_problems(c)
    elif prog not in KNOWN:
        found.append(f"unknown program {prog!r}")
    return found


def check_all(commands: list[Command]) -> dict[str, list[str]]:
    """Each failing command ("where: text") -> its problems."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(problems, commands))
    return {f"{c.where}: {c.text}": p for c, p in zip(commands, results) if p}


# --- the gate: every command, the names, the plan, the site -------------------------------------------------

# tests/tiers.py: every test here is in the gate (marked one by one), but the hand-in path below, in the full tier.
gate = pytest.mark.gate


@gate
def test_the_guide_names_commands_of_every_kind():
    kinds = {c.program for c in guide_commands()}
    assert {"make", "python", "nbgrader"} <= kinds, kinds
    targets = {c.args[0] for c in guide_commands() if c.program == "make" and c.args}
    assert {"class-env", "release", "grade", "grades", "report", "feedback", "classroom-test", "cluster-test",
            "submit"} <= targets, targets


@gate
def test_every_command_of_the_guide_exists_and_answers():
    commands = guide_commands()
    assert len(commands) > 40, [c.text for c in commands]
    assert check_all(commands) == {}


@gate
def test_a_page_that_names_a_command_that_does_not_exist_fails(tmp_path):
    bad = tmp_path / "bad.md"
    bad.write_text("# A page\n\nRun `make no-such-target X=1` first, then:\n\n```bash\n"
                   "make grades COURSE=\"$GRADEBOOK\" LABS=x\n"
                   "python -m dpc_instructor.no_such_module --help\n"
                   "python -m dpc_instructor.gradebook exprot --course x\n"
                   "python -m dpc_instructor.report --no-such-option\n"
                   "cd \"$GRADEBOOK\" && nbgrader release_feedbak \"$LAB\"\n"
                   "nbgrader collect \"$LAB\" --Exchange.rooot=/x\n"
                   "bash src/dpc_setup/no_such_script.sh\n"
                   "mkae labs\n"
                   "```\n\n```bash\n# a student, in a terminal\nmake hand-in LAB=05-ring-allreduce\n```\n")
    commands = guide_commands([bad])
    failed = check_all(commands)
    expected = ["make no-such-target", "LABS=x", "no_such_module", "exprot", "--no-such-option",
                "release_feedbak", "Exchange.rooot", "no_such_script.sh", "mkae labs", "make hand-in"]
    for what in expected:
        assert any(what in where for where in failed), (what, failed)
    assert not any("cd " in where.split(": ", 1)[1][:3] for where in failed), failed  # cd itself is fine
    good = tmp_path / "good.md"
    good.write_text("# A page\n\n```bash\nmake grades COURSE=\"$GRADEBOOK\" OUT=x.csv\n"
                    "python -m dpc_instructor.gradebook export --course x\n```\n\n"
                    "```bash\n# a student\nmake submit LAB=05-ring-allreduce\n```\n")
    assert check_all(guide_commands([good])) == {}


@gate
def test_the_names_are_set_once_and_used_as_they_are_everywhere():
    names = defined_names()
    assert {"REPO", "COURSE_ID", "EXCHANGE", "HANDIN", "GRADEBOOK", "LAB", "PREFIX"} <= set(names), names
    env = names_env()
    assert env["GRADEBOOK"] == str(ROOT / "gradebook")  # make's default COURSE, absolute
    assert env["COURSE_ID"] == "dp-course"  # the class test's (src/dpc_maintainer/classroom/common.py)
    hub_config = (ROOT / "src/dpc_instructor/hub/jupyterhub_config.py").read_text()
    assert f'"DPC_EXCHANGE", "{env["EXCHANGE"]}"' in hub_config  # the hub's default exchange root
    assert f'"DPC_COURSE_ID", "{env["COURSE_ID"]}"' in hub_config
    wrong = []
    for path in pages():
        cwd = ""
        for b in blocks(path.read_text(), path.name):
            lines = command_lines(b)
            used = [v for line in lines for v in VAR.findall(line)]
            used += [v for _, quoted, body in b.heredocs if not quoted for line in body for v in VAR.findall(line)]
            assigned = {m for line in lines for m in re.findall(r"(?:^|\s)([A-Z][A-Z0-9_]*)=", line)}
            wrong += [f"{path.name}: ${v} is set nowhere" for v in used
                      if v not in names and v not in STANDARD_VARS and v not in assigned]
            for line in lines:
                if path != NAMES_PAGE and not b.student:
                    wrong += [f"{path.name}: gives {n} a value: {line}" for n in names
                              if re.search(rf"(?:^|\s){n}=(?!\"\${n}\")", line)]
                for opt, allowed in (("--course=", ('"$COURSE_ID"',)), ("--Exchange.root=", ('"$EXCHANGE"',)),
                                     ("--CourseDirectory.root=", ('"$HANDIN"', '"$GRADEBOOK"')),
                                     (" COURSE=", ('"$GRADEBOOK"',))):
                    for value in re.findall(rf"{re.escape(opt)}(\S+)", line):
                        if value not in allowed:
                            wrong.append(f"{path.name}: {opt}{value} (the names page's {' or '.join(allowed)})")
                for seg in segments(line):
                    c = Command(seg, path.name, b.student)
                    if c.program == "cd":
                        cwd = c.text
                    if c.program != "nbgrader" or b.student:
                        continue
                    subs, _ = nbgrader_app(c.args)
                    where = {'cd "$HANDIN"': "$HANDIN", 'cd "$GRADEBOOK"': "$GRADEBOOK"}.get(cwd)
                    if where is None:
                        wrong.append(f"{path.name}: nbgrader runs outside $HANDIN and $GRADEBOOK: {line}")
                    if subs[0] in {"release_assignment", "collect", "release_feedback"}:
                        if not ("--course=" in seg and "--Exchange.root=" in seg):
                            wrong.append(f"{path.name}: {subs[0]} without the course id and exchange root: {line}")
                        if f'--CourseDirectory.root="{where}"' not in seg:
                            wrong.append(f"{path.name}: {subs[0]} names another folder than it runs in: {line}")
                    if subs[0] == "db" and where != "$GRADEBOOK":
                        wrong.append(f"{path.name}: nbgrader db outside the gradebook: {line}")
    assert wrong == []


@gate
def test_every_setting_the_guide_names_is_read_by_the_course():
    read = "".join(p.read_text() for p in [*ROOT.glob("src/**/*.py"), *ROOT.glob("src/**/*.sh"), MAKEFILE,
                                         STUDENT_MAKEFILE])
    named = {v for p in pages() for v in re.findall(r"\bDPC_[A-Z_]+\b", p.read_text())}
    assert named and {v for v in named if v not in read} == set()


def needs_of(path: str) -> tuple[int, int, int]:
    """(idle, hub share, busy node) minutes of a notebook's Needs line."""
    from dpc_maintainer.needs import NEEDS

    cells = json.loads((ROOT / path).read_text())["cells"]
    found = NEEDS.search("\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"))
    assert found is not None, path
    return int(found["idle"]), int(found["busy"]), int(found["loaded"])


@gate
def test_the_term_plan_gives_the_notebooks_needs_lines():
    from dpc_runtime.manifest import chapters

    row = re.compile(r"^\| (\d+) \| (\d+) [^|]+\| (\d+) / (\d+) / (\d+) \| (?:(\d+) `([\w-]+)`|—) \| "
                     r"(?:(\d+) / (\d+) / (\d+)|—) \|", re.M)
    rows = {int(m[2]): m for m in row.finditer((GUIDE / "plan.md").read_text())}
    manifest = {ch.number: ch for ch in chapters()}
    assert sorted(rows) == sorted(manifest)
    for number, m in rows.items():
        ch = manifest[number]
        assert tuple(int(x) for x in m.group(3, 4, 5)) == needs_of(ch.notebook), ch.notebook
        assert (m[7] or None) == ch.lab, number
        if ch.lab:
            solution = sorted((ROOT / "solutions" / ch.lab).glob("*.ipynb"))[0].relative_to(ROOT).as_posix()
            assert tuple(int(x) for x in m.group(8, 9, 10)) == needs_of(solution), solution
            assert m[6] == str(int(ch.lab[:2]))


@gate
def test_the_node_size_page_gives_the_needs_lines_figures():
    from dpc_maintainer.needs import NEEDS

    found = []
    for path in [*sorted(ROOT.glob("course/*.ipynb")), *sorted(ROOT.glob("solutions/*/*.ipynb"))]:
        cells = json.loads(path.read_text())["cells"]
        m = NEEDS.search("\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"))
        assert m is not None, path
        found.append((path, m))
    text = " ".join((GUIDE / "sizing.md").read_text().split())
    cores = re.search(r"asks for (\d+) CPU cores and (\d+) or (\d+) GB", text)
    share = re.search(r"runs top to bottom in (\d+) to (\d+) minutes", text)
    busy = re.search(r"take up to (\d+) minutes \(chapter (\d+)\)", text)
    assert cores and share and busy, text
    assert {m["cores"] for _, m in found} == {cores[1]}
    assert sorted({m["gb"] for _, m in found}) == [cores[2], cores[3]]
    assert (min(int(m["busy"]) for _, m in found), max(int(m["busy"]) for _, m in found)) == \
        (int(share[1]), int(share[2]))
    slowest = max(found, key=lambda f: int(f[1]["loaded"]))
    assert int(slowest[1]["loaded"]) == int(busy[1]) and slowest[0].name.startswith(f"{int(busy[2]):02d}-")


@gate
def test_the_guide_is_in_the_site(tmp_path):
    """book.py stages every page of book/guide/ as guide/<page>.md; the guide's index lists them all, and
    the start page's navigation lists the guide."""
    on_disk = sorted(f"guide/{p.name}" for p in pages())
    assert book.guide_pages() == on_disk
    book.stage(tmp_path / "src", book.Hub())
    assert sorted(f"guide/{p.name}" for p in (tmp_path / "src" / "guide").glob("*.md")) == on_disk
    for page in on_disk:
        assert (tmp_path / "src" / page).read_text() == (ROOT / "book" / page).read_text()
    index = (GUIDE / "index.md").read_text()
    listed = [line.strip() for tree in re.findall(r"```\{toctree\}\n(.*?)```", index, re.S)
              for line in tree.splitlines() if line.strip() and not line.startswith(":")]
    assert sorted(listed) == sorted(p.stem for p in pages() if p.name != "index.md")
    start = (ROOT / "book" / "index.md").read_text()
    assert any("guide/index" in tree.split() for tree in re.findall(r"```\{toctree\}\n(.*?)```", start, re.S))
    for p in pages():  # links between pages name pages that exist
        for target in re.findall(r"\]\(([\w-]+\.md)\)", p.read_text()):
            assert (GUIDE / target).exists(), (p.name, target)


# --- the guide's snippets, run -------------------------------------------------------------------------------

def block_with(page: str, text: str) -> Block:
    """The one shell block of a page that holds text."""
    found = [b for b in blocks((GUIDE / page).read_text(), page) if text in b.text]
    assert len(found) == 1, (page, text, len(found))
    command_lines(found[0])
    return found[0]


@pytest.fixture
def small_course(tmp_path, monkeypatch):
    """A gradebook as `make grade` leaves it (tests/test_report.py's: 6 students, 2 labs)."""
    import test_report

    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")  # nbgrader's alembic
    return test_report.build(tmp_path / "term" / "gradebook")


def course_csv(course, out: Path) -> list[dict[str, str]]:
    course.export(out)
    with out.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@gate
def test_the_grades_page_gives_the_csv_its_columns_and_the_pivot_runs(small_course, tmp_path):
    rows = course_csv(small_course, tmp_path / "course-grades.csv")
    page = (GUIDE / "grades.md").read_text()
    table = page[page.index("| column | what |"):]
    columns = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert columns == list(rows[0])
    b = block_with("grades.md", "per-lab.csv")
    done = run(b.text, env={**names_env(), "GRADEBOOK": str(small_course.root)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with (tmp_path / "per-lab.csv").open(newline="", encoding="utf-8") as f:
        wide = list(csv.reader(f))
    labs = sorted({r["lab"] for r in rows if r["lab"] != "(course)"})
    assert wide[0] == ["grader_id", "student", *labs]
    totals = {(r["grader_id"], r["lab"]): r["points"] for r in rows if r["cell"] == "(lab total)"}
    assert len(wide) - 1 == len({r["grader_id"] for r in rows})  # one row per student
    for gid, _, *points in wide[1:]:
        assert points == [totals[gid, lab] for lab in labs]


@gate
def test_the_manual_score_block_gives_the_points(small_course):
    b = block_with("manual-grading.md", "manual_score")
    script = re.sub(r"STUDENT=\S+ CELL=\S+ POINTS=\S+", "STUDENT=bob CELL=lab01-test-batches POINTS=2", b.text)
    done = run(script, env={**names_env(), "GRADEBOOK": str(small_course.root), "LAB": "01-alpha"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bob 01-alpha lab01-test-batches: 2 of 3" in done.stdout
    row = next(r for r in small_course.rows() if r["grader_id"] == "bob" and r["cell"] == "lab01-test-batches")
    assert (row["points"], row["manual_points"], row["status"]) == ("2", "2", "graded")


@gate
def test_the_backup_holds_the_gradebook(small_course, tmp_path):
    save = block_with("backup.md", "tar -czf")
    env = {**names_env(), "GRADEBOOK": str(small_course.root)}
    (tmp_path / "safe").mkdir()
    done = run(save.text, env=env, cwd=tmp_path / "safe")
    assert done.returncode == 0, done.stderr
    archive = next((tmp_path / "safe").glob("gradebook-*.tar.gz"))
    restore = block_with("backup.md", "tar -xzf")
    (tmp_path / "restored").mkdir()
    script = re.sub(r"gradebook-\S+\.tar\.gz", str(archive), restore.text)
    done = run(script, env={**env, "GRADEBOOK": str(tmp_path / "restored" / "gradebook")})
    assert done.returncode == 0, done.stderr
    from dpc_instructor import gradebook

    assert gradebook.Course(tmp_path / "restored" / "gradebook").rows() == small_course.rows()


@gate
@pytest.mark.parametrize("page", ["accounts.md", "tls.md"])
def test_a_site_configuration_keeps_the_courses(page, tmp_path, monkeypatch):
    from traitlets.config.loader import PyFileConfigLoader

    b = block_with(page, "load_subconfig")
    env = {**names_env(), "PREFIX": str(tmp_path)}
    (tmp_path / "hub-state").mkdir()
    done = run(b.text, env=env)
    assert done.returncode == 0, done.stderr
    monkeypatch.chdir(tmp_path / "hub-state")
    config = PyFileConfigLoader("site_config.py", path=str(tmp_path / "hub-state")).load_config()
    assert config.JupyterHub.authenticator_class == ("ldapauthenticator.LDAPAuthenticator" if page == "accounts.md"
                                                      else "pam")
    assert config.Spawner.environment["DPC_PYTHON"].endswith("/env/bin/python")  # the course's, kept
    if page == "tls.md":
        assert config.JupyterHub.ssl_cert and config.JupyterHub.ssl_key


@gate
def test_the_service_starts_the_hub_with_the_courses_configuration(tmp_path):
    b = block_with("systemd.md", "ExecStart")
    line, quoted, body = b.heredocs[0]
    assert not quoted
    env = names_env()
    unit = run("cat <<EOF\n" + "\n".join(body) + "\nEOF", env=env).stdout
    start = re.search(r"^ExecStart=(\S+) -f (\S+)$", unit, re.M)
    assert start and start[1].endswith("/hub/venv/bin/jupyterhub") and Path(start[2]).is_file(), unit
    settings = dict(re.findall(r"^Environment=(\w+)=(.*)$", unit, re.M))
    assert settings["PYTHONPATH"] == str(ROOT / "src") and settings["DPC_EXCHANGE"] == env["EXCHANGE"]


# --- the full tier: the hand-in path as the pages write it --------------------------------------------------

@pytest.mark.full
def test_the_hand_in_path_runs_as_the_pages_write_it(tmp_path):
    """Release, a student's `make submit`, collect, a due date, feedback returned and fetched: each page's
    own block, with the names of names.md pointed at temporary folders (one user plays both parts)."""
    from nbgrader.api import Gradebook

    from dpc_instructor import gradebook

    env = {**names_env(), "HOME": str(tmp_path / "home"), "EXCHANGE": str(tmp_path / "exchange"),
           "HANDIN": str(tmp_path / "handin"), "GRADEBOOK": str(tmp_path / "gradebook"),
           "PREFIX": str(tmp_path / "prefix")}
    (tmp_path / "home").mkdir()
    lab, user = env["LAB"], pwd.getpwuid(os.getuid()).pw_name  # nbgrader's student id: the account's name
    notebook = sorted((ROOT / "labs" / lab).glob("*.ipynb"))[0].name

    def page_run(page: str, text: str, where: dict[str, str] = env, cwd: Path = ROOT) -> str:
        b = block_with(page, text)
        script = "set -e\n" + "\n".join(line for line in b.text.splitlines()
                                        if not line.startswith(("make feedback COURSE", "make class-env")))
        done = run(script, env=where, cwd=cwd, timeout=600)
        assert done.returncode == 0, f"{page}:\n{script}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        return done.stdout + done.stderr

    page_run("names.md", "install -d")
    assert (Path(env["EXCHANGE"]).stat().st_mode & 0o7777) == 0o1777
    page_run("class-env.md", "--student-lab-config")  # the class environment's nbgrader settings
    page_run("release-nbgrader.md", "mkdir -p")
    # The student: a copy of the release's lab with its Makefile, the variables the hub gives every server.
    home = tmp_path / "home" / "dp-course-student"
    shutil.copytree(ROOT / "labs" / lab, home / "labs" / lab)
    shutil.copyfile(STUDENT_MAKEFILE, home / "Makefile")
    student = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    student.update({"HOME": env["HOME"], "DPC_PYTHON": sys.executable, "DPC_COURSE_ID": env["COURSE_ID"],
                    "DPC_EXCHANGE": env["EXCHANGE"], "JUPYTER_CONFIG_PATH": f"{env['PREFIX']}/env/etc/jupyter",
                    "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    assert "Submitted as" in page_run("collect.md", "make submit", student, home)
    page_run("collect.md", 'cd "$HANDIN"')
    handed = Path(env["HANDIN"]) / "submitted" / user / lab
    assert {notebook, "timestamp.txt", "submission_secret.txt"} <= {p.name for p in handed.iterdir()}
    # The gradebook as a first `make grade` leaves its settings (no grading here), then the due date.
    gradebook.nbgrader_course(Path(env["GRADEBOOK"]), lab, write_source=False)
    assert "(due: 2026-12-01 17:00:00)" in page_run("due-dates.md", "--duedate")
    with Gradebook(f"sqlite:///{env['GRADEBOOK']}/gradebook.db") as gb:
        assert str(gb.find_assignment(lab).duedate) == "2026-12-01 17:00:00"
    # `make feedback`'s layout (no grading here), returned, then fetched by the student.
    pages_at = Path(env["GRADEBOOK"]) / "feedback" / user / lab
    pages_at.mkdir(parents=True)
    for kept in ("timestamp.txt", "submission_secret.txt"):
        shutil.copyfile(handed / kept, pages_at / kept)
    (pages_at / notebook.replace(".ipynb", ".html")).write_text("<html><body>your feedback</body></html>")
    page_run("feedback.md", "release_feedback")
    page_run("feedback.md", "make feedback LAB", student, home)
    fetched = list((home / "labs" / lab / "feedback").glob("*/*.html"))
    assert [p.read_text() for p in fetched] == ["<html><body>your feedback</body></html>"]
