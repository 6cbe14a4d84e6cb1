"""The graded-lab pipeline end to end: submissions built from the student copy in labs/ are
autograded by src/dpc_instructor/grade.py (nbgrader, per-cell timeouts, a wall-clock limit per student).

A correct submission written differently from the reference gets full marks (the reference itself
passes, or the grader refuses to grade: dpc_instructor.grading.reference.reference), typical mistakes lose
exactly the points of the tests they break, an infinite loop is cut at its cell timeout while the rest is still graded, a notebook that
survives interrupts is reported 'not graded' without blocking the others, and no process is left.

A submission that does no work and fights the tests from inside the kernel ('tamper': gradekit.TAMPER,
zeros for data, the course helpers the tests measure with patched - helpers.SlowSource's load
counters, helpers.WhoLoads' process ids, helpers.tf_pipeline_ops - and `record` rebound so that
every bound is met) gets nothing: the test cells record the batches themselves, and read the
parallel map, the prefetch, num_workers and pin_memory from the pipeline's own graph and the
loader itself, asserting them in the kernel before they are recorded. (Not covered: a submission
that also strips the asserts from later cells, with an IPython AST transformer, keeps the 6 points
whose recorded evidence is a fact known in advance - a parallel map, a final prefetch, 2+ workers,
pin_memory - as the judge compares values only.)

The hidden same-batches cases (issue 36) are drawn outside every kernel: the lab's locked cell
lab01-cases defines hidden_cases(draw), the grader makes them in a process of its own and hands the
kernels only their sizes (hidden-cases.json), with no DPC_GRADE_SEED. Redrawing them would buy a
student nothing here (a case's answer, its batches, is what the lab's own slow pipeline gives for
the sizes the test passes in), so instead the correct submission ('other', the seeker) looks for the run's seed
(a 16-digit one, so that no number matches it by chance) in its environment, in every file it can
read (its folder, /tmp, its home, /proc of every process it sees) and for a random generator in the
frames above its functions, and breaks when it finds one: it gets full marks. (Before issue 36 the
kernel's environment held the seed and a hidden test's frame the generator drawn from it; the probe
finds both: test_the_seeker_would_see_the_seed_and_a_generator.)
"""
from __future__ import annotations

import os
import re

import gradekit
import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, submission as fill

LAB = "01-input-pipeline"
RELEASE = ROOT / "labs" / LAB / "input-pipeline.ipynb"

CORRECT = {
    "lab01-fast-tf-pipeline": '''def fast_tf_pipeline(source, batch_size):
    ds = tf.data.Dataset.range(len(source))
    ds = ds.map(lambda i: load_tf(source, i), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)''',
    "lab01-fast-torch-loader": '''def fast_torch_loader(dataset, batch_size, device):
    return DataLoader(dataset, batch_size=batch_size, num_workers=3,
                      pin_memory=device.type == "cuda")''',
}
# Correct in another shape: a fixed number of parallel calls, a prefetch of 2 batches, positional
# batch size, two workers, prefetch_factor, pinning written as a conditional expression.
OTHER = {
    "lab01-fast-tf-pipeline": '''def fast_tf_pipeline(source, batch_size):
    indices = tf.data.Dataset.range(len(source))
    loaded = indices.map(lambda i: load_tf(source, i), num_parallel_calls=8, deterministic=True)
    return loaded.batch(batch_size, drop_remainder=False).prefetch(2)''',
    "lab01-fast-torch-loader": '''def fast_torch_loader(dataset, batch_size, device):
    pin = True if device.type == "cuda" else False
    return DataLoader(dataset, batch_size, shuffle=False, num_workers=2, prefetch_factor=4,
                      pin_memory=pin)''',
}
# Typical mistakes: a prefetch but no parallel map; workers but shuffled and always pinned.
WRONG = {
    "lab01-fast-tf-pipeline": '''def fast_tf_pipeline(source, batch_size):
    return slow_tf_pipeline(source, batch_size).prefetch(tf.data.AUTOTUNE)''',
    "lab01-fast-torch-loader": '''def fast_torch_loader(dataset, batch_size, device):
    return DataLoader(dataset, batch_size=batch_size, num_workers=2, shuffle=True,
                      pin_memory=True)''',
}
# A debugging loop left in a cell (waiting for something that never comes): interrupted at the cell
# timeout, the rest is graded. It sleeps rather than spins, so that it does not slow its neighbours.
# Its loader pins for the first GPU only (`cuda`, `cuda:0`): a device that is not the first (the hidden
# cuda:1, issue 59) loses the pinning test. One lab run carries both.
LOOPING = {"lab01-fast-tf-pipeline": "import time\nwhile True:\n    time.sleep(0.1)",
           "lab01-fast-torch-loader": '''def fast_torch_loader(dataset, batch_size, device):
    first_gpu = device in (torch.device("cuda"), torch.device("cuda", 0))
    return DataLoader(dataset, batch_size=batch_size, num_workers=3, pin_memory=first_gpu)'''}
# A loop that swallows the interrupt itself: only the wall-clock limit per student stops it.
SURVIVOR = {**CORRECT, "lab01-fast-tf-pipeline": '''import time
while True:
    try:
        time.sleep(0.1)
    except BaseException:
        pass'''}

# No work, and every trick from inside the kernel: the asserts neutralised (gradekit.TAMPER), the
# course helpers the tests measure with made to report parallel loads and worker processes, and
# `record` made to show the grader every bound met and the pinning it expects.
TAMPERING = {
    "lab01-fast-tf-pipeline": TAMPER + '''

class _Counted(helpers.SlowSource):  # every probe "saw" all its loads, 8 at a time
    calls = property(lambda self: self.n, lambda self, value: None)
    max_in_flight = property(lambda self: 8, lambda self, value: None)


helpers.SlowSource = _Counted
helpers.tf_pipeline_ops = lambda ds: ["RangeDataset", "ParallelMapDatasetV2", "BatchDatasetV2", "PrefetchDataset"]
_record = record


def record(name, value, **bounds):  # the grader is shown what it asks for
    if bounds.get("at_least") is not None:
        value = bounds["at_least"]
    elif isinstance(value, str):
        value = "PrefetchDataset"
    elif name.startswith("pin_memory"):
        value = "CPU" not in name
    _record(name, value, **bounds)


def fast_tf_pipeline(source, batch_size):
    _claim_full_marks()
    zeros = (tf.zeros((source.image_size, source.image_size, 3)), tf.constant(0, tf.int64))
    return tf.data.Dataset.from_tensors(zeros).repeat(len(source)).batch(batch_size)''',
    "lab01-fast-torch-loader": '''class _Anyone(helpers.WhoLoads):  # every sample "loaded" by one of three made-up workers
    def __getitem__(self, i):
        return int(i), 10**6 + int(i) % 3


helpers.WhoLoads = _Anyone


def _zeros(batch):  # the images replaced by zeros; the labels (and WhoLoads' "process ids") kept
    return [torch.zeros((len(batch),) + np.shape(batch[0][0])), torch.tensor([s[1] for s in batch])]


def fast_torch_loader(dataset, batch_size, device):
    _claim_full_marks()
    return DataLoader(dataset, batch_size=batch_size, collate_fn=_zeros)''',
}

# The grading run's seed: the session's (conftest), made 16 digits long so that no other number of
# the kernel's files or processes contains it by chance.
SEED = 10**15 + int(os.environ["DPC_GRADE_SEED"])
# Correct, and looking for a way to redraw the hidden cases before each call: the run's seed in its
# environment or in any file or process it can read, a numpy generator in a frame above it. It
# breaks (every test that calls it fails) when it finds one. The seed is written in as SEED + 1.
PROBE = '''import inspect
import os

import numpy as np

_SEED = str({seed_plus_one} - 1)
_PLACES = [os.getcwd(), "/tmp", os.path.expanduser("~"), "/proc"]  # the sandbox's own /tmp and home


def _traces():
    """Where this kernel could redraw the grading run's hidden cases from."""
    found = [f"environment {{k}}" for k, v in os.environ.items() if k == "DPC_GRADE_SEED" or _SEED in v]
    for top in dict.fromkeys(_PLACES):
        for folder, dirs, files in os.walk(top):
            if folder == "/proc":  # only the processes' own environments and command lines
                dirs[:] = []
                files = [f"{{d}}/{{f}}" for d in os.listdir("/proc") if d.isdigit() for f in ("environ", "cmdline")]
            for name in files:
                try:
                    with open(os.path.join(folder, name), "rb") as f:
                        if _SEED.encode() in f.read(1 << 24):
                            found.append(f"file {{os.path.join(folder, name)}}")
                except OSError:
                    pass
    frame = inspect.currentframe().f_back
    while frame is not None:
        if any(isinstance(v, np.random.Generator) for v in frame.f_locals.values()):
            found.append(f"a generator in the frame of {{frame.f_code.co_name}}")
        frame = frame.f_back
    return found


def _refuse_if_traced():
    found = _traces()
    if found:
        raise RuntimeError(f"the hidden cases could be redrawn from: {{found}}")


'''.format(seed_plus_one=SEED + 1)
# The correct answer in another shape, seeking: it breaks where it finds a trace of the hidden cases.
SEEKER = {
    "lab01-fast-tf-pipeline": PROBE + OTHER["lab01-fast-tf-pipeline"].replace(
        "    indices = tf.data", "    _refuse_if_traced()\n    indices = tf.data", 1),
    "lab01-fast-torch-loader": OTHER["lab01-fast-torch-loader"].replace(
        "    pin = True", "    _refuse_if_traced()\n    pin = True", 1),
}
assert all("_refuse_if_traced()\n" in answer for answer in SEEKER.values()), "the probe must be called"


def submission(answers: dict[str, str]) -> dict:
    """The student copy with the answer cells filled in."""
    return fill(RELEASE, answers)


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    gate = {s: {name: submission(a)} for s, a in [("other", SEEKER), ("wrong", WRONG)]}
    full = {s: {name: submission(a)} for s, a in [
        ("looping", LOOPING), ("survivor", SURVIVOR), ("tamper", TAMPERING)]}
    full["empty"] = {}
    full["garbled"] = {name: "{ not a notebook"}
    students = gradekit.tiered(request, gate, full)
    # The lab's timed comparisons run each variant REPEATS times: on a loaded 2-core box a student
    # whose loop eats its cell's 45 s takes more than 240 s in all (the grader's own default is 900).
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), notebook_timeout=480,
                     args=("--seed", str(SEED)))


@pytest.mark.gate
def test_a_correct_answer_in_another_shape_gets_full_marks(graded):
    row = graded["other"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "10", "10"), row


@pytest.mark.gate
def test_typical_mistakes_lose_the_right_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded"
    assert lost(row) == {"lab01-test-tf-parallel", "lab01-test-torch-same-batches", "lab01-test-torch-pinned"}
    assert row["score"] == "5"


@pytest.mark.full
def test_infinite_loop_is_cut_and_the_rest_graded(graded):
    row = graded["looping"]
    assert row["status"] == "graded"
    # past its limit by itself: the note says what its processes did meanwhile (grading.failures.measured)
    assert re.search(r"cell lab01-fast-tf-pipeline: in its \d+ s the job's processes ran [\d.]+ s and waited "
                     r"[\d.]+ s for a CPU: past its limit by itself", row["notes"]), row["notes"]
    # ... and something was measured: nbgrader and the kernel poll each other while the cell sleeps
    # (a job whose CPU times were not sampled reads 0.0 and 0.0, and no busy machine is ever seen)
    assert "ran 0.0 s and waited 0.0 s" not in row["notes"], row["notes"]
    assert row["lab01-test-tf-same-batches"] == row["lab01-test-tf-parallel"] == row["lab01-test-tf-prefetch"] == "0"
    # pinned for cuda and cuda:0 (the visible test and the first hidden case), not for cuda:1
    assert (row["lab01-test-torch-same-batches"], row["lab01-test-torch-workers"], row["lab01-test-torch-pinned"]) == ("2", "2", "0")
    assert row["score"] == "4"


@pytest.mark.full
def test_interrupt_survivor_is_reported_not_graded(graded):
    row = graded["survivor"]
    # nbgrader gives up on such a notebook: the status says why, the others are still graded.
    assert row["status"].startswith("not graded: a cell ('import time' ...) kept running after its "
                                    "time limit and an interrupt"), row["status"]
    assert row["score"] == "0"


@pytest.mark.full
def test_a_busy_grading_node_costs_no_points(tmp_path):
    """The grader and its job on one core beside four processes that spin on it (other users' work,
    each in a session of its own): the correct answer in another shape still gets full marks (a cell
    that ran past its limit while its processes waited for a CPU is graded again, with twice the time:
    grading.failures.busy_timeout). The sleeping loop's cell stays lost whatever the machine: it never waits
    for a CPU (test_infinite_loop_is_cut_and_the_rest_graded reads its note)."""
    with gradekit.hogs_on_one_core(4):
        rows = grade_all(LAB, {"other": {RELEASE.name: submission(OTHER)}}, tmp_path, notebook_timeout=900,
                         jobs=1, args=("--seed", str(SEED)))
    other = rows["other"]
    assert (other["status"], other["score"], other["max_score"]) == ("graded", "10", "10"), other


@pytest.mark.full
def test_bad_submissions_get_one_clear_status(graded):
    assert graded["empty"]["status"] == "missing notebook(s): input-pipeline.ipynb"
    assert graded["garbled"]["status"].startswith("unreadable notebook input-pipeline.ipynb")


@pytest.mark.full
def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "0", "10"), row


@pytest.mark.gate
def test_the_kernel_holds_nothing_to_redraw_the_hidden_cases_from(graded):
    """The correct answer in another shape is also the seeker: refusing to work where it finds the
    run's seed or a generator above it, it gets full marks: the kernel has neither (grading.cases.make_cases,
    grading.job.job_env)."""
    row = graded["other"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "10", "10"), row


@pytest.mark.gate
def test_the_seeker_would_see_the_seed_and_a_generator(tmp_path, monkeypatch):
    """The probe is real: a seed in the environment or in a file of its folder, and a generator in
    a frame above it (a hidden test that drew its cases in the kernel), are each found."""
    import numpy as np

    space: dict = {}
    exec(PROBE, space)
    space["_PLACES"] = [str(tmp_path)]  # not this machine's whole /tmp
    monkeypatch.delenv("DPC_GRADE_SEED")  # the session's seed (conftest)
    assert space["_traces"]() == []
    (tmp_path / "cases.json").write_text(f"[{SEED}]")
    monkeypatch.setenv("DPC_GRADE_SEED", str(SEED))
    draw = np.random.default_rng(SEED)  # noqa: F841  (seen by the probe in this frame)
    found = space["_traces"]()
    assert "environment DPC_GRADE_SEED" in found and f"file {tmp_path / 'cases.json'}" in found, found
    assert "a generator in the frame of test_the_seeker_would_see_the_seed_and_a_generator" in found, found
