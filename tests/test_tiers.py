"""The suite's tiers (tests/tiers.py): a test in no tier or in both stops the run with one error naming
it; --tier and --full-shard select what they say; the shards cut the full tier into disjoint parts that
cover it, balanced by the committed seconds; a failed test's line names the command that reruns it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tiers

pytestmark = pytest.mark.gate  # tests/tiers.py

HERE = Path(__file__).resolve().parent

MARKED = '''import pytest

pytestmark = pytest.mark.{module}


def test_one():
    pass


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.full), 2])
def test_two(n):
    pass
'''


def run(folder: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """pytest in folder with the tiers' plugin (what tests/conftest.py takes from it) and no other."""
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("DPC_DURATIONS_OUT", None)
    env.update(extra, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # no nbval, xdist, timeout: a quicker start
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tiers", "-p", "no:cacheprovider",
                           "-q", "--rootdir", str(folder), *args, str(folder)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def plant(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def nodes(out: str) -> set[str]:
    """The node ids `pytest --collect-only -q` printed."""
    return {line for line in out.splitlines() if "::" in line and " " not in line}


def test_a_test_in_no_tier_or_in_both_stops_the_run_naming_it(tmp_path):
    plant(tmp_path, {
        "test_good.py": "import pytest\n\n\n@pytest.mark.gate\ndef test_gate():\n    pass\n",
        "test_bad.py": MARKED.format(module="gate") + "\n\ndef test_plain():\n    pass\n",
        "test_none.py": "def test_nothing():\n    pass\n"})
    done = run(tmp_path, "--collect-only")
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage error: nothing ran
    err = done.stdout + done.stderr
    assert "every test is in exactly one tier, gate or full" in err, err
    named = set(re.findall(r"^  (test_\w+\.py::\S+): (.+)$", err, re.M))
    assert named == {("test_bad.py::test_two[1]", "full and gate"), ("test_none.py::test_nothing", "no tier")}, err


def test_the_tiers_select_what_they_say(tmp_path):
    plant(tmp_path, {"test_a.py": MARKED.format(module="gate"), "test_b.py": MARKED.format(module="full").replace(
        "pytest.param(1, marks=pytest.mark.full), 2", "1, 2")})
    a_two_1 = "test_a.py::test_two[1]"  # in the gate by its module, in the full tier by its own mark: both
    assert run(tmp_path, "--collect-only").returncode == 4
    (tmp_path / "test_a.py").write_text(MARKED.format(module="gate").replace("pytestmark = pytest.mark.gate\n", "")
                                        .replace("def test_one", "@pytest.mark.gate\ndef test_one")
                                        .replace("1, marks=pytest.mark.full), 2]",
                                                 "1, marks=pytest.mark.full), pytest.param(2, marks=pytest.mark.gate)]"))
    got = {tier: nodes(run(tmp_path, "--collect-only", "--tier", tier).stdout) for tier in ("gate", "full", "all")}
    assert got["gate"] == {"test_a.py::test_one", "test_a.py::test_two[2]"}, got
    assert got["full"] == {a_two_1, "test_b.py::test_one", "test_b.py::test_two[1]", "test_b.py::test_two[2]"}, got
    assert got["all"] == got["gate"] | got["full"], got


def test_the_shards_cover_the_full_tier_once_and_add_the_gate(tmp_path):
    names = [f"test_f{i}.py" for i in range(5)]
    plant(tmp_path, {n: MARKED.format(module="full").replace("pytest.param(1, marks=pytest.mark.full), 2", "1, 2")
                     for n in names} | {"test_g.py": MARKED.format(module="gate").replace(
                         "pytest.param(1, marks=pytest.mark.full), 2", "1, 2")})
    shards = []
    for i in (1, 2, 3):
        out = run(tmp_path, "--collect-only", "--tier", "gate", "--full-shard", f"{i}/3").stdout
        lines = nodes(out)
        assert {ln for ln in lines if ln.startswith("test_g.py")} == {f"test_g.py::{t}" for t in (
            "test_one", "test_two[1]", "test_two[2]")}, out  # the gate every time
        shards.append({ln.split("::")[0] for ln in lines} - {"test_g.py"})
    assert set().union(*shards) == set(names)
    assert sum(len(s) for s in shards) == len(names)  # disjoint
    alone = run(tmp_path, "--collect-only", "--tier", "full", "--full-shard", "2/3").stdout
    assert {n.split("::")[0] for n in nodes(alone)} == shards[1]
    bad = run(tmp_path, "--collect-only", "--full-shard", "4/3")
    assert bad.returncode == 4 and "--full-shard '4/3': i must be between 1 and K" in bad.stderr, bad.stderr


def test_the_plan_puts_the_longest_files_first_onto_the_lightest_shard():
    seconds = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 40.0, "e": 10.0}
    assert tiers.plan(seconds, 2, seconds) == [["a", "d"], ["b", "c", "e"]]  # 140 and 120 s
    shards = tiers.plan([*seconds, "new"], 3, seconds)  # a file not measured: by its name's hash
    assert sorted(f for s in shards for f in s) == sorted([*seconds, "new"])
    assert tiers.plan([*seconds, "new"], 3, seconds) == shards  # the same every time, in every worker


def test_the_committed_durations_name_only_files_with_full_tests():
    measured = tiers.durations()["full"]
    assert measured, "tests/durations.json lists the full tier's files (make test-durations)"
    for path in measured:
        assert (HERE.parent / path).is_file(), f"{path} in tests/durations.json is gone"
        assert "mark.full" in (HERE.parent / path).read_text(), f"{path} has no full-tier test"


def test_a_failed_test_names_the_command_that_reruns_it(tmp_path):
    plant(tmp_path, {"test_x.py": "import pytest\n\npytestmark = pytest.mark.full\n\n\n"
                                  "def test_ok():\n    pass\n\n\ndef test_fails():\n    assert 1 == 2\n"})
    durations = tmp_path / "seconds.json"
    done = run(tmp_path, "--tier", "full", "--full-shard", "1/1", DPC_DURATIONS_OUT=str(durations))
    assert done.returncode == 1, done.stdout
    assert "test_x.py::test_fails: make test-one T='test_x.py::test_fails'" in done.stdout, done.stdout
    assert "test_ok: make test-one" not in done.stdout
    assert "shard 1/1 of the full tier: 2 tests in 1 files (test_x)" in done.stdout, done.stdout
    assert set(json.loads(durations.read_text())["full"]) == {"test_x.py"}
    assert tiers.rerun_command("build/nbtest/course/07-ddp-syncbn.ipynb::Cell 3") == (
        "make test-one T='build/nbtest/course/07-ddp-syncbn.ipynb'")
