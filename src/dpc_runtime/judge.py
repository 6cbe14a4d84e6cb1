"""The judge outside the kernel: a lab's test cell *records* the values it checks; the verdict is
taken in another process, by comparing them with what the reference solution recorded.

Why: a test cell runs in the student's kernel, after the student's code, so whatever it asserts can
be neutralised from there (`np.allclose = lambda *a, **k: True`, a swapped course helper, a
`sys.excepthook`, an IPython event). A recorded *value* cannot be argued with: the grader
(dpc_instructor.nbgrader_hooks.Judge, in nbgrader's process, which the student's code never ran in)
compares every value a test cell recorded with the reference run's, under the tolerance the
reference's own test cell asked for. To pass, the values must be right, which is the work itself.

    record("average", result[0][0])                   # close to the reference's (rtol/atol)
    record("tower slices", [c[0] for c in calls])      # equal
    record("batches in flight", n, at_least=2)         # a bound: the reference's value is not used
    record("weights after", w, differs_from="weights before")  # changed (by more than atol)

A test cell keeps its asserts (the student reads them); the grade of a cell with records is
"no error in the cell AND every record matches". Records are display outputs of the test cell with
their own MIME type (MIME), so nothing is written to disk and each belongs to its cell.
"""
from __future__ import annotations

import base64
import math
import os
from typing import Any

MIME = "application/vnd.dpc.record+json"
ARRAY_LIMIT = 1 << 20  # elements one recorded array may have
SEED_VARIABLE = "DPC_GRADE_SEED"  # set by the grader (dpc_instructor.grade): one seed per grading run
# Beside a lab notebook whose hidden cases the grader makes outside the kernel (a locked cell
# defining hidden_cases(draw); dpc_instructor.grading.cases.make_cases): the cases' inputs, and only those.
CASES_FILE = "hidden-cases.json"


def seed() -> int:
    """The seed of this grading run's hidden test cases: DPC_GRADE_SEED, which the grader sets for
    the reference and every student alike (a new one each run, unless --seed names it), else 0 (the
    solution notebooks' own runs, and every kernel of a lab whose hidden cases the grader makes
    outside it: there the seed never enters the student's process)."""
    value = os.environ.get(SEED_VARIABLE, "0")
    if not value.isdigit():
        raise ValueError(f"{SEED_VARIABLE} must be a non-negative integer, not {value!r}")
    return int(value)


def rng() -> Any:
    """A numpy Generator seeded with seed(): a hidden test draws its cases from it, so the values it
    checks are new in every grading run and cannot be written into an answer in advance."""
    import numpy as np

    return np.random.default_rng(seed())


def plain(value: Any) -> Any:
    """value as JSON the judge can read back: numbers, strings, lists, dicts, and arrays (numpy,
    torch and TensorFlow tensors) as {"dtype", "shape", "b64"} of their exact bytes."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    import numpy as np

    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # a TensorFlow tensor
        value = value.numpy()
    arr = np.asarray(value)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.bool_)
    elif arr.dtype.kind in "iu":
        arr = arr.astype("<i8")
    elif arr.dtype.kind == "f":
        arr = arr.astype("<f8")
    else:
        raise TypeError(f"record: cannot record a value of type {type(value).__name__} ({arr.dtype})")
    if arr.size > ARRAY_LIMIT:
        raise ValueError(f"record: an array of {arr.size} elements is over the {ARRAY_LIMIT} a record may have")
    if arr.ndim == 0:
        return plain(arr.item())
    return {"dtype": arr.dtype.str, "shape": list(arr.shape),
            "b64": base64.b64encode(arr.tobytes()).decode("ascii")}


STATS = ("mean", "spread", "column_means")  # what the judge may compute from a recorded value


def record(name: str, value: Any, *, rtol: float = 1e-5, atol: float = 1e-6,
           at_least: float | None = None, at_most: float | None = None,
           differs_from: str | None = None, same_as: str | None = None,
           stat: str | None = None, judged: bool = True, case: int | None = None) -> None:
    """Show the grader `value` under `name`, checked outside the kernel (the labs' test cells).

    By default the value must be close to the reference's. `at_least`/`at_most`: a bound instead;
    `same_as`/`differs_from` (an earlier record's name): within atol of that record's value, or
    not; `stat`: the judge first reduces the raw value (STATS: "mean", "spread" = max - min,
    "column_means" of a table); `judged=False`: compared with nothing, only named by later records.
    `case`: the value is the answer for the grader's hidden case number `case` (CASES_FILE); the
    grader judges it only in the test cell that case belongs to (which the kernel is never told:
    dpc_instructor.grading.cases.assign_cases), in every other cell it counts as judged=False.
    """
    from IPython.display import display

    if stat is not None and stat not in STATS:
        raise ValueError(f"record: stat must be one of {STATS}, not {stat!r}")
    item = {"name": name, "value": plain(value), "rtol": rtol, "atol": atol, "at_least": at_least,
            "at_most": at_most, "differs_from": differs_from, "same_as": same_as, "stat": stat,
            "judged": judged, "case": case, "line": _cell_line()}
    display({MIME: item, "text/plain": f"(recorded for the grader: {name})"}, raw=True)


def _cell_line() -> int | None:
    """The line of the running cell that (maybe through functions it defines) called record: the
    instructor's tools tell a visible test's records from a hidden one's by it
    (dpc_instructor.markers.visible_records)."""
    import sys

    frame = sys._getframe(2)
    while frame.f_back is not None:
        if frame.f_back.f_code.co_name == "run_code" and "IPython" in frame.f_back.f_code.co_filename:
            return frame.f_lineno  # the cell's own top-level statement
        frame = frame.f_back
    return None


def records(cell: dict) -> list[dict]:
    """The records among a cell's outputs, in order."""
    found = []
    for output in cell.get("outputs", []):
        data = output.get("data", {}) if output.get("output_type") in ("display_data", "execute_result") else {}
        if MIME in data and isinstance(data[MIME], dict):
            found.append(data[MIME])
    return found


def _array(value: Any) -> Any:
    """A recorded value back as a numpy array (or the value itself when it is not an array)."""
    import numpy as np

    if isinstance(value, dict) and set(value) == {"dtype", "shape", "b64"}:
        arr = np.frombuffer(base64.b64decode(value["b64"]), dtype=np.dtype(value["dtype"]))
        return arr.reshape(value["shape"])
    if isinstance(value, dict) and set(value) == {"float"}:
        return float(value["float"])
    return value


def _differs(want: Any, got: Any, rtol: float, atol: float, where: str) -> str | None:
    """Why got is not want (None when it is), both recorded values."""
    import numpy as np

    want, got = _array(want), _array(got)
    if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
        try:
            w, g = np.asarray(want, dtype=np.float64), np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            return f"{where} is not numbers"
        if w.shape != g.shape:
            return f"{where} has shape {tuple(g.shape)}, not {tuple(w.shape)}"
        if all(isinstance(a, np.ndarray) and a.dtype.kind in "iub" for a in (want, got)):
            return None if np.array_equal(want, got) else f"{where} is not the expected value"
        if not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=False):
            bad = np.abs(g - w)
            worst = float(np.nanmax(np.where(np.isfinite(bad), bad, np.inf)))
            return f"{where} differs from the reference (max |difference| {worst:.3g})"
        return None
    if isinstance(want, bool) or isinstance(got, bool) or isinstance(want, str) or want is None:
        return None if type(got) is type(want) and got == want else f"{where} is not the expected value"
    if isinstance(want, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"{where} is not a number"
        if isinstance(want, int):  # a count: exact
            return None if isinstance(got, int) and got == want else f"{where} is {got}, not the expected value"
        return None if math.isclose(got, want, rel_tol=rtol, abs_tol=atol) else (
            f"{where} differs from the reference ({got:.6g})")
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{where} has {len(got) if isinstance(got, list) else 'no'} items, not {len(want)}"
        for i, (w, g) in enumerate(zip(want, got)):
            if why := _differs(w, g, rtol, atol, f"{where}[{i}]"):
                return why
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{where} has other keys than the reference's"
        for k in want:
            if why := _differs(want[k], got[k], rtol, atol, f"{where}[{k!r}]"):
                return why
        return None
    return f"{where}: the reference recorded a value the judge cannot compare"


def _stat(kind: str, value: Any) -> Any:
    """The statistic `kind` (STATS) of a recorded value, as a recorded value."""
    import numpy as np

    arr = np.asarray(_array(value), dtype=np.float64)
    if kind == "mean":
        return float(arr.mean())
    if kind == "spread":
        return float(arr.max() - arr.min())
    if kind == "column_means" and arr.ndim == 2:
        return plain(arr.mean(axis=0))
    raise ValueError(f"no statistic {kind!r} of an array of shape {arr.shape}")


def verdict(reference: list[dict], got: list[dict]) -> str | None:
    """Why a test cell's records fail against the reference's (None: they pass). Only the values of
    got are read; names, order, tolerances and bounds are the reference's. A value that cannot even
    be read (a record made by hand) fails; it never stops the judge."""
    try:
        return _verdict(reference, got)
    except Exception as err:  # noqa: BLE001  (got is the student's: anything may be in it)
        return f"a recorded value could not be read ({type(err).__name__})"


def _names_verdict(reference: list[dict], got: list[dict]) -> str | None:
    """Why got's records are not the reference's, by name and in order (None: they are)."""
    if not isinstance(got, list) or not all(isinstance(r, dict) for r in got):
        return "the cell's records are malformed"
    if [r.get("name") for r in got] != [r["name"] for r in reference]:
        have = [str(r.get("name")) for r in got]
        missing = [r["name"] for r in reference if r["name"] not in have]
        return ("the cell did not record " + ", ".join(repr(m) for m in missing) if missing else
                f"the cell recorded {have}, expected {[r['name'] for r in reference]}")
    return None


def _relation_verdict(want: dict, value: Any, values: dict[str, Any], rtol: float, atol: float) -> str | None:
    """Why value breaks the reference's same_as or differs_from another recorded value (None: it does not)."""
    name = want["name"]
    other = want.get("same_as") or want.get("differs_from")
    if other not in values:
        return f"{name!r}: the cell did not record {other!r}"
    same = _differs(values[other], value, 0.0 if want.get("differs_from") else rtol, atol, "") is None
    if want.get("same_as") and not same:
        return f"{name!r} differs from {other!r}"
    if want.get("differs_from") and same:
        return f"{name!r} is the same as {other!r}: nothing changed"
    return None


def _bounds_verdict(want: dict, value: Any, expected: Any) -> str | None:
    """Why value, finite numbers of the reference's shape, breaks at_least or at_most (None: it does not)."""
    import numpy as np

    name = want["name"]
    try:
        arr = np.asarray(_array(value), dtype=np.float64)
    except (TypeError, ValueError):
        return f"{name!r} is not a number"
    if arr.size == 0 or not np.all(np.isfinite(arr)):
        return f"{name!r} is not a finite number"
    try:
        shape = np.shape(np.asarray(_array(expected), dtype=np.float64))
    except (TypeError, ValueError):
        shape = arr.shape  # a reference of no one shape: the bound alone
    if arr.shape != shape:
        return f"{name!r} has shape {arr.shape}, not {shape}"
    if want.get("at_least") is not None and not np.all(arr >= want["at_least"]):
        return f"{name!r} is below {want['at_least']:g}"
    if want.get("at_most") is not None and not np.all(arr <= want["at_most"]):
        return f"{name!r} is above {want['at_most']:g}"
    return None


def _verdict(reference: list[dict], got: list[dict]) -> str | None:
    """verdict, which may raise on a malformed record."""
    if why := _names_verdict(reference, got):
        return why
    values: dict[str, Any] = {}
    for want, item in zip(reference, got):
        name = want["name"]
        value, expected = item.get("value"), want["value"]
        if want.get("stat"):
            try:
                value, expected = _stat(want["stat"], value), _stat(want["stat"], expected)
            except (TypeError, ValueError):
                return f"{name!r} is not a table of numbers"
        values[name] = value
        rtol, atol = float(want["rtol"]), float(want["atol"])
        if want.get("judged") is False:
            continue
        if (want.get("same_as") or want.get("differs_from")) is not None:
            why = _relation_verdict(want, value, values, rtol, atol)
        elif want.get("at_least") is not None or want.get("at_most") is not None:
            why = _bounds_verdict(want, value, expected)
        else:
            why = _differs(expected, value, rtol, atol, repr(name))
        if why:
            return why
    return None
