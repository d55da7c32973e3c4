"""The map's run: check memory, draw the inputs, make the two anchor products, then the
resumable search (resumable.py, which scan_run drives too) over M.

The search and the record are batchmap.py's, one M's measurement measure/batchpoint.py's;
parsing and printing stay in cli/map.py. ``run`` returns resumable's Outcome (plain data).
``plan``, ``Mapper``, ``complete`` and ``confirm`` are the same steps without a file or signal
handling, as the suite maps each batched case (jobs/suite.py, add_maps).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from matmul_drift.core import ids, mapruns
from matmul_drift.core.cases import storage_dtype
from matmul_drift.measure import batchpoint, environment, measure, memory, record
from matmul_drift.probes import batchmap, classsearch, records, resumable
from matmul_drift.probes.batchmap import state

CONFIRM_MOST = 12  # M a confirmation re-measures at most (each run's first and last, spread)


def check_memory(s: dict, dtype: str, device: str, host: bool = True) -> None:
    """MapError (one line) when the full product's operands and comparisons need more memory
    than there is, on the host (MemAvailable, unless not ``host``) or free on the GPU. The
    estimate is explain's for that shape (it holds an exact reference the map does not make:
    it errs high)."""
    need = memory.bytes_needed(s["m_full"], s["k"], s["n"], dtype, device, s["batch"] or 1)
    try:
        memory.check(need, f"the full product, m={s['m_full']} k={s['k']} n={s['n']} in {dtype},",
                     device, host)
    except memory.TooLarge as exc:
        raise batchmap.MapError(str(exc)) from None


@dataclass(frozen=True)
class Plan:
    """A map checked before anything is allocated: ``shape`` (batchmap.shape's dict), the
    storage ``dtype``, its ``params`` and the ``environment`` it records (no MKL banner: that is
    not known before a product)."""

    shape: dict
    dtype: str
    params: batchmap.Params
    environment: dict


def plan(case_id: str | None, k: int | None, n: int | None, rng: tuple[int, int] | None,
         precision: str, device: str, host_memory_check: bool = True) -> Plan:
    """The map of M over ``rng`` (None: the device's default) for ``--case case_id`` or the
    shape ``k`` x ``n``, in ``precision`` on ``device``. MapError for bad input, and for a shape
    that needs more memory than there is (the host's only when ``host_memory_check``)."""
    try:
        batchpoint.check(device, precision)
    except record.Unavailable as exc:
        raise batchmap.MapError(str(exc)) from None
    s = batchmap.shape(case_id, k, n, rng, device)
    dtype = storage_dtype(precision)
    check_memory(s, dtype, device, host_memory_check)
    env = environment.describe(device)
    params = batchmap.Params(case_id, s["case"].op, s["lo"], s["hi"], s["m_full"], s["full"],
                             s["k"], s["n"], s["batch"], precision, device, record.SEED,
                             ids.hex_id(ids.object_id(env)))
    return Plan(s, dtype, params, env)


class Mapper:
    """A planned map's inputs and anchor products (``A[:1] @ B`` and the full product), made
    once on construction: the point at any M of its range (``point``), and its record."""

    def __init__(self, planned: Plan):
        self.plan = planned
        p = planned.params
        a_bits, b_bits, self.checksum = measure.operand_bits(planned.shape["case"], planned.dtype,
                                                             p.device)
        self.ops = measure.make_operands(a_bits, b_bits, planned.dtype, p.device,
                                         planned.shape["case"])
        del a_bits, b_bits
        self.made = measure.rows_made(planned.shape["case"].id, self.checksum, p.dtype, p.device)
        with measure.precision_flags(p.dtype):
            self.anchors = batchpoint.anchors(self.ops, self.made)

    def point(self, m: int) -> dict:
        """batchpoint.batch_point at M = ``m``, under the precision's matmul flags."""
        p = self.plan.params
        with measure.precision_flags(p.dtype):
            return batchpoint.batch_point(self.ops, m, self.anchors, dtype=self.plan.dtype,
                                          device=p.device, made=self.made)

    def record(self, points: dict[int, dict], sessions: list[dict], complete: bool,
               search: dict | None = None) -> dict:
        """batchmap.record of ``points`` on these inputs and anchors (``search``: the report)."""
        return batchmap.record(self.plan.params, points, input_checksum=self.checksum,
                               anchor_checksum=self.anchors.checksum,
                               environment=self.plan.environment,
                               sessions=sessions, complete=complete, search=search)


def complete(mapper: Mapper) -> dict:
    """The whole map in one go, with no file and no signal handling (the suite's way: asv
    stops its setup_cache as a whole): the complete record, one session (seconds)."""
    t0 = time.monotonic()
    p = mapper.plan.params
    points, found = batchmap.search(p.lo, p.hi, mapper.point)
    return mapper.record(points, [{"evaluated": len(points),
                                   "seconds": round(time.monotonic() - t0, 3),
                                   "complete": True}], complete=True, search=found)


def confirm(mapper: Mapper, runs: list[dict], most: int = CONFIRM_MOST) -> dict:
    """A recorded map's ``runs`` checked cheaply on ``mapper``'s inputs: each run's first and last
    M (mapruns.ends: at most ``most``) measured again and compared with the state the runs give
    it. Returns ``sizes`` (the M measured), ``differ`` ([(M, recorded state, measured state)]) and
    ``seconds``."""
    t0 = time.monotonic()
    stated = mapruns.per_m(runs)
    sizes = mapruns.ends(runs, most)
    differ = []
    for m in sizes:
        now = state(mapper.point(m))
        if now != stated[m]:
            differ.append((m, stated[m], now))
    return {"sizes": sizes, "differ": differ, "seconds": round(time.monotonic() - t0, 3)}


def run(case_id: str | None, k: int | None, n: int | None, rng: tuple[int, int] | None,
        precision: str, device: str, path: str | None, resume: bool,
        prog: str = "matmul-drift map",
        host_memory_check: bool = True) -> resumable.Outcome:
    """Map M over ``rng`` (None: the device's default) for ``--case case_id`` or the shape
    ``k`` x ``n``, in ``precision`` on ``device``. With ``path`` the record is written there
    once a second and at the end (``resume``: continued from it). MapError for bad input, and
    for a shape that needs more memory than there is (the host's only when ``host_memory_check``),
    all before anything is allocated."""

    planned = plan(case_id, k, n, rng, precision, device, host_memory_check)
    s, params = planned.shape, planned.params
    rec = records.load(path) if resume else None
    if resume:
        batchmap.check_record(rec, params)  # before drawing inputs

    mapper = Mapper(planned)

    def done(result: dict, evaluated: int) -> str:
        return (f"{evaluated} batch sizes measured here, {result['measured']} in all, "
                f"for {result['range_size']}" + (f"; record in {path}" if path else ""))

    with measure.precision_flags(precision):
        points = (batchmap.resume_points(rec, params, mapper.checksum, mapper.anchors.checksum)
                  if rec else {})
        return resumable.drive(
            lambda evaluate, known: batchmap.search(s["lo"], s["hi"], evaluate, known=known),
            mapper.point, mapper.record, done,
            words=resumable.Words(prog, "M", "at M = {}", "batch sizes"),
            grid=classsearch.grid_count(s["lo"], s["hi"], None), path=path, resumed=rec,
            points=points)
