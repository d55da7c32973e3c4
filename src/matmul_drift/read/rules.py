"""One rule per unit: how a change of one series between two runs is judged. Never imports
torch.

Each benchmark series is judged by its asv unit (docs/design.md, "Units and how a change is
judged"):

==========  =========================================================================
unit        flag kind and rule
==========  =========================================================================
bits-id     ``bits``: the id differs: the output bits of the full product or a slice changed
            on the recorded inputs; the detail names which, from the catalog "bits" entries.
kernel-id   ``kernel``: the id differs (any change of the ordered kernel list); benign where
            the cell's output bits stayed the same (a rename).
ulp         ``invariance``: 0 -> non-zero (lost) or non-zero -> 0 (regained);
            ``ulp-growth`` (informational): non-zero and grew by more than ``ulp_growth``.
u           ``accuracy``: max/min of the two values exceeds ``u_tolerance``, or the value
            crosses the bound (γ_K, or γ_K(TF32)) read from the ``u-bound`` series of the same
            class.
seconds     ``timing``: the ratio exceeds ``time_factor`` and, where asv recorded stats
            for both sides (repeat > 1), the 99 % confidence intervals do not overlap
            (IQR where there is no CI); with no stats, the ratio alone decides.
count       ``nonfinite``: the number of NaN or ±inf outputs changed.
input-id    ``input``: the checksums of the rounded inputs differ; the combination is then
            not compared in any other series of that pair.
order-id    ``order``: the id differs: entry (0, 0) of the full product is summed in another
            order (core/trees.py), even where the kernel-id stays; a kernel flag whose full
            product keeps its order says "renamed, same order".
fix-id      ``fix``: the id differs: a candidate fix (probes/fixes.py) started or stopped removing
            every drift of the combination, or the drifts themselves changed; the detail
            names which, from the two catalog entries.
map-id      ``map``: the id differs: the batch-invariance map (probes/batchmap.py) of a batched
            case changed; the detail names the M whose state changed ("M = 8..15 became
            drifting (row 0 as at M = 1) under torch 2.14.1"), from the two catalog entries'
            verdicts (core/mapruns.py).
ratio       never flagged (``fix_cost``: a timing ratio, noise; fix-id judges the bits).
env-id      never flagged by itself; attributes every flag (``attribution``).
u-bound     never flagged by itself; the bound for ``u``.
==========  =========================================================================

Besides these, ``code``: the benchmark's asv ``version`` (a hash of its code) differs, so the
series is not compared across the change; ``failure``: a combination starts or stops
failing (asv null). Skipped combinations (asv NaN) are never compared.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

import numpy as np

from matmul_drift.core import cases, mapruns, numerics
from matmul_drift.core.ids import hex_id
from matmul_drift.core.words import describe
from matmul_drift.read.flags import ID_UNITS, Flag, Side, format_value
from matmul_drift.read.history import Run, Series
from matmul_drift.read.pairing import Pair
def series_of_unit(run: Run, units: dict[str, str], unit: str) -> Series | None:
    for name, s in run.series.items():
        if units.get(name) == unit:
            return s
    return None


def _side(run: Run, value, status: str = "ok") -> Side:
    return Side(run.commit, run.env_name, run.torch, run.date, value, status)


@dataclass
class Ctx:
    """One benchmark within one pair: builds flags for the few flagged combinations."""

    judge: object  # read/summary.py's Judge: the history, the options, caches, timing evidence
    pair: Pair
    name: str
    unit: str
    sb: Series
    sa: Series
    ib: np.ndarray | None  # aligned index -> index in sb (None: identical params)
    ia: np.ndarray | None
    _aux: dict = field(default_factory=dict)  # unit -> both runs' values of that series, laid out

    def take_b(self, x: np.ndarray) -> np.ndarray:
        return x if self.ib is None else x[self.ib]

    def take_a(self, x: np.ndarray) -> np.ndarray:
        return x if self.ia is None else x[self.ia]

    def jb(self, i: int) -> int:
        """Index in the before series of aligned combination ``i``."""
        return i if self.ib is None else int(self.ib[i])

    def ja(self, i: int) -> int:
        return i if self.ia is None else int(self.ia[i])

    def combo(self, i: int) -> tuple:
        return self.judge.combos(self.sb.params)[self.jb(i)]

    def ids(self, unit: str, i: int) -> tuple[float, float]:
        """Combination ``i``'s values in the series of ``unit`` (env-id, order-id) of both runs
        (NaN where not recorded)."""
        if unit not in self._aux:
            units = self.judge.units
            self._aux[unit] = (
                self.judge.on(series_of_unit(self.pair.before, units, unit), self.sb.params),
                self.judge.on(series_of_unit(self.pair.after, units, unit), self.sa.params),
            )
        eb, ea = self._aux[unit]
        return (math.nan if eb is None else float(eb[self.jb(i)]),
                math.nan if ea is None else float(ea[self.ja(i)]))

    @staticmethod
    def value(s: Series, j: int) -> tuple[float | None, str]:
        status = s.status(j)
        return (float(s.values[j]) if status == "ok" else None), status

    def same_bits(self, i: int) -> bool | None:
        """Whether combination ``i`` gave the same output bits on both sides; None where a side
        recorded no digest (results made before the digest)."""
        b, a = self.ids("bits-id", i)
        return b == a if math.isfinite(b) and math.isfinite(a) else None

    def flag(self, kind: str, i: int, detail: str, benign: str = "") -> Flag:
        vb, stb = self.value(self.sb, self.jb(i))
        va, sta = self.value(self.sa, self.ja(i))
        before, after = _side(self.pair.before, vb, stb), _side(self.pair.after, va, sta)
        if self.unit in ID_UNITS:
            before.id = None if vb is None else hex_id(vb)
            after.id = None if va is None else hex_id(va)
        params = self.judge.history.params_dict(self.name, self.sb.params, self.combo(i))
        envs = self.ids("env-id", i)
        return Flag(kind, self.pair.machine, self.pair.across, self.name, self.unit, params,
                    before, after, detail, self.judge.attribution(self.pair, *envs), benign=benign,
                    envs=envs, bits=self.ids("bits-id", i))


def _kernel(ctx: Ctx, vb, va, both) -> list[Flag]:
    flags = []
    cat = ctx.judge.history.catalog
    for i in np.nonzero(both & (vb != va))[0]:
        kb, ka = cat.get("kernels", vb[i]), cat.get("kernels", va[i])
        detail = kernel_detail(vb[i], va[i], kb, ka)
        ob, oa = ctx.ids("order-id", i)
        full_changed = (not isinstance(kb, dict) or not isinstance(ka, dict)
                        or kb.get("full") != ka.get("full"))
        if full_changed and math.isfinite(ob) and ob == oa:
            entry = cat.get("orders", ob)
            if isinstance(entry, dict) and entry.get("tree") is not None:
                detail += f"; renamed, same order: {describe_order(entry)} (order-id {hex_id(ob)})"
        same = ctx.same_bits(i)
        if same is not None:
            detail += "; same output bits" if same else "; output bits changed"
        f = ctx.flag("kernel", i, detail, "same output bits" if same else "")
        f.before.kernels, f.after.kernels = kb, ka
        flags.append(f)
    return flags


def kernel_detail(id_b: float, id_a: float, kb, ka) -> str:
    """Old kernel names beside the new ones, per list that changed ("full: a, b -> a, c")."""
    if not isinstance(kb, dict) or not isinstance(ka, dict):
        return f"kernel-id {hex_id(id_b)} -> {hex_id(id_a)} (names not in the catalog)"
    lines = []
    for key in list(dict.fromkeys([*kb, *ka])):
        old, new = kb.get(key), ka.get(key)
        if old == new:
            continue
        fmt = lambda v: ("none" if v is None  # noqa: E731
                         else (", ".join(map(_inline, v)) if isinstance(v, list) else _inline(v)))
        lines.append(f"{_inline(key)}: {fmt(old)} -> {fmt(new)}")
    return "\n".join(lines) or f"kernel-id {hex_id(id_b)} -> {hex_id(id_a)}"


def _inline(name) -> str:
    """A name from the catalog on one line of a detail, whose lines a newline separates: its
    own line breaks written as \\uXXXX (the flag's kernels keep the names as they are)."""
    return str(name).replace("\r", "\\u000d").replace("\n", "\\u000a")


def _order(ctx: Ctx, vb, va, both) -> list[Flag]:
    cat = ctx.judge.history.catalog
    flags = []
    for i in np.nonzero(both & (vb != va))[0]:
        kb, ka = ctx.ids("kernel-id", i)
        same = math.isfinite(kb) and kb == ka
        flags.append(ctx.flag("order", i, order_detail(vb[i], va[i], cat.get("orders", vb[i]),
                                                       cat.get("orders", va[i]), same)))
    return flags


def describe_order(entry) -> str:
    """A catalog orders entry in words (words.describe), "not revealed" for the tree null."""
    return describe(entry.get("tree"))


def order_detail(id_b: float, id_a: float, eb, ea, same_kernels: bool) -> str:
    """The two orders in words; says when the kernel-id stayed (same kernels, another order, or
    an order read on one side only: a tree null there says nothing about the order)."""
    one_side = False
    if not isinstance(eb, dict) or not isinstance(ea, dict):
        text = f"order-id {hex_id(id_b)} -> {hex_id(id_a)} (trees not in the catalog)"
    else:
        one_side = (eb.get("tree") is None) != (ea.get("tree") is None)
        wb, wa = describe_order(eb), describe_order(ea)
        text = (f"order of entry (0, 0): {wb} -> {wa}" if wb != wa else
                f"order of entry (0, 0): another tree, alike in words "
                f"({wb}; order-id {hex_id(id_b)} -> {hex_id(id_a)})")
        if eb.get("k") != ea.get("k"):
            text += f"; K {eb.get('k')} -> {ea.get('k')}"
    if not same_kernels:
        return text
    return text + ("; kernel-id unchanged: the probe read the same kernels' order on one side only"
                   if one_side else
                   "; kernel-id unchanged: the same kernels add in another order")


def _fix(ctx: Ctx, vb, va, both) -> list[Flag]:
    cat = ctx.judge.history.catalog
    return [ctx.flag("fix", i, fix_detail(vb[i], va[i], cat.get("fixes", vb[i]),
                                          cat.get("fixes", va[i])))
            for i in np.nonzero(both & (vb != va))[0]]


def fix_detail(id_b: float, id_a: float, fb, fa) -> str:
    """Which candidates started or stopped removing every drift, and how the drifts changed."""
    if not isinstance(fb, dict) or not isinstance(fa, dict):
        return f"fix-id {hex_id(id_b)} -> {hex_id(id_a)} (verdicts not in the catalog)"
    kinds = lambda e: ", ".join(map(_inline, e.get("drifts") or [])) or "none"  # noqa: E731
    works = lambda e: {n for n, v in (e.get("verdicts") or {}).items()  # noqa: E731
                       if v == "removes"}
    lines = [f"drifts: {kinds(fb)} -> {kinds(fa)}"] if fb.get("drifts") != fa.get("drifts") else []
    if fa.get("drifts"):
        if stopped := sorted(works(fb) - works(fa)):
            lines.append("stopped removing the drift: " + "; ".join(
                f"{_inline(n)} (now {_inline((fa.get('verdicts') or {}).get(n, 'not measured'))})"
                for n in stopped))
        if started := sorted(works(fa) - works(fb)):
            lines.append("started removing the drift: " + "; ".join(map(_inline, started)))
        lines.append("removes it now: "
                     + ("; ".join(map(_inline, sorted(works(fa)))) or "no candidate"))
    return "\n".join(lines) or f"fix-id {hex_id(id_b)} -> {hex_id(id_a)} (verdicts otherwise alike)"


def _map(ctx: Ctx, vb, va, both) -> list[Flag]:
    cat, pair = ctx.judge.history.catalog, ctx.pair
    where = (f" under torch {pair.after.torch}" if pair.across == "envs" and pair.after.torch else
             f" at {pair.after.commit[:8]}" if pair.across == "commits" else "")
    return [ctx.flag("map", i, map_detail(vb[i], va[i], cat.get("maps", vb[i]),
                                          cat.get("maps", va[i]), where))
            for i in np.nonzero(both & (vb != va))[0]]


def map_detail(id_b: float, id_a: float, eb, ea, where: str = "") -> str:
    """The M whose state changed between two maps (catalog "maps" entries), a line per kind of
    change (mapruns.changes), ``where`` ("under torch 2.14.1+cpu") after the first; where no M
    changed, the lines of the map's words that did (a drift's size); a range mapped otherwise
    says so."""
    runs = [e.get("verdicts") if isinstance(e, dict) else None for e in (eb, ea)]
    bad = [mapruns.misfit(r) for r in runs]
    if any(bad):
        why = next(b for b in bad if b)
        return (f"map-id {hex_id(id_b)} -> {hex_id(id_a)} "
                f"(maps not in the catalog or unreadable: {why})")
    lines = mapruns.changes(*runs)
    if lines:
        lines[0] += where
    else:
        wb, wa = (str(e.get("words", "")).splitlines() for e in (eb, ea))
        moved = [f"{_inline(b)} -> {_inline(a)}" for b, a in zip(wb, wa) if b != a]
        lines = [f"every M in the same state{where}"
                 + ("; the words changed: " + "; ".join(moved) if moved else
                    f" (map-id {hex_id(id_b)} -> {hex_id(id_a)})")]
    pb, pa = (e.get("params") if isinstance(e.get("params"), dict) else {} for e in (eb, ea))
    other = [f"{_inline(k)} {_inline(pb.get(k))} -> {_inline(pa.get(k))}"
             for k in sorted(pb.keys() | pa.keys())
             if pb.get(k) != pa.get(k)]
    if other:
        lines.append("mapped otherwise: " + "; ".join(other))
    return "\n".join(lines)


def _ulp(ctx: Ctx, vb, va, both) -> list[Flag]:
    flags = []
    lost = both & (vb == 0) & (va != 0)
    regained = both & (vb != 0) & (va == 0)
    grew = both & (vb > 0) & (va > vb * ctx.judge.options.ulp_growth)
    for i in np.nonzero(lost | regained | grew)[0]:
        change = f"{format_value(vb[i], 'ulp')} -> {format_value(va[i], 'ulp')}"
        if lost[i]:
            flags.append(ctx.flag("invariance", i, f"invariance lost: {change}"))
        elif regained[i]:
            flags.append(ctx.flag("invariance", i, f"invariance regained: {change}",
                                  _better(ctx, i, "invariance regained")))
        else:
            flags.append(ctx.flag("ulp-growth", i, f"drift grew {va[i] / vb[i]:.3g}x: {change}"))
    return flags


def _accuracy(ctx: Ctx, vb, va, both) -> list[Flag]:
    tol = ctx.judge.options.u_tolerance
    lo, hi = np.minimum(vb, va), np.maximum(vb, va)
    changed = both & (hi > lo) & (hi > tol * lo)  # lo == 0 < hi counts: any route change from exact
    crossed = np.zeros_like(both)
    gb = ga = None
    bound = ctx.judge.bound_of.get(ctx.name)
    if bound is not None and bound in ctx.pair.before.series and bound in ctx.pair.after.series:
        gb = ctx.take_b(ctx.judge.on(ctx.pair.before.series[bound], ctx.sb.params))
        ga = ctx.take_a(ctx.judge.on(ctx.pair.after.series[bound], ctx.sa.params))
        with np.errstate(invalid="ignore"):
            known = np.isfinite(gb) & np.isfinite(ga)
            crossed = both & known & ((vb > gb) != (va > ga))
    flags = []
    for i in np.nonzero(changed | crossed)[0]:
        ratio = "" if vb[i] == 0 else f" ({va[i] / vb[i]:.3g}x)"
        detail = f"error {format_value(vb[i], 'u')} -> {format_value(va[i], 'u')}{ratio}"
        if crossed[i]:
            g = numerics.bound_name(ctx.judge.history.params_dict(ctx.name, ctx.sb.params,
                                                                  ctx.combo(i)).get("dtype"))
            detail += (f"; now above the {g} bound {format_value(ga[i], 'u')}" if va[i] > ga[i]
                       else f"; back within the {g} bound {format_value(ga[i], 'u')}")
        worse = va[i] > vb[i] or (crossed[i] and va[i] > ga[i])
        flags.append(ctx.flag("accuracy", i, detail,
                              "" if worse else _better(ctx, i, "more accurate")))
    return flags


def _better(ctx: Ctx, i: int, why: str) -> str:
    """``why`` where a change for the better need not fail on its own: the cell's output bits
    were recorded and changed, so their flag fails; "" where no digest says so."""
    return why if ctx.same_bits(i) is False else ""


def _bits(ctx: Ctx, vb, va, both) -> list[Flag]:
    cat = ctx.judge.history.catalog
    return [ctx.flag("bits", i, bits_detail(vb[i], va[i], cat.get("bits", vb[i]),
                                            cat.get("bits", va[i])))
            for i in np.nonzero(both & (vb != va))[0]]


def bits_detail(id_b: float, id_a: float, eb, ea) -> str:
    """Which outputs' bits changed (the full product, each slice), from two catalog "bits"
    entries (part -> digest); the ids alone where an entry is missing."""
    pb, pa = (e.get("parts", e) if isinstance(e, dict) else None for e in (eb, ea))
    if not isinstance(pb, dict) or not isinstance(pa, dict):
        return f"output bits {hex_id(id_b)} -> {hex_id(id_a)} (digests not in the catalog)"
    parts = list(dict.fromkeys([*pb, *pa]))
    moved = [_inline(k) for k in parts if pb.get(k) != pa.get(k)]
    kept = [_inline(k) for k in parts if pb.get(k) == pa.get(k)]
    return (f"output bits changed: {', '.join(moved) or 'none by part'}"
            + (f"; unchanged: {', '.join(kept)}" if kept else ""))


def _timing(ctx: Ctx, vb, va, both) -> list[Flag]:
    """A timing change is first a suspect: beyond the factor against the recent baseline of its
    build (Judge.baseline), and apart by the 99% CIs where asv recorded them (else its IQRs;
    for a CUDA track, do_bench's 20-80% quantiles). A run whose GPU clock fell while timed is
    not compared (a note). It is flagged only on evidence across runs (Judge.timing_evidence),
    and its detail leads with the direction that evidence found."""
    f = ctx.judge.options.time_factor
    base, base_stats, where = ctx.judge.baseline(ctx, vb)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = va / base
    big = both & (base > 0) & ((ratio > f) | (ratio < 1 / f))
    if not big.any():
        return []
    apart = np.ones(big.shape, dtype=bool)  # without stats the ratio alone decides
    how = np.full(big.shape, "no stats", dtype=object)
    b = base_stats()
    if b is not None and ctx.sa.stats is not None:
        a = {k: ctx.take_a(v) for k, v in ctx.sa.stats.items()}
        # As asv compare: one sample (repeat 1) has no interval, so the factor alone decides.
        judged = (b["repeat"] != 1) & (a["repeat"] != 1)
        how[~judged] = "one sample"
        for lo, hi, label in (("ci_99_a", "ci_99_b", "99% CIs apart"),
                              ("q_25", "q_75", "IQRs apart")):
            have = judged & ~(np.isnan(b[lo]) | np.isnan(b[hi]) | np.isnan(a[lo]) | np.isnan(a[hi]))
            apart[have] = ((b[hi] < a[lo]) | (a[hi] < b[lo]))[have]
            how[have] = label
            judged &= ~have  # the IQR only where there is no CI
    # a track (CUDA events): do_bench's quantiles
    for i in np.nonzero(big & (how == "no stats"))[0]:
        (b20, a20), (b80, a80) = ctx.ids("q20-seconds", i), ctx.ids("q80-seconds", i)
        if all(math.isfinite(x) for x in (b20, a20, b80, a80)):
            apart[i], how[i] = (b80 < a20) or (a80 < b20), "20-80% quantiles apart"
    flags = []
    for i in np.nonzero(big & apart)[0]:
        # the GPU slowed itself: that run's times say nothing of torch
        if 1.0 in ctx.ids("clock-fell", i):
            ctx.judge.timing_note(ctx.pair.machine,
                                  "where the GPU's SM clock fell while timed (not compared)")
            continue
        slower = bool(ratio[i] > 1)
        found = ctx.judge.timing_evidence(ctx, i, slower, how[i], float(base[i]))
        if found is None:
            continue
        direction, evidence = found
        recorded = f"as recorded {_seconds(vb[i])} -> {_seconds(va[i])} ({_times(va[i] / vb[i])})"
        if where(i):
            recorded += f", against {_seconds(base[i])} {where(i)} ({_times(ratio[i])})"
        suspect = ctx.judge.options.timing == "suspects"  # a list to re-measure, not an alarm
        benign = "not confirmed yet" if suspect else "faster" if direction == "faster" else ""
        flag = ctx.flag("timing", i, f"{evidence}; {recorded}", benign)
        flag.direction = direction
        flags.append(flag)
    return flags


def _seconds(value: float) -> str:
    return format_value(float(value), "seconds")


def _times(ratio: float) -> str:
    """A ratio after/before in words: "1.41x faster", "1.63x slower"."""
    if not math.isfinite(ratio) or ratio <= 0:
        return f"ratio {ratio:.3g}"
    return f"{ratio:.3g}x slower" if ratio >= 1 else f"{1 / ratio:.3g}x faster"


def bench_name(name: str) -> str:
    # "drift.Drift.track_error_u" -> "Drift.track_error_u": the module repeats the class.
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else name


def repro(flag: Flag) -> str | None:
    """A command that measures the flag's cell again on the reader's machine, pasteable into a
    shell: `matmul-drift explain --case C --dtype D --device X`. Only from values the case
    catalog knows (a results tree may name anything), each quoted; None otherwise."""
    p = flag.params
    if (p.get("case") not in cases.CASE_IDS or p.get("dtype") not in cases.PRECISIONS
            or p.get("device") not in cases.DEVICES):
        return None
    return "matmul-drift explain " + " ".join(f"--{k} {shlex.quote(p[k])}"
                                              for k in ("case", "dtype", "device"))


def confirmation_key(machine: str, benchmark: str, params: dict, before: Run, after: Run) -> tuple:
    """How a re-measurement (results/confirm) names the pair of results it judged."""
    return (machine, benchmark, tuple(sorted(params.items())), before.commit, before.env_name,
            after.commit, after.env_name)


def confirmed_text(rec: dict) -> str:
    """A re-measurement in words, its direction first: "1.92x slower, re-measured 3 times
    interleaved (range 1.85-1.97)"."""
    ratios = [r for r in rec.get("ratios") or [] if isinstance(r, (int, float)) and r > 0]
    if not ratios:
        return f"re-measured: {rec.get('verdict')}"
    x = sorted(r if r >= 1 else 1 / r for r in ratios)
    return (f"{x[len(x) // 2]:.3g}x {confirmed_direction(rec)}, re-measured {len(ratios)} "
            f"time{'s' * (len(ratios) != 1)} interleaved (range {x[0]:.3g}-{x[-1]:.3g})")


def confirmed_direction(rec: dict) -> str:
    """"slower" or "faster": what a re-measurement found (its median ratio after/before)."""
    ratios = sorted(r for r in rec.get("ratios") or [] if isinstance(r, (int, float)) and r > 0)
    if not ratios:
        return str(rec.get("direction") or "")
    return "slower" if ratios[len(ratios) // 2] >= 1 else "faster"


def _count(ctx: Ctx, vb, va, both) -> list[Flag]:
    return [ctx.flag("nonfinite", i, f"non-finite outputs {vb[i]:.0f} -> {va[i]:.0f}")
            for i in np.nonzero(both & (vb != va))[0]]


RULES = {"bits-id": _bits, "kernel-id": _kernel, "order-id": _order, "fix-id": _fix,
         "map-id": _map, "ulp": _ulp, "u": _accuracy,
         "seconds": _timing, "count": _count}


def judged(unit: str | None) -> bool:
    """Whether a series of this unit is compared: env-id and u-bound serve the others, and
    unknown units are not judged."""
    return unit in RULES or unit == "input-id"
