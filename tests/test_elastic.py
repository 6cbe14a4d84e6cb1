"""helpers.elastic: torchrun's command line with restarts, its log, and reading its failure report."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import LaunchError
from helpers.elastic import failures, launch_elastic, torchrun_argv, torchrun_summary

pytestmark = pytest.mark.gate  # tests/tiers.py

REPORT = """\
E1122 15:36:51.774000 11875 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 11881) of binary: python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 11881)
============================================================
"""


def test_argv_has_restarts_and_a_free_port():
    argv = torchrun_argv("w.py", 3, max_restarts=2, args=["--x", 1], python="py")
    assert argv[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--standalone" in argv and "--max-restarts=2" in argv and "--nproc-per-node=3" in argv
    assert argv[-3:] == ["w.py", "--x", "1"]
    with pytest.raises(ValueError):
        torchrun_argv("w.py", 2, max_restarts=-1)


def test_reads_failures_and_summary():
    assert failures(REPORT) == [(1, -9)]
    summary = torchrun_summary(REPORT)
    assert summary.startswith("====") and "Root Cause" in summary and "exitcode  : -9" in summary
    assert torchrun_summary("all good\n") == ""


@pytest.mark.slow
def test_restart_resumes_and_log_is_kept(tmp_path: Path):
    script = tmp_path / "w.py"
    script.write_text(
        "import os\nfrom helpers.worker import finish, report, start\n"
        "me = start()\nattempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "if attempt == 0 and me.rank == 1:\n    os._exit(3)\n"
        "report(attempt=attempt)\nfinish()\n")
    log = tmp_path / "torchrun.log"
    result = launch_elastic(script, 2, max_restarts=1, timeout=120, log=log, echo=False)
    assert result.report(0)["attempt"] == 1 and result.report(1)["attempt"] == 1
    assert (1, 3) in failures(log.read_text())
    with pytest.raises(LaunchError) as err:
        launch_elastic(script, 2, max_restarts=0, timeout=120, log=log, echo=False)
    assert err.value.ranks == [1]
    assert "Root Cause" in torchrun_summary(log.read_text())
