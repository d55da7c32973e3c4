"""Observations in, flags out: what changed between neighbouring runs (read/pairing.py pairs
them, read/rules.py holds one rule per unit, read/incidents.py groups the flags by cause).
Which flags fail is stated once, in docs/summary.md, "Severity". Never imports torch."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from matmul_drift.core import series
from matmul_drift.core.errors import BadValue, Misuse, Param
from matmul_drift.core.ids import hex_id
from matmul_drift.read.flags import KINDS, Flag, diff_entries, flatten
from matmul_drift.read.history import History, Run, Series, version_key
from matmul_drift.read.incidents import Incident, group
from matmul_drift.read.pairing import Pair, hardware_changes, hardware_key, make_pairs
from matmul_drift.read.rules import (RULES, Ctx, bench_name, confirmation_key, confirmed_direction,
                                     confirmed_text, judged, series_of_unit)
from matmul_drift.store import machine as hardware

DEFAULT_FAIL_ON = frozenset({"bits", "kernel", "order", "map", "invariance", "accuracy",
                             "nonfinite", "input", "fix", "timing"})
ACROSS = ("commits", "envs", "both", "machines")
TIMING = ("evidence", "suspects")

# Identical kernels on identical inputs give identical bits, so any change of error_u is a
# change of route; the tolerance only keeps tiny reorderings (a different split of one sum,
# which moves the max error by well under 2x) out of the report. A real route change (split-K,
# TF32, a reduced-precision accumulator) moves it by 2x to orders of magnitude.
DEFAULT_U_TOLERANCE = 2.0
DEFAULT_ULP_GROWTH = 2.0
# asv compare's default factor: a 10 % step, and only when the 99 % CIs are apart.
DEFAULT_TIME_FACTOR = 1.1
# A time is judged against at most this many recent runs of its build (Judge.baseline).
BASELINE_RUNS = 5


@dataclass
class Options:
    """How to pair runs and when to flag. Tolerances are ratios (>= 1, dimensionless)."""

    across: str = "both"
    base: str | None = None
    head: str | None = None
    at: str | None = None  # only the pairs that end at this commit (the main job's own run)
    u_tolerance: float = DEFAULT_U_TOLERANCE
    ulp_growth: float = DEFAULT_ULP_GROWTH
    time_factor: float = DEFAULT_TIME_FACTOR
    # "evidence": a timing change is flagged on evidence across runs; "suspects": every suspected
    # change without a re-measurement is flagged (what the main job re-measures)
    timing: str = "evidence"

    def check(self) -> None:
        if self.across not in ACROSS:
            raise BadValue("across", None,
                           f"must be one of {', '.join(ACROSS)}, not {self.across!r}")
        if (self.base is None) != (self.head is None):
            raise Misuse(Param("base"), " and ", Param("head"), " go together")
        if self.base is not None and self.across in ("envs", "machines"):
            raise Misuse(Param("base"), "/", Param("head"), " compare two commits; ",
                         Param("across"), f" {self.across} does not apply")
        if self.at is not None and (self.base is not None or self.across == "machines"):
            raise Misuse(Param("at"), " goes with neither ", Param("base"), "/", Param("head"),
                         " nor ", Param("across"), " machines")
        if self.timing not in TIMING:
            raise BadValue("timing", None,
                           f"must be one of {', '.join(TIMING)}, not {self.timing!r}")
        for name in ("u_tolerance", "ulp_growth", "time_factor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 1):
                raise BadValue(name, None, f"must be a number >= 1, not {v!r}")


@dataclass
class Summary:
    flags: list[Flag]
    pairs: int
    machines: list[str]
    warnings: list[str]
    different_hardware: list[str] = field(default_factory=list)  # neighbouring runs never judged
    # series not compared across a method change
    method_notes: list[str] = field(default_factory=list)
    # suspected timing changes without evidence
    timing_notes: list[str] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)  # the flags grouped by cause
    bits_notes: list[str] = field(default_factory=list)  # results without an output digest

    def failing(self, fail_on) -> list[Flag]:
        return [f for f in self.flags if f.fails(fail_on)]


def parse_fail_on(text: str | None) -> frozenset[str]:
    """'kernel,accuracy' -> kinds; None -> the default; 'none' -> nothing; 'all'. '' is refused
    (UsageError): an empty $VAR would otherwise pass for a choice."""
    if text is None:
        return DEFAULT_FAIL_ON
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["none"]:
        return frozenset()
    if words == ["all"]:
        return frozenset(KINDS)
    alone = [w for w in ("none", "all") if w in words]
    if alone:  # "none" or "all" beside another word: not an unknown kind, but misplaced
        raise BadValue("fail_on", None, f"{alone[0]} stands alone; give it by itself, or a comma "
                       f"list of {', '.join(KINDS)}", colon=True)
    unknown = [w for w in words if w not in KINDS]
    if unknown or not words:
        raise BadValue("fail_on", None, f"unknown kind {unknown[0] if unknown else text!r}; "
                       f"expected a comma list of {', '.join(KINDS)}, or none, or all", colon=True)
    return frozenset(words)


# ---------------------------------------------------------------------------- judging


def summarise(history: History, options: Options | None = None) -> Summary:
    """Judge every pair of neighbouring runs. Raises UsageError for bad options."""
    options = options or Options()
    options.check()
    pairs = make_pairs(history, options)
    notes = [] if options.across == "machines" else hardware_changes(history)
    judge = Judge(history, options)
    flags: list[Flag] = []
    with np.errstate(over="ignore"):  # a ratio of extreme values is inf: flagged, not warned about
        for pair in pairs:
            flags += judge.pair(pair)
    order = {k: i for i, k in enumerate(KINDS)}
    rank = {r.commit: r.rank for runs in history.runs.values() for r in runs}
    flags.sort(key=lambda f: (f.machine, order[f.kind], f.benchmark, rank[f.before.commit],
                              rank[f.after.commit], version_key(f.after.torch), f.after.env))
    by_time = sorted(flags, key=lambda f: (f.machine, rank[f.after.commit], f.across,
                                           version_key(f.after.torch), f.after.env))
    incidents = group(by_time, lambda e: history.catalog.get("env", e))
    return Summary(flags, len(pairs), sorted(history.runs), history.warnings, notes,
                   judge.method_notes(),
                   judge.timing_notes(), incidents, judge.digest_notes())



class Judge:
    """Holds the caches (alignments, attributions) shared by all pairs of one summary."""

    def __init__(self, history: History, options: Options):
        self.history = history
        self.options = options
        self.units = history.units()
        self._index_maps: dict[tuple[int, int], tuple] = {}
        self._combos: dict[int, tuple] = {}
        self._attrib: dict[tuple, list[str]] = {}
        self._unknown: set[str] = set()
        self._method_notes: dict[tuple, str] = {}
        self._timing_counts: dict[tuple[str, str], int] = {}
        self._no_digest: dict[str, None] = {}  # commits whose results record no output bits
        # error_u and its bound live in one class: "drift.Drift.track_error_u" pairs with
        # "drift.Drift.track_gamma_k_u". With one bound series in all, it serves every class.
        bounds = [n for n, u in self.units.items() if u == "u-bound"]
        self.bound_of = {}
        for n, u in self.units.items():
            if u == "u":
                same = [b for b in bounds if b.rsplit(".", 1)[0] == n.rsplit(".", 1)[0]]
                self.bound_of[n] = same[0] if same else (bounds[0] if len(bounds) == 1 else None)

    # -- alignment: every series is a flat array over product(*params)

    def combos(self, params: tuple) -> tuple:
        # Keyed by id(): params tuples are interned by the reader and live as long as the history.
        c = self._combos.get(id(params))
        if c is None:
            c = self._combos[id(params)] = (params, tuple(itertools.product(*params)))
        return c[1]

    def index_map(self, src: tuple, dst: tuple) -> np.ndarray:
        """For each combination of ``dst``, its index in ``src`` (-1 where ``src`` lacks it)."""
        key = (id(src), id(dst))
        hit = self._index_maps.get(key)
        if hit is None:
            where = {c: i for i, c in enumerate(self.combos(src))}
            idx = np.array([where.get(c, -1) for c in self.combos(dst)], dtype=np.intp)
            hit = self._index_maps[key] = (src, dst, idx)
        return hit[2]

    def on(self, aux: Series | None, params: tuple) -> np.ndarray | None:
        """An auxiliary series' values laid out over ``params`` (NaN where it lacks a
        combination)."""
        if aux is None:
            return None
        return aux.values if aux.params is params else self.lay(aux, aux.values, params)

    def align(self, sb: Series, sa: Series):
        """(ib, ia): indices into before/after of the combinations both have (None: identical)."""
        if sb.params is sa.params:
            return None, None
        ia_of_b = self.index_map(sa.params, sb.params)
        ib = np.nonzero(ia_of_b >= 0)[0]
        return ib, ia_of_b[ib]

    # -- one pair

    def pair(self, pair: Pair) -> list[Flag]:
        B, A = pair.before, pair.after
        for run in (B, A):  # results made before the digest: their bits are judged as before
            if series_of_unit(run, self.units, "bits-id") is None:
                self._no_digest.setdefault(run.commit, None)
        flags: list[Flag] = []
        unmatched = 0  # combinations of one run with no counterpart in the other (params changed)
        # measured before, skipped (NaN) after: never compared, but said
        now_skipped: list[str] = []
        for name in sorted(B.series.keys() & A.series.keys()):
            unit = self.units.get(name)
            if unit is None:
                if name not in self._unknown:
                    self._unknown.add(name)
                    self.history.warnings.append(f"benchmark {name} is not in benchmarks.json; "
                                                 "not judged")
                continue
            sb, sa = B.series[name], A.series[name]
            if sb.version != sa.version:
                self._code_note(pair, name, sb, sa)
                continue
            if not judged(unit) or self.method_changed(pair, B, A, name):
                continue
            found, n = self.series(pair, name, unit, sb, sa)
            flags += found
            unmatched += n
            now_skipped += self._now_skipped(name, sb, sa)
        where = f"{pair.machine}: {B.commit[:8]} ({B.env_name}) -> {A.commit[:8]} ({A.env_name})"
        if unmatched:  # else a renamed case's flags would vanish without a word
            self.history.warnings.append(f"{where}: the benchmarks' params differ; {unmatched} "
                                         "combinations in one run only, not compared")
        if now_skipped:  # a budget spent, a probe switched off: no flag, yet not without a word
            self.history.warnings.append(f"{where}: {len(now_skipped)} "
                                         f"value{'s' * (len(now_skipped) != 1)} measured before "
                                         f"{'are' if len(now_skipped) != 1 else 'is'} skipped "
                                         "now (asv NaN), not compared: "
                                         f"{now_skipped[0]}"
                                         + (", ..." if len(now_skipped) > 1 else ""))
        return flags + self.bridge(pair)

    def _now_skipped(self, name: str, sb: Series, sa: Series) -> list[str]:
        """The combinations (``name`` and its params, in words) ``sb`` measured and ``sa``
        skipped."""
        ib, ia = self.align(sb, sa)
        vb = sb.values if ib is None else sb.values[ib]
        va, fa = (sa.values, sa.failed) if ia is None else (sa.values[ia], sa.failed[ia])
        combos = self.combos(sa.params)
        return [f"""{name}({', '.join(self.history.params_dict(
                    name, sa.params, combos[j if ia is None else int(ia[j])]).values())})"""
                for j in np.nonzero(np.isfinite(vb) & np.isnan(va) & ~fa)[0]]

    def bridge(self, pair: Pair) -> list[Flag]:
        """Flags for the combinations that ``pair.after`` measured and ``pair.before`` did not
        (failed, skipped, not run), each judged against the latest earlier run of the chain
        that measured it with the same benchmark code."""
        flags: list[Flag] = []
        A = pair.after
        for name in sorted(A.series) if pair.at > 0 else ():
            unit = self.units.get(name)
            if not judged(unit):
                continue
            sa, sb = A.series[name], pair.before.series.get(name)
            if sb is not None and sb.version != sa.version:
                continue  # flagged as code: not compared across
            pending = np.isfinite(sa.values)
            if sb is not None:
                pending &= ~np.isfinite(self.on(sb, sa.params))
            between = sb is not None  # a run between had the benchmark: it judged any code change
            for k in range(pair.at - 1, -1, -1):
                if not pending.any():
                    break
                se = pair.chain[k].series.get(name)
                if se is None:
                    continue
                earlier = Pair(pair.machine, pair.across, pair.chain[k], A)
                if se.version != sa.version:
                    if not between:
                        self._code_note(earlier, name, se, sa)
                    break
                if self.method_changed(earlier, pair.chain[k], A, name):
                    break
                flags += self.series(earlier, name, unit, se, sa, pending)[0]
                pending &= ~np.isfinite(self.on(se, sa.params))
                between = True
        return flags

    def series(self, pair: Pair, name: str, unit: str, sb: Series, sa: Series,
               only: np.ndarray | None = None) -> tuple[list[Flag], int]:
        """One benchmark of one pair: its flags, and how many combinations one run only has.
        ``only`` (over ``sa``'s combinations) judges those alone, by value: no failure flags."""
        B, A = pair.before, pair.after
        flags: list[Flag] = []
        in_b = series_of_unit(B, self.units, "input-id")
        in_a = series_of_unit(A, self.units, "input-id")
        inputs_comparable = in_b is not None and in_a is not None and in_b.version == in_a.version
        ctx = Ctx(self, pair, name, unit, sb, sa, *self.align(sb, sa))
        unmatched = 0 if ctx.ib is None else sb.values.size + sa.values.size - 2 * len(ctx.ib)
        vb, va = ctx.take_b(sb.values), ctx.take_a(sa.values)
        fb, fa = ctx.take_b(sb.failed), ctx.take_a(sa.failed)
        comparable = np.ones(vb.shape, dtype=bool) if only is None else ctx.take_a(only)
        if unit != "input-id" and inputs_comparable:
            ids_b = ctx.take_b(self.on(in_b, sb.params))
            ids_a = ctx.take_a(self.on(in_a, sa.params))
            comparable &= ~(np.isfinite(ids_b) & np.isfinite(ids_a) & (ids_b != ids_a))

        # A combination that starts or stops failing (null) cannot be compared by value.
        for i in np.nonzero((fb != fa) & comparable)[0] if only is None else ():
            detail = ("now fails (asv recorded null)" if fa[i] else
                      f"no longer fails (now {'skipped' if math.isnan(va[i]) else 'ok'})")
            flags.append(ctx.flag("failure", i, detail))

        both = np.isfinite(vb) & np.isfinite(va) & comparable
        if unit == "input-id":
            for i in np.nonzero(both & (vb != va))[0]:
                flags.append(ctx.flag("input", i, f"inputs differ (checksum {hex_id(vb[i])} -> "
                                                  f"{hex_id(va[i])}); "
                                                  "this combination is not compared"))
            return flags, unmatched
        return flags + RULES[unit](ctx, vb, va, both), unmatched

    # -- timing: evidence across runs, never within one run

    def baseline(self, ctx: Ctx, vb: np.ndarray) -> tuple[np.ndarray, Callable, Callable]:
        """(baseline, stats(), where(j)): what a time ``vb`` (the run before, aligned as ``ctx``
        aligns) is judged against. Across commits, the recent history of the build: the last
        BASELINE_RUNS runs up to the run before that recorded the same environment (env-id) and
        method; the median run of three or more, else the faster (load only adds time, so one
        busy night neither raises a flag nor hides the next). ``stats()`` gives the baseline
        runs' asv stats (None without), asked for only when there is a suspect; ``where(j)``
        names the run of combination ``j``, "" where it is the run before."""
        pair = ctx.pair
        before_stats = lambda: None if ctx.sb.stats is None else {  # noqa: E731
            k: ctx.take_b(v) for k, v in ctx.sb.stats.items()}
        if pair.across != "commits" or pair.at < 1 or ctx.sb.stats is None:
            return vb, before_stats, lambda j: ""
        env_of = lambda run: ctx.take_b(  # noqa: E731
            self.on(series_of_unit(run, self.units, "env-id"), ctx.sb.params))
        env_b = env_of(pair.before)
        cols, runs = [vb], [(pair.before, ctx.sb)]
        for run in pair.chain[max(0, pair.at - BASELINE_RUNS + 1):pair.at]:
            s = run.series.get(ctx.name)
            if (s is None or s.version != ctx.sa.version
                    or self._method_differs(run, pair.before, ctx.name)):
                continue
            cols.append(np.where(env_of(run) == env_b, ctx.take_b(self.on(s, ctx.sb.params)),
                                 np.nan))
            runs.append((run, s))
        if len(cols) == 1:
            return vb, before_stats, lambda j: ""
        values = np.vstack(cols)
        valid = np.isfinite(values)
        count = valid.sum(axis=0)
        at = np.arange(values.shape[1])
        ranked = np.argsort(np.where(valid, values, np.inf), axis=0, kind="stable")
        pick = ranked[np.where(count >= 3, (count - 1) // 2, 0), at]
        pick[count == 0] = 0

        def stats() -> dict[str, np.ndarray]:
            laid = [{k: ctx.take_b(self.lay(s, (s.stats or {}).get(k), ctx.sb.params))
                     for k in ctx.sb.stats}
                    for _, s in runs]
            return {k: np.vstack([x[k] for x in laid])[pick, at] for k in ctx.sb.stats}

        def where(j: int) -> str:
            if pick[j] == 0:
                return ""
            how = "the median" if count[j] >= 3 else "the faster"
            return f"at {runs[pick[j]][0].commit[:8]}, {how} of {count[j]} runs in this environment"

        return values[pick, at], stats, where

    def lay(self, s: Series, values: np.ndarray | None, params: tuple) -> np.ndarray:
        """An array over ``s``'s combinations (its values, or one of its stats) laid out over
        ``params``: NaN where ``s`` lacks a combination or ``values`` is None."""
        idx = self.index_map(s.params, params)
        if values is None or not np.size(values):
            return np.full(idx.shape, np.nan)
        return np.where(idx >= 0, np.asarray(values, dtype=float)[np.maximum(idx, 0)], np.nan)

    def timing_evidence(self, ctx: Ctx, i: int, slower: bool, within: str, base: float):
        """(direction, evidence in words, the direction's factor first) that makes a suspected
        timing change a flag, or None when it is not one (then counted in a note). ``base`` is
        the baseline the suspect was found against (seconds). In order: across commits, an
        environment (env-id) that did not change says the machine moved, not torch; a
        re-measurement recorded for this pair
        (results/confirm: confirmed or not); across builds, the same difference at the previous
        commit (as before: nothing changed); the change held at the next run, settings unchanged
        (persisted, as the PyTorch HUD's two violations in a row); else pending or transient."""
        pair, params = ctx.pair, self.history.params_dict(ctx.name, ctx.sb.params, ctx.combo(i))
        if pair.across == "commits" and self._env_same(*ctx.ids("env-id", i)):
            # one torch, one library, one setting on both sides: only this machine or this
            # project's code can have moved, and neither is worth an alarm
            self.timing_note(pair.machine,
                             "in one recorded environment (this machine's own variation)")
            return None
        prev = self._same_builds(pair, ctx, i, -1) if pair.across == "envs" else None
        if (prev is not None and not self._beyond(prev[0], slower)
                and self._builds_unchanged(prev, pair, ctx, i)):
            # neither build changed since a commit where they did not differ: a re-measurement
            # now reproduces the machine's load on two builds that bear it unlike, not torch
            self.timing_note(pair.machine, "between two builds that did not change since the "
                                           "commit before, where they did not differ "
                                           "(this machine's conditions)")
            return None
        rec = self.history.confirmations.get(confirmation_key(pair.after.machine, ctx.name,
                                                              params, pair.before, pair.after))
        if rec is not None:
            if self.options.timing == "suspects":
                return None  # judged already: nothing to measure again
            if rec.get("verdict") == "confirmed":
                return confirmed_direction(rec), confirmed_text(rec)
            self.timing_note(pair.machine, "re-measured and not confirmed (noise)")
            return None
        if prev is not None and self._beyond(prev[0], slower):
            self.timing_note(pair.machine,
                             "between two builds as at the commit before (not a change)")
            return None
        direction = "slower" if slower else "faster"
        if self.options.timing == "suspects":
            ratio = self._value(pair.after, ctx, i) / base
            return direction, f"{self._factor(ratio)}, suspected ({within})"
        held = self._held(pair, ctx, i, slower, base)
        if held is None:
            self.timing_note(pair.machine, "suspected at the latest run, not confirmed yet "
                                           "(a re-measurement or the next run decides)")
        elif held is False:
            self.timing_note(pair.machine, "gone at the next run (transient)")
        else:
            ratio = self._value(pair.after, ctx, i) / base
            return direction, f"{self._factor(ratio)}, {held}"
        return None

    def _env_same(self, env_b: float, env_a: float) -> bool:
        """Whether two env-ids record one environment: equal ids, or entries whose every key that
        both record holds one value (a key one side lacks is this project recording more, not the
        environment changing; the method is judged apart)."""
        if not (math.isfinite(env_b) and math.isfinite(env_a)):
            return False
        if env_b == env_a:
            return True
        eb, ea = (self.history.catalog.get("env", e) for e in (env_b, env_a))
        if not isinstance(eb, dict) or not isinstance(ea, dict):
            return False
        if ("env_vars" in eb and "env_vars" in ea
                and (eb["env_vars"] or {}) != (ea["env_vars"] or {})):
            # a variable set on one side only is a setting changed, not a key recorded anew
            return False
        fb, fa = (flatten({k: v for k, v in e.items() if k not in ("method", "env_vars")})
                  for e in (eb, ea))
        return all(fb[k] == fa[k] for k in fb.keys() & fa.keys())

    def _beyond(self, ratio: float, slower: bool) -> bool:
        f = self.options.time_factor
        return not math.isnan(ratio) and ((ratio > f) if slower else (ratio < 1 / f))

    def _value(self, run: Run, ctx: Ctx, i: int, unit: str | None = None) -> float:
        """Combination ``i``'s value in ``run`` (its series ``ctx.name``, or the one of
        ``unit``)."""
        s = run.series.get(ctx.name) if unit is None else series_of_unit(run, self.units, unit)
        if s is None or s.version != ctx.sa.version and unit is None:
            return math.nan
        laid = self.on(s, ctx.sa.params)
        return math.nan if laid is None else float(laid[ctx.ja(i)])

    def _held(self, pair: Pair, ctx: Ctx, i: int, slower: bool, base: float):
        """Persistence: the text of the evidence when the next run (the next commit's, between the
        same builds, for envs) shows the change again with its settings unchanged; False when it
        shows none; None when there is no next run to ask."""
        if pair.across == "envs":
            nxt = self._same_builds(pair, ctx, i, +1)
            if nxt is None:
                return None
            ratio, run, _ = nxt
            return (f"held at the next commit: {self._factor(ratio)} at {run.commit[:8]}"
                    if self._beyond(ratio, slower) else False)
        chain = pair.chain
        at = next((k for k, r in enumerate(chain) if r is pair.after), None)
        if at is None or at + 1 >= len(chain):
            return None
        run = chain[at + 1]
        env_same = self._value(run, ctx, i, "env-id") == self._value(pair.after, ctx, i, "env-id")
        vn = self._value(run, ctx, i)
        if not env_same or not math.isfinite(vn) or self._method_differs(pair.after, run, ctx.name):
            return None
        ratio = vn / base
        return (f"held at the next run: {self._factor(ratio)} at {run.commit[:8]}"
                if self._beyond(ratio, slower) else False)

    def _same_builds(self, pair: Pair, ctx: Ctx, i: int, step: int):
        """(after/before ratio, the after run, the before run) of the same two environments at the
        commit before (``step`` -1) or after (+1) on this hardware, for the combination; None
        where none."""
        runs = [r for r in self.history.runs.get(pair.after.machine, [])
                if hardware_key(r) == hardware_key(pair.after)]
        ranks = sorted({r.rank for r in runs if (r.rank - pair.after.rank) * step > 0},
                       reverse=step < 0)
        for rank in ranks:
            at = {r.env_name: r for r in runs if r.rank == rank}
            b, a = at.get(pair.before.env_name), at.get(pair.after.env_name)
            if b is None or a is None:
                continue
            vb, va = self._value(b, ctx, i), self._value(a, ctx, i)
            if math.isfinite(vb) and math.isfinite(va) and vb > 0:
                return va / vb, a, b
        return None

    def _builds_unchanged(self, prev: tuple, pair: Pair, ctx: Ctx, i: int) -> bool:
        """Whether both builds recorded the environments they had in ``prev`` (_same_builds at the
        commit before): env-ids alike, side by side."""
        _, a, b = prev
        return all(self._env_same(self._value(old, ctx, i, "env-id"),
                                  self._value(new, ctx, i, "env-id"))
                   for old, new in ((b, pair.before), (a, pair.after)))

    @staticmethod
    def _factor(ratio: float) -> str:
        return f"{ratio:.3g}x slower" if ratio >= 1 else f"{1 / ratio:.3g}x faster"

    def _method_differs(self, b: Run, a: Run, name: str) -> bool:
        key = series.method_key(name)
        return key is not None and (b.method or {}).get(key) != (a.method or {}).get(key)

    def timing_note(self, machine: str, why: str) -> None:
        self._timing_counts[(machine, why)] = self._timing_counts.get((machine, why), 0) + 1

    def timing_notes(self) -> list[str]:
        return [f"{m}: {n} timing difference{'s' * (n != 1)} {why}"
                for (m, why), n in self._timing_counts.items()]

    # -- the measuring method (core/series.py)

    def method_changed(self, pair: Pair, B: Run, A: Run, name: str) -> bool:
        """Whether ``name`` was measured by another method in ``B`` than in ``A``: then it is not
        compared, and one note per machine and change says so. A run whose method is unknown
        is compared as before, with one note per machine."""
        key = series.method_key(name)
        if key is None:
            return False
        vb, va = ((r.method or {}).get(key) for r in (B, A))
        if vb is None or va is None:
            unknown = [r.commit[:8] for r in (B, A) if (r.method or {}).get(key) is None]
            self._method_notes.setdefault((pair.machine, "unknown"), (
                f"{pair.machine}: the measuring method of the results at "
                f"{', '.join(dict.fromkeys(unknown))} is not recorded and git does not know "
                "their commit; they are compared as before"))
            return False
        if vb == va:
            return False
        what = "; ".join(w for s, v, _, w in series.METHOD_CHANGES
                         if s == key and min(vb, va) < v <= max(vb, va))
        self._method_notes.setdefault((pair.machine, key, vb, va), (
            f"{pair.machine}: {key}: method {vb} -> {va} between {B.commit[:8]} and {A.commit[:8]}"
            + (f" ({what})" if what else "")))
        return True

    def digest_notes(self) -> list[str]:
        """One note for every result without an output digest (recorded before it was)."""
        found = list(self._no_digest)
        if not found:
            return []
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        return [f"output bits: the results at {found[0][:8]}{more} record no digest (bits-id); "
                "their bits are judged through kernels, orders and drifts, as before"]

    def method_notes(self) -> list[str]:
        return list(self._method_notes.values())

    def _code_note(self, pair: Pair, name: str, sb: Series, sa: Series) -> None:
        """asv's version of a benchmark (a hash of its code, or a name it was given) moved: the
        series is not compared across it, and one note per machine and change says so."""
        # hashes cut, names whole
        short = lambda v: ("none" if v is None  # noqa: E731
                           else v[:12] if all(c in "0123456789abcdef" for c in v) else v)
        self._method_notes.setdefault((pair.machine, name, sb.version, sa.version), (
            f"{pair.machine}: {bench_name(name)}: benchmark code changed between "
            f"{pair.before.commit[:8]} and {pair.after.commit[:8]} "
            f"(asv version {short(sb.version)} -> {short(sa.version)})"))

    # -- attribution

    def attribution(self, pair: Pair, env_b: float, env_a: float) -> list[str]:
        """What differs in the environment: dotted keys of the env-id catalog entries."""
        if math.isfinite(env_b) and math.isfinite(env_a):
            key = (env_b, env_a)
            if key not in self._attrib:
                if env_b == env_a:
                    self._attrib[key] = []
                else:
                    eb = self.history.catalog.get("env", env_b)
                    ea = self.history.catalog.get("env", env_a)
                    if eb is None or ea is None:
                        self._attrib[key] = [f"env-id {hex_id(env_b)} -> {hex_id(env_a)} "
                                             "(catalog entry missing)"]
                    else:  # the method is judged on its own (method_changed), not attributed
                        self._attrib[key] = diff_entries(
                            *({k: v for k, v in e.items() if k != "method"}
                              if isinstance(e, dict) else e for e in (eb, ea)))
            return self._attrib[key]
        # No env-id recorded: fall back on asv's own environment params (python, matrix).
        return diff_entries(_asv_env(pair.before), _asv_env(pair.after))


def _asv_env(run: Run) -> dict:
    # Machine keys are the same on both sides of a pair; the rest is the environment.
    skip = {"machine", "os", "ram", *hardware.HARDWARE_PARAMS}
    return {k: v for k, v in run.env_params.items() if k not in skip}
