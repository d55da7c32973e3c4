"""A hostile or broken results tree: the reader stays bounded and says what it refused.

FIFOs, devices, symlinks out of the tree or in a loop, rows whose parameters multiply out
to 10^8, and values of the wrong type each end in a one-line warning or error, the right
exit status, and no traceback; a hypothesis test builds random hostile trees.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal

import asv_fixtures as F
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matmul_drift.cli.main import main as cli_main
from matmul_drift.read import history
from matmul_drift.store import bounded

PROG = "matmul-drift summary"


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail, rather than hang, if the reader blocks (a FIFO opened without O_NONBLOCK)."""
    def boom(signum, frame):
        raise AssertionError(f"the reader blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def summary_of(root) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with deadline(60), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(["summary", str(root)])
    lines = err.getvalue().splitlines()
    assert "Traceback" not in err.getvalue()
    assert all(ln.startswith(f"{PROG}: ") for ln in lines), lines  # one line per warning or error
    return rc, out.getvalue(), lines


@pytest.fixture
def tree(tmp_path):
    return F.write_tree(tmp_path / "results", n_commits=2)


def catalog_entry(tree):
    """An env-id entry: every summary reads them (the torch version of each run)."""
    return sorted((tree.catalog_dir / "env").glob("*.json"))[0]


def replace(path, how: str, tmp_path):
    """Put something hostile where ``path`` was."""
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dev-zero":
        path.symlink_to("/dev/zero")
    elif how == "loop":
        path.symlink_to(path.name)
    elif how == "outside":
        target = tmp_path / "outside.json"
        target.write_text("{}")
        path.symlink_to(target)
    elif how == "directory":
        path.mkdir()
    else:
        raise ValueError(how)


@pytest.mark.parametrize("how", ["fifo", "dev-zero", "loop", "outside", "directory"])
def test_benchmarks_json_that_is_not_a_file_is_one_error(tree, tmp_path, how):
    replace(tree.asv_dir / "benchmarks.json", how, tmp_path)
    rc, _, lines = summary_of(tree.root)
    assert rc == 2 and len(lines) == 1 and "benchmarks.json" in lines[0]


@pytest.mark.parametrize("how", ["fifo", "dev-zero", "loop", "outside", "directory"])
@pytest.mark.parametrize("which", ["machine.json", "results", "catalog"])
def test_other_files_that_are_not_files_are_one_warning_each(tree, tmp_path, how, which):
    path = {"machine.json": tree.machine_dir / "machine.json", "results": tree.file(1, 1),
            "catalog": catalog_entry(tree)}[which]
    replace(path, how, tmp_path)
    rc, _, lines = summary_of(tree.root)
    why = {"fifo": "FIFO", "dev-zero": "symlink out of", "loop": "symlink loop", "outside": "symlink out of",
           "directory": "directory"}[how]
    if which == "machine.json":  # the only machine is skipped: nothing readable is left
        assert rc == 2 and any(why in ln for ln in lines), lines
    else:
        assert rc in (0, 1) and [ln for ln in lines if "warning" in ln and why in ln], lines


def test_a_row_naming_a_hundred_million_combinations_is_skipped(tree):
    data = F.load_results(tree.file(1, 0))
    row = data["results"]["drift.Drift.track_kernel_id"]
    row[data["result_columns"].index("params")] = [[str(i) for i in range(10)]] * 8  # 10^8
    row[data["result_columns"].index("result")] = None  # asv's "all failed": would allocate 10^8
    tree.file(1, 0).write_text(json.dumps(data))
    assert len(json.dumps(row)) < 600
    rc, _, lines = summary_of(tree.root)
    assert rc in (0, 1) and [ln for ln in lines if "100000000 combinations" in ln], lines


# An integer float64 cannot hold (10**400, a JSON number without a point) once dropped the
# whole file, every other value with it: "malformed results file (OverflowError: ...)".
@pytest.mark.parametrize("bad", [True, "143656636881798.0", "1.5", [1.0], float("inf"), float("-inf"),
                                 pytest.param(10**400, id="10**400"),
                                 pytest.param(-(2**1024 - 2**970), id="-(2**1024-2**970)")])
def test_a_value_of_the_wrong_type_is_skipped_with_a_warning_not_read_as_a_number(tree, bad):
    rc0, clean, _ = summary_of(tree.root)
    data = F.load_results(tree.file(1, 0))
    for name in ("drift.Drift.track_kernel_id", "drift.Drift.track_error_u"):
        for i in range(len(data["results"][name][data["result_columns"].index("result")])):
            F.set_value(data, name, i, bad)
    time_row = data["results"][F.TIME]
    time_row[F.COL["stats_q_25"]] = [bad, *time_row[F.COL["stats_q_25"]][1:]]  # a stats column too
    tree.file(1, 0).write_text(json.dumps(data))
    h = history.read_history(tree.root)
    run = next(r for r in h.runs[tree.machine] if r.path == tree.file(1, 0))
    q_25 = run.series[F.TIME].stats["q_25"][0]  # ±inf is asv's own in stats (a one-sample CI): kept
    assert run.series[F.TIME].values[0] > 0 and (q_25 == bad if isinstance(bad, float) else q_25 != q_25)
    assert all(s != s for s in run.series["drift.Drift.track_kernel_id"].values)  # NaN: skipped
    assert not run.series["drift.Drift.track_kernel_id"].failed.any()
    rc, text, lines = summary_of(tree.root)
    assert rc == rc0 == 0, text  # no false failing flag
    assert [ln for ln in lines if "not finite numbers, skipped" in ln], lines


def test_bounded_reader_refuses_more_than_its_limit(tmp_path):
    p = tmp_path / "big.json"
    p.write_bytes(b" " * 101)
    with pytest.raises(bounded.Refused, match="more than the 100"):
        bounded.read_bytes(p, tmp_path, limit=100)
    assert bounded.read_bytes(p, tmp_path, limit=101) == b" " * 101


HOSTILE = ["fifo", "dev-zero", "loop", "outside", "directory", "garbage", "truncated", "huge-params", "bools"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=st.lists(st.tuples(st.sampled_from(["benchmarks", "machine", "results", "catalog"]),
                                 st.sampled_from(HOSTILE)), min_size=1, max_size=4))
def test_random_hostile_trees_end_in_one_line_messages(tmp_path_factory, damage):
    tmp_path = tmp_path_factory.mktemp("hostile")
    tree = F.write_tree(tmp_path / "results", n_commits=2)
    done = set()
    for which, how in damage:
        path = {"benchmarks": tree.asv_dir / "benchmarks.json", "machine": tree.machine_dir / "machine.json",
                "results": tree.file(1, 0), "catalog": catalog_entry(tree)}[which]
        if which in done:
            continue  # one damage per file
        done.add(which)
        if how == "garbage":
            path.write_bytes(b"\x00\xff{[")
        elif how == "truncated":
            path.write_bytes(path.read_bytes()[:17])
        elif how in ("huge-params", "bools"):
            data = json.loads(path.read_text())
            if which != "results":
                data = {"version": True, "x": data} if how == "bools" else [data] * 3
            elif how == "huge-params":
                row = data["results"]["drift.Drift.track_error_u"]
                row[data["result_columns"].index("params")] = [["'a'"] * 1000] * 3
            else:
                row = data["results"]["drift.Drift.track_error_u"]
                row[data["result_columns"].index("result")] = [True] * len(row[0])
            path.write_text(json.dumps(data))
        else:
            replace(path, how, tmp_path)
    rc, _, lines = summary_of(tree.root)
    assert rc in (0, 1, 2)
    assert rc != 2 or any("error" in ln for ln in lines)


def test_a_unit_relabelled_in_benchmarks_json_is_a_warning_and_the_stricter_judgement_wins(tmp_path):
    def adjust(ci, ei, data):
        if ci == 1:
            F.set_value(data, F.KERNEL, 0, 12345.0)  # a kernel change: failing

    tree = F.write_tree(tmp_path / "results", n_commits=2, torch_versions=("2.13.0",), adjust=adjust)
    rc, text, lines = summary_of(tree.root)
    assert rc == 1 and "kernel" in text
    bench = json.loads((tree.asv_dir / "benchmarks.json").read_text())
    bench[F.KERNEL]["unit"] = "seconds"  # would make it an informational timing flag
    (tree.asv_dir / "benchmarks.json").write_text(json.dumps(bench))
    rc, text, lines = summary_of(tree.root)
    assert rc == 1 and "kernel (1, failing)" in text
    assert [ln for ln in lines if "'seconds'" in ln and "'kernel-id'" in ln and "judged as 'kernel-id'" in ln]
    # The other way round, the stricter unit in benchmarks.json wins too.
    bench[F.KERNEL]["unit"] = "kernel-id"
    bench["drift.Drift.track_cuda_seconds"] = {**bench[F.KERNEL], "name": "drift.Drift.track_cuda_seconds",
                                                "unit": "kernel-id"}
    (tree.asv_dir / "benchmarks.json").write_text(json.dumps(bench))
    h = history.read_history(tree.root)
    assert h.benchmarks["drift.Drift.track_cuda_seconds"].unit == "kernel-id"
    assert [w for w in h.warnings if "track_cuda_seconds" in w and "judged as 'kernel-id'" in w]
