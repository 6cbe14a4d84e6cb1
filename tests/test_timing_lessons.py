"""The timing lessons on a busy machine (issue 35, item 1): chapter 11's overlap comparison and bucket-size
sweep, chapter 8's speed-up and chapter 5's comparison of all-reduce methods, run with their CI parameters
idle, beside two CPU hogs, and on one core.

Each printed conclusion must either agree with the direction the prose gives it, or the watch's line
under it must say the machine was too busy: a conclusion may never silently be the opposite of the
text. Only the cells of those sections run (and the cells that write the scripts they launch), from
the committed chapters, in a fresh kernel each, in a folder of the test's own.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from dpc_runtime import manifest
from helpers import MachineWatch
from helpers.timing import LOAD_LIMIT

ROOT = Path(__file__).resolve().parents[1]
CH5, CH8, CH11 = "course/05-ring-allreduce.ipynb", "course/08-scaling-up.ipynb", "course/11-inside-ddp.ipynb"
LINE = re.compile(r"^machine: .*?: (calm enough|too busy) for (the [\w\s-]+?)(?: \((.*?)\); rerun|$)", re.M)
RESULT = re.compile(r"^result: (the lesson shows|cannot tell|the other way|not judged)", re.M)  # helpers.timing's verdicts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def section(rel: str, until: str, skip: tuple[str, ...]) -> nbformat.NotebookNode:
    """The notebook's cells up to the heading `until`, its CI parameters injected, less the code cells
    that contain one of `skip` (plots, launches the timing does not need)."""
    nb = nbformat.read(ROOT / rel, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith(until):
            break
        if cell.cell_type != "code" or any(s in cell.source for s in skip):
            continue
        cells.append(cell)
        if "parameters" in cell.metadata.get("tags", []):
            ci = manifest.notebooks()[rel]["ci"]
            cells.append(nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in ci.items())))
    nb.cells = cells
    return nb


def run(rel: str, folder: Path) -> str:
    """Execute the timing sections of one chapter in folder/course; return everything its cells printed."""
    if rel == CH5:
        nb = section(CH5, "## What to take away", ("plot_ring(", "plot_ring_step(", "check_ring", "same.values()"))
    elif rel == CH8:
        nb = section(CH8, "### Where the time goes", ("plt.show()",))
    else:
        nb = section(CH11, "## 4.", ("plt.show()", "buckets.py", "first_bucket_cap"))
    cwd = folder / "course"
    cwd.mkdir(parents=True, exist_ok=True)
    if not (folder / "examples").exists():
        (folder / "examples").symlink_to(ROOT / "examples")  # chapter 8 finds its workers upwards
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    printed = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            printed.append(out.get("text", "") if out.get("output_type") == "stream" else "")
    text = "".join(printed)
    print(f"--- {rel}\n{text}")  # shown with -rA or when the test fails
    return text


def verdicts(text: str) -> dict[str, str]:
    """{what: "calm enough" or "too busy"} from the watch's lines."""
    return {what: verdict for verdict, what, _ in LINE.findall(text)}


def reasons(text: str) -> dict[str, str]:
    """{what: why the watch said too busy ('' when calm)} from the watch's lines."""
    return {what: why for _, what, why in LINE.findall(text)}


def judge_ch11(text: str) -> dict[str, bool]:
    """{what: whether the printed conclusion agrees with the prose} for chapter 11."""
    ratio = re.search(r"after / overlap: measured ([\d.]+), the model between 1\.00 and ([\d.]+)", text)
    result = re.search(r"^result: (the lesson shows|cannot tell|the other way|not judged)", text, re.M)
    assert ratio and result, f"chapter 11 no longer prints its conclusions as this test reads them:\n{text}"
    # Overlap hides communication: the step after backward is the longer one.
    # (Within 3 % the two steps tie: the opposite of the prose is overlap measurably slower.)
    # The sweep judges its own numbers: the lesson shows, or they cannot tell; "the other way" is flagged by
    # the line itself, but on a calm machine this test counts it as a lesson that did not hold.
    return {"the overlap comparison": float(ratio.group(1)) > 0.97,
            "the bucket-size sweep": result.group(1) in ("the lesson shows", "cannot tell", "not judged")}


def judge_ch5(text: str) -> dict[str, bool]:
    """{what: whether the printed conclusion agrees with the prose} for chapter 5."""
    rows = re.findall(r"^N = \d+: ring/gloo ([\d.]+) at [\d.]+ MB, ([\d.]+) at [\d.]+ MB: .*; "
                      r"the model (.+?) \(α", text, re.M)  # the model's two ratios, or why it has none
    assert rows, f"chapter 5 no longer prints its conclusion as this test reads it:\n{text}"
    # The prose: C++ moves and adds the bytes in both, so on the largest message expect the ring and gloo in
    # the same range (which one leads can go either way); on the smallest the ring's per-message cost may
    # show, as the model beside it says, so any ratio there agrees with the text.
    ok = all(1 / 3 <= float(large) <= 3 for _, large, _ in rows)
    return {"the method comparison": ok}


def judge_ch8(text: str) -> dict[str, bool]:
    """{what: whether the printed conclusion agrees with the prose} for chapter 8."""
    rows = re.findall(r"rank\(s\) on [\d.]+ core\(s\): efficiency at most (\d+)% from the cores alone, "
                      r"(\d+)% by the model; measured (\d+)%", text)
    assert rows, f"chapter 8 no longer prints its conclusion as this test reads it:\n{text}"
    # The measured efficiency never exceeds the cores' bound, and sits at or below the model
    # (a few points of noise between launches allowed).
    ok = all(int(m) <= int(cap) + 3 and int(m) <= int(model) * 1.1 + 3 for cap, model, m in rows)
    return {"the speed-up comparison": ok}


def lessons(folder: Path) -> tuple[dict[str, tuple[bool, str, str]], list[str]]:
    """Run the chapters' timing sections; ({what: (agrees, verdict, why)}, each conclusion checked; the
    outcome of every result line they printed, helpers.timing's verdicts on the numbers)."""
    found, results = {}, []
    for rel, judge in ((CH5, judge_ch5), (CH11, judge_ch11), (CH8, judge_ch8)):
        text = run(rel, folder / rel.split("/")[1][:2])
        results += RESULT.findall(text)
        said = verdicts(text)
        for what, agrees in judge(text).items():
            assert what in said, f"{rel}: no machine line for {what}:\n{text}"
            assert agrees or said[what] == "too busy", (
                f"{rel}: the printed conclusion of {what} contradicts the prose, and the machine line says "
                f"{said[what]!r}:\n{text}")
            found[what] = (agrees, said[what], reasons(text)[what])
    assert len(results) >= 4, f"the chapters no longer print their result lines as this test reads them: {results}"
    return found, results


@pytest.fixture
def hogs():
    """Two processes that each keep a CPU busy, as a classmate's job does; killed after the test."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def one_core():
    """This process (and so the kernels and ranks it starts) on one CPU only; restored after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    yield
    os.sched_setaffinity(0, before)


@pytest.mark.gate
def test_idle_machine_can_be_calm(tmp_path):
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip("the suite's other workers share this machine: run this file alone to see a calm verdict")
    first = MachineWatch(need=2).start().stop()
    if not first.calm:
        pytest.skip(f"the machine is busy before the run, so a calm verdict cannot be shown: {first.line('this test')}")
    found, results = lessons(tmp_path)
    # Chapter 5's all-reduces of a few milliseconds vary between samples on an idle 2-core cloud VM (the
    # same 2 MB gloo call took 0.9 to 9 ms in one launch: the host's scheduling): its watch may say so,
    # by the repeats' spread alone, never by the machine's figures.
    noisy = {what for what, (_, verdict, why) in found.items()
             if what == "the method comparison" and verdict == "too busy" and why.startswith("the repeats spread")
             and ";" not in why}
    busy = [what for what, (_, verdict, _) in found.items() if verdict != "calm enough" and what not in noisy]
    if busy:
        after = MachineWatch(need=2).start().stop()
        if not after.calm:
            pytest.skip(f"the machine got busy during the run ({', '.join(busy)} too busy): {after.line('this test')}")
    assert not busy, f"an idle machine should be calm enough for {busy}"
    assert all(agrees for what, (agrees, _, _) in found.items() if what not in noisy), found
    # calm: every result judged; "the other way" is a flagged outcome the prose allows (chapter 5's can turn)
    assert "not judged" not in results, results


@pytest.mark.full
def test_beside_two_cpu_hogs(tmp_path, hogs):
    found, results = lessons(tmp_path)
    if (2 + 1) / (os.cpu_count() or 1) > LOAD_LIMIT:  # the hogs and one rank already overfill this machine
        assert all(verdict == "too busy" for _, verdict, _ in found.values()), f"the watch missed the hogs: {found}"
        assert set(results) == {"not judged"}, f"a result judged beside the hogs: {results}"


@pytest.mark.full
def test_on_one_core(tmp_path, one_core):
    found, results = lessons(tmp_path)
    assert "the other way" not in results, results  # one core for 2 ranks is never a calm machine
    # chapter 11 runs 2 ranks: on one core the watch must say so; chapter 8's bound is the core itself, and
    # chapter 5 compares methods at the same N on the same cores (it asks for no more cores than there are)
    assert found["the overlap comparison"][1] == "too busy"
    assert found["the bucket-size sweep"][1] == "too busy"
