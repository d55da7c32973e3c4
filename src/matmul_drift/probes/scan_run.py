"""The scan's run: check memory, draw the inputs, then the resumable search (resumable.py)
over the sizes, each measured as measure/measure.py's scan_point.

The search itself is classsearch.py's, the record scan.py's; parsing arguments and rendering
stay in cli/scan.py. ``run`` returns resumable's Outcome (plain data).
"""

from __future__ import annotations

from matmul_drift.core import cases, ids
from matmul_drift.measure import environment, measure, memory, record
from matmul_drift.probes import classsearch, records, resumable, scan


def check_memory(vary: str, dims: dict, dtype: str, device: str, host: bool = True) -> None:
    """ScanError (one line) when the top of the range needs more memory than there is: on the
    host (MemAvailable, unless not ``host``) or free on the GPU."""
    need = memory.bytes_needed(dims["m"], dims["k"], dims["n"], dtype, device, prefix_a=vary == "k")
    try:
        memory.check(need, f"the top of the range, m={dims['m']} k={dims['k']} n={dims['n']} "
                     f"in {dtype},", device, host)
    except memory.TooLarge as exc:
        raise scan.ScanError(str(exc)) from None


def run(vary: str, lo: int, hi: int, fixed: dict, dtype: str, device: str, step: int,
        path: str | None,
        resume: bool, prog: str = "matmul-drift scan", host_memory_check: bool = True,
        within: int | None = None) -> resumable.Outcome:
    """Scan ``vary`` over lo..hi with the ``fixed`` dimensions ({"m": .., "k": .., "n": ..},
    the varied one None). ``step`` 0 is the default grid. With ``path`` the record is
    written there once a second and at the end (``resume``: continued from it). ScanError for
    bad input, and for a range whose top needs more memory than there is (the host's only
    when ``host_memory_check``). ``within``: the size of the varied dimension the points slice
    (the operands' layout, as a slice of a wider tensor has it), None for ``hi``."""

    dims = {**fixed, vary: within or hi}
    try:
        measure.check_device(device, dtype)
    except record.Unavailable as exc:
        raise scan.ScanError(str(exc)) from None
    check_memory(vary, dims, dtype, device, host_memory_check)
    env = environment.describe(device)  # no MKL banner: it is not known before a product
    params = scan.Params(vary, lo, hi, fixed["m"], fixed["k"], fixed["n"], dtype, device, step,
                         record.SEED, ids.hex_id(ids.object_id(env)), within)
    rec = records.load(path) if resume else None
    if resume:  # a file of JSON null too: it is no record, and must not be written over
        scan.check_record(rec, params)  # before drawing inputs, which can take minutes

    # Inputs as explain draws them for this shape: uniform [0, 1), as the seed.
    case = cases.adhoc(dims["m"], dims["k"], dims["n"])
    a_bits, b_bits, checksum = measure.operand_bits(case, dtype, device)
    points = scan.resume_points(rec, params, checksum) if rec else {}
    ops = measure.make_operands(a_bits, b_bits, dtype, device, case)
    del a_bits, b_bits
    top = None if vary == "k" else measure.top_product(ops)

    def make_record(all_points: dict, sessions: list, complete: bool, search: dict | None) -> dict:
        return scan.record(params, all_points, input_checksum=checksum, environment=env,
                           sessions=sessions, complete=complete, search=search)

    def done(result: dict, evaluated: int) -> str:
        return (f"{evaluated} evaluated here, {result['evaluations']} in all, for "
                f"{result['dense_equivalent']} sizes; {scan.boundary_count(result)}"
                + (f"; record in {path}" if path else ""))

    return resumable.drive(
        lambda evaluate, known: classsearch.checked_search(lo, hi, evaluate, known=known,
                                                           step=step),
        lambda size: measure.scan_point(ops, vary, size, top, dtype=dtype, device=device),
        make_record, done, words=resumable.Words(prog, "size", "at {}", "evaluations"),
        grid=classsearch.grid_count(lo, hi, step), path=path, resumed=rec, points=points)
