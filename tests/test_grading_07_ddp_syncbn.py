"""Lab 7 (DDP + SyncBN) graded end to end: submissions built from the student copy in labs/ are
autograded by src/dpc_instructor/grade.py with real torchrun launches.

A correct submission written differently from the reference gets full marks (a backend chosen in
another way, gradient accumulation with an explicit branch around `no_sync()` and a loss reduced
every batch, the three statistics stacked instead of concatenated, `hasattr` instead of `getattr`,
`from torch import save` (the save test counts saves below torch.save, however it was imported);
its train_epoch warns, as a library may for correct code: warnings never cost points); the
reference itself passes, or the grader refuses to grade (dpc_instructor.grading.reference.reference). A
submission with the five typical DDP mistakes — no set_epoch, per-rank variances averaged instead
of sums combined, the loss summed over ranks instead of averaged, every rank saving, a loader that
ignores its seed argument — loses exactly the points of the test each one breaks (issue 36, item 3:
the weights test trains on the tests' own loader, so the loader's mistake costs only the shards
test; with make_loader in the weights worker, as before, it cost the weights test's 3 points too). It also edits the locked parameters cell (to a line that
would fail every later cell): grading restores locked cells from the source, so that edit costs
nothing. A submission that does no work
and fights the tests from a cell of its own in the kernel (gradekit.TAMPER: comparisons that always
hold, tracebacks silenced, a displayhook call from inside train_epoch that nbgrader would read as
full partial credit) gets nothing: every test cell's recorded values are judged outside the kernel.

The shards test's hidden case is drawn outside every kernel (issue 36: the source's locked
`hidden_cases`, dpc_instructor.grading.cases.make_cases; the kernel gets only the world, batch and dataset
sizes); the different submission checks that no grading seed is in its kernel's environment or in a
file of its folder (gradekit.SEED_PROBE), so it would lose the shards test if one were there. A redrawing attack
means nothing here: a case's shards follow from its inputs for any correct make_loader.
"""
from __future__ import annotations

import os

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, probing, submission as fill, tiered

LAB = "07-ddp-syncbn"
RELEASE = ROOT / "labs" / LAB / "ddp-syncbn.ipynb"
POINTS = {"lab07-test-env": 2, "lab07-test-shards": 2, "lab07-test-reshuffle": 2, "lab07-test-loss": 2,
          "lab07-test-syncbn": 3, "lab07-test-save": 2, "lab07-test-weights": 3}




SETUP = '''%%writefile runs/07/lab_setup.py
import os
import torch
import torch.distributed as dist


def dist_config(env):
    if "RANK" in env and "WORLD_SIZE" in env:
        return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
                "local_rank": int(env.get("LOCAL_RANK", 0)), "distributed": True}
    if "SLURM_PROCID" in env:
        return {"rank": int(env["SLURM_PROCID"]), "world_size": int(env["SLURM_NTASKS"]),
                "local_rank": int(env["SLURM_LOCALID"]), "distributed": True}
    return {"rank": 0, "world_size": 1, "local_rank": 0, "distributed": False}


def setup(env=None):
    env = os.environ if env is None else env
    cfg = dist_config(env)
    if not cfg["distributed"]:
        return cfg
    per_node = int(env.get("LOCAL_WORLD_SIZE", cfg["world_size"]))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= per_node:
        torch.cuda.set_device(cfg["local_rank"])
        dist.init_process_group("nccl", rank=cfg["rank"], world_size=cfg["world_size"])
    else:
        dist.init_process_group("gloo", rank=cfg["rank"], world_size=cfg["world_size"])
    return cfg
'''
DATA = '''%%writefile runs/07/lab_data.py
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler


def make_loader(dataset, cfg, batch_size, seed=0):
    sampler = DistributedSampler(dataset, cfg["world_size"], cfg["rank"], shuffle=True, seed=seed)
    return DataLoader(dataset, batch_sampler=BatchSampler(sampler, batch_size, True)), sampler
'''
TRAIN = '''%%writefile runs/07/lab_train.py
import torch.distributed as dist
import torch.nn.functional as F


def reduce_mean(value, cfg):
    if cfg["world_size"] == 1:
        return value
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / cfg["world_size"]


def train_epoch(model, loader, sampler, optimizer, epoch, cfg, accum=1):
    sampler.set_epoch(epoch)
    model.train()
    losses = []
    for i, (x, y) in enumerate(loader):
        optimizer_steps = (i + 1) % accum == 0
        if cfg["distributed"] and not optimizer_steps:
            with model.no_sync():
                loss = F.cross_entropy(model(x), y)
                loss.div(accum).backward()
        else:
            loss = F.cross_entropy(model(x), y)
            loss.div(accum).backward()
        if optimizer_steps:
            optimizer.step()
            optimizer.zero_grad()
        losses.append(reduce_mean(loss.detach(), cfg).item())
    return sum(losses) / len(losses)
'''
SYNCBN = '''%%writefile runs/07/lab_syncbn.py
import torch
import torch.distributed as dist


def sync_stats(x, cfg):
    t = torch.stack([x.sum((0, 2, 3)), (x ** 2).sum((0, 2, 3)),
                     torch.full((x.shape[1],), x[:, 0].numel(), dtype=x.dtype)])
    if cfg["distributed"]:
        dist.all_reduce(t)
    mean = t[0] / t[2]
    return mean, t[1] / t[2] - mean ** 2, t[2]
'''
# `from torch import save`: the save test sees it (it once spied on torch.save after this import).
SAVE = '''%%writefile runs/07/lab_save.py
import torch.distributed as dist
from torch import save


def save_checkpoint(model, path, cfg):
    if cfg["rank"] == 0:
        net = model.module if hasattr(model, "module") else model
        save(net.state_dict(), path)
    if cfg["distributed"]:
        dist.barrier()
'''
# A correct answer that warns (as a library may for correct code): warnings never cost points.
WARNING_TRAIN = TRAIN.replace(
    "def train_epoch(model, loader, sampler, optimizer, epoch, cfg, accum=1):\n",
    "def train_epoch(model, loader, sampler, optimizer, epoch, cfg, accum=1):\n"
    "    import warnings\n"
    "    warnings.warn('train_epoch: a warning from a correct answer', UserWarning)\n", 1)
assert WARNING_TRAIN != TRAIN
DIFFERENT = {"lab07-setup": SETUP, "lab07-data": DATA, "lab07-train": WARNING_TRAIN,
             "lab07-syncbn": SYNCBN, "lab07-save": SAVE}
# The typical mistakes, each breaking a different test cell.
WRONG = {
    # the locked parameters cell edited: restored from the source when graded
    "lab07-parameters": "raise RuntimeError('a student edited the locked parameters cell')\n",
    **DIFFERENT,
    # no set_epoch (same shuffle every epoch), and the loss summed over ranks, not averaged
    "lab07-train": TRAIN.replace("    sampler.set_epoch(epoch)\n", "").replace(
        "return value / cfg[\"world_size\"]", "return value"),
    # per-rank mean and variance averaged over ranks instead of sums / sums of squares / counts
    "lab07-syncbn": '''%%writefile runs/07/lab_syncbn.py
import torch
import torch.distributed as dist


def sync_stats(x, cfg):
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
    count = torch.full_like(mean, float(x[:, 0].numel()))
    if cfg["distributed"]:
        for t in (mean, var):
            dist.all_reduce(t)
            t /= cfg["world_size"]
        dist.all_reduce(count)
    return mean, var, count
''',
    # every rank saves the checkpoint
    "lab07-save": SAVE.replace('    if cfg["rank"] == 0:\n        net', '    if True:\n        net'),
    # the loader ignores its seed argument: other shards than asked for (the shards test only)
    "lab07-data": DATA.replace("shuffle=True, seed=seed)", "shuffle=True, seed=0)"),
}
assert WRONG["lab07-train"] != TRAIN and "set_epoch" not in WRONG["lab07-train"]
assert WRONG["lab07-save"] != SAVE and WRONG["lab07-data"] != DATA


NO_WORK = {
    "lab07-setup": '''%%writefile runs/07/lab_setup.py
def dist_config(env):
    return {"rank": 0, "world_size": 1, "local_rank": 0, "distributed": False}


def setup(env=None):
    return dist_config(env)
''',
    "lab07-data": '''%%writefile runs/07/lab_data.py
from torch.utils.data import DataLoader, DistributedSampler


def make_loader(dataset, cfg, batch_size, seed=0):
    return DataLoader(dataset, batch_size=batch_size), DistributedSampler(dataset, num_replicas=1, rank=0)
''',
    "lab07-train": '''%%writefile runs/07/lab_train.py
import sys


def reduce_mean(value, cfg):
    return value


def train_epoch(model, loader, sampler, optimizer, epoch, cfg, accum=1):
    sys.displayhook("full marks")  # in the kernel: an execute_result in the test cell
    return 0.0
''',
    "lab07-syncbn": '''%%writefile runs/07/lab_syncbn.py
import torch


def sync_stats(x, cfg):
    zero = torch.zeros(x.shape[1])
    return zero, zero, zero
''',
    "lab07-save": '''%%writefile runs/07/lab_save.py
def save_checkpoint(model, path, cfg):
    pass
''',
}


def tampering() -> dict:
    """NO_WORK, plus a cell of the student's own, right after the imports, that fights the tests."""
    nb = fill(RELEASE, NO_WORK)
    at = next(i for i, c in enumerate(nb["cells"]) if c.get("metadata", {}).get("nbgrader", {})
              .get("grade_id") == "lab07-imports")
    nb["cells"].insert(at + 1, {"cell_type": "code", "execution_count": None, "id": "tamper01",
                                "metadata": {}, "outputs": [], "source": TAMPER})
    return nb



@pytest.fixture(scope="module")
def graded(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    seed = int(os.environ["DPC_GRADE_SEED"])  # grade_all's run: no --seed
    different = {**DIFFERENT, "lab07-data": probing(DATA, seed)}
    students = tiered(request, {s: {name: fill(RELEASE, a)} for s, a in [("different", different), ("wrong", WRONG)]},
                      {"tamper": {name: tampering()}})
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), cell_timeout=60,
                     notebook_timeout=900)


@pytest.mark.gate
def test_a_correct_submission_gets_full_marks(graded):
    row = graded["different"]
    total = sum(POINTS.values())
    assert (row["status"], float(row["score"]), float(row["max_score"])) == ("graded", total, total), row
    assert set(POINTS) <= set(row), row  # every test cell has its column
    assert lost(row) == set()


@pytest.mark.gate
def test_typical_mistakes_lose_the_right_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab07-test-reshuffle", "lab07-test-loss", "lab07-test-syncbn", "lab07-test-save",
                         "lab07-test-shards"}, row
    assert float(row["score"]) == sum(POINTS.values()) - 2 - 2 - 3 - 2 - 2  # 6 of 17; the weights kept


@pytest.mark.full
def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], float(row["score"])) == ("graded", 0.0), row
