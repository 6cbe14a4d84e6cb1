"""The suite's two tiers (README, "Testing"): every test is in exactly one, `gate` or `full`.

gate: what every landing must prove (`make test`, CI). full: everything else (`make test-full`); CI runs
the gate plus one shard of the full tier, chosen from the commit, so that every full test runs at
least once in K landings. A test's tier is its marker (`pytest.mark.gate` / `pytest.mark.full`, on the
test, its class or its module's `pytestmark`: one in all), or its place (PLACED: the chapters' copies
under build/nbtest/, every cell in the gate). The full tier is cut into K shards by whole files, from
the seconds each file's full tests took (DURATIONS, written by `make test-durations`), longest first
onto the lightest shard; a file not listed there goes to the shard its name hashes to.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import pytest

TIERS = ("gate", "full")
PLACED = {"build/nbtest/": "gate"}  # files whose every test is in a tier by its place
DURATIONS = Path(__file__).with_name("durations.json")


class TierError(pytest.UsageError):
    """Tests in no tier or in both."""


def path_of(nodeid: str) -> str:
    """The file of a test's node id."""
    return nodeid.split("::", 1)[0]


def tiers_of(item: pytest.Item) -> list[str]:
    """The tier markers of item at every level (its own, its class's, its module's), and its place's."""
    found = [m.name for m in item.iter_markers() if m.name in TIERS]
    found += [tier for prefix, tier in PLACED.items() if path_of(item.nodeid).startswith(prefix)]
    return found


def check(items: Iterable[pytest.Item]) -> dict[str, str]:
    """Each item's tier by node id; TierError naming every test in no tier or in both."""
    tier_by_id: dict[str, str] = {}
    bad = []
    for item in items:
        found = tiers_of(item)
        if len(found) == 1:
            tier_by_id[item.nodeid] = found[0]
        else:
            bad.append(f"  {item.nodeid}: {' and '.join(found) or 'no tier'}")
    if bad:
        raise TierError("every test is in exactly one tier, gate or full (tests/tiers.py; mark it "
                        "@pytest.mark.gate or @pytest.mark.full, or its module's pytestmark):\n"
                        + "\n".join(bad))
    return tier_by_id


def parse_shard(text: str) -> tuple[int, int]:
    """'i/K' as (i, K), 1 <= i <= K; a clear error otherwise."""
    try:
        i, k = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--full-shard {text!r}: write i/K, e.g. 2/5") from None
    if not 1 <= i <= k:
        raise pytest.UsageError(f"--full-shard {text!r}: i must be between 1 and K")
    return i, k


def durations(path: Path = DURATIONS) -> dict[str, dict[str, float]]:
    """The committed seconds per tier and file ({"gate": {file: s}, "full": {file: s}})."""
    data = json.loads(path.read_text()) if path.exists() else {}
    return {tier: {f: float(s) for f, s in data.get(tier, {}).items()} for tier in TIERS}


def plan(files: Iterable[str], k: int, seconds: dict[str, float]) -> list[list[str]]:
    """The full tier's files cut into k shards: measured files longest first, each onto the shard with
    the fewest seconds so far (the lowest index on a tie); files not measured by their name's hash."""
    shards: list[list[str]] = [[] for _ in range(k)]
    load = [0.0] * k
    files = sorted(set(files))
    for f in sorted((f for f in files if f in seconds), key=lambda f: (-seconds[f], f)):
        j = min(range(k), key=lambda j: (load[j], j))
        shards[j].append(f)
        load[j] += seconds[f]
    for f in (f for f in files if f not in seconds):
        shards[int(hashlib.sha256(f.encode()).hexdigest(), 16) % k].append(f)
    return shards


def shard_files(i: int, k: int, collected: Iterable[str]) -> set[str]:
    """The files of full shard i of k: the plan over the durations file's files and the collected ones."""
    seconds = durations()["full"]
    return set(plan(set(seconds) | set(collected), k, seconds)[i - 1])


def select(items: list[pytest.Item], tier: str, shard: str | None) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(selected, deselected) for --tier (gate, full or all) and --full-shard i/K (a shard of the full tier)."""
    tier_by_id = check(items)
    wanted_full: set[str] | None = None  # None: every full file
    if shard:
        i, k = parse_shard(shard)
        wanted_full = shard_files(i, k, {path_of(n) for n, t in tier_by_id.items() if t == "full"})

    def keep(item: pytest.Item) -> bool:
        if tier_by_id[item.nodeid] == "gate":
            return tier in ("gate", "all")
        if wanted_full is not None:
            return path_of(item.nodeid) in wanted_full
        return tier in ("full", "all")

    selected = [item for item in items if keep(item)]
    chosen = {id(item) for item in selected}
    return selected, [item for item in items if id(item) not in chosen]


def runs(request: pytest.FixtureRequest, tier: str) -> bool:
    """Whether this session runs a test of the requesting fixture's module in `tier` (a module fixture
    that grades several students grades the full tier's only when one of their tests runs)."""
    return any(getattr(item, "module", None) is request.module and tier in tiers_of(item)
               for item in request.session.items)


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in (("gate", "in the gate, the tier every landing proves (make test)"),
                       ("full", "in the full tier (make test-full; CI runs one shard of it per landing)")):
        config.addinivalue_line("markers", f"{tier}: {what} (tests/tiers.py)")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tiers", "the suite's tiers (tests/tiers.py)")
    group.addoption("--tier", choices=("gate", "full", "all"), default="all",
                    help="run the gate's tests, the full tier's, or all (default)")
    group.addoption("--full-shard", metavar="i/K", default=None,
                    help="of the full tier only shard i of K (with --tier gate: the gate and that shard)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep this run's tiers (tests/conftest.py then orders them); a test in no tier or both: TierError."""
    selected, deselected = select(items, config.getoption("--tier"), config.getoption("--full-shard"))
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = selected


_SECONDS: dict[str, dict[str, float]] = {tier: {} for tier in TIERS}  # per tier and file
_RAN: dict[str, set[str]] = {tier: set() for tier in TIERS}  # node ids
_FAILED: list[str] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """Each report carries its test's tier (checked at collection: exactly one) to the controller."""
    report = yield
    report.user_properties.append(("tier", tiers_of(item)[0]))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The controller's record of every test: its seconds by tier and file, and the failed ones."""
    tier = dict(report.user_properties)["tier"]
    path = path_of(report.nodeid)
    _SECONDS[tier][path] = _SECONDS[tier].get(path, 0.0) + report.duration
    _RAN[tier].add(report.nodeid)
    if report.failed and report.nodeid not in _FAILED:
        _FAILED.append(report.nodeid)


def rerun_command(nodeid: str) -> str:
    """The one command that reruns a failed test alone (a notebook's cell: its whole notebook)."""
    target = path_of(nodeid) if nodeid.startswith("build/nbtest/") else nodeid
    return f"make test-one T='{target}'"


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    write = terminalreporter.write_line
    tier, shard = config.getoption("--tier"), config.getoption("--full-shard")
    ran = {t: f"{len(_RAN[t])} tests in {len({path_of(n) for n in _RAN[t]})} files" for t in TIERS}
    if shard:
        i, k = parse_shard(shard)
        others = " ".join(f"{j}/{k}" for j in range(1, k + 1) if j != i)
        terminalreporter.section("tiers")
        if tier != "full":
            write(f"the gate: {ran['gate']}")
        files = sorted(Path(f).stem for f in _SECONDS["full"])
        write(f"shard {i}/{k} of the full tier: {ran['full']} ({', '.join(files)})")
        write(f"the other shards: make test-full SHARD=j/{k} for j in {others}; the whole suite: make test-full")
    elif tier != "all":
        terminalreporter.section("tiers")
        write(f"the {tier} tier alone: {ran[tier]}")
    out = os.environ.get("DPC_DURATIONS_OUT")
    if out:
        Path(out).write_text(json.dumps({t: {f: round(s, 1) for f, s in sorted(d.items())}
                                         for t, d in _SECONDS.items()}, indent=1) + "\n")
        write(f"seconds per tier and file written to {out}")
    if _FAILED:
        terminalreporter.section("rerun a failed test alone")
        for nodeid in _FAILED:
            write(f"{nodeid}: {rerun_command(nodeid)}")
