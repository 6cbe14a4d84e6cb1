"""The classroom's pure parts, on any machine: the fairness lines and the past-the-limit allocation."""
from __future__ import annotations

import ast

from dpc_maintainer import classroom


def test_fairness_lines_give_medians_maxima_the_ratio_and_the_goal() -> None:
    r = {"idle_ms": [3.0, 2.0, 4.0], "busy_ms": [50.0, 1500.0, 900.0, 20.0, 700.0], "heavy_run_all_s": 61.2,
         "oom": {"state": "restarting", "after_s": 4.2, "other": "alive, same kernel"}}
    lines = classroom.fairness_lines(r, "06-horovod", "4G")
    assert lines[0] == "fairness: classmate's kernel round trip, class idle: median 3 ms, max 4 ms (n 3)"
    assert lines[1] == ("fairness: classmate's kernel round trip while a student runs 06-horovod (Run All 61.2 s): "
                        "median 700 ms, max 1500 ms (n 5)")
    assert lines[2] == "fairness: busy/idle median ratio 233.3; goal median <= 1000 ms: met"
    assert lines[3] == ("fairness: a kernel that allocates past the 4G limit: restarting after 4.2 s; "
                        "the other student's kernel: alive, same kernel")
    slow = classroom.fairness_lines({"idle_ms": [1.0], "busy_ms": [1200.0]}, "06-horovod", "4G")
    assert slow[-1].endswith("goal median <= 1000 ms: MISSED")
    assert classroom.fairness_lines({}, "06-horovod", "4G") == ["fairness: no measurement"]


def test_the_allocation_past_the_limit_is_half_again_the_limit() -> None:
    code = classroom.past_limit_code("4G")
    ast.parse(code)  # valid Python, sent as one cell
    assert f"np.ones({int(4 * 2**30 * 1.5) // 8}," in code
    assert f"np.ones({int(512 * 2**20 * 1.5) // 8}," in classroom.past_limit_code("512M")
    assert f"np.ones({3000 * 3 // 2 // 8}," in classroom.past_limit_code("3000")
