"""Observations in, flags out: what changed between neighbouring runs. Never imports torch.

Two runs are neighbours when they are on one machine and one hardware, and either
- ``commits``: in one environment (asv env name), consecutive in the commit order of
  read/commits.py: asv's revision order where the project's git repository is at hand, else by
  commit date (a combination the earlier run has no value for, failed, skipped or not run,
  is judged against the latest run before it that has one, as asv's graphs step over a
  missing point); or
- ``envs``: at one commit, consecutive by torch version (numeric order; what the earlier
  build has no value for is judged against the latest build before it that has one).
``--base/--head`` instead pairs each environment at base with the same one at head (what base
lacks judged against the runs before it, as on the commits axis), and
``--at`` keeps only the pairs that end at one commit (what one run of the main job found).
Runs of one machine name made on different hardware (asv's cpu, num_cpu, arch, isa and gpu
params differ) are never judged against each other; each place where that happens is
listed in ``different_hardware``. Only ``--across machines`` compares hardwares: the runs of
one commit and one environment on two machines (or hardwares).

Each benchmark series is judged by its asv unit (docs/design.md, "Units and how a change is judged"):

==========  =========================================================================
unit        flag kind and rule
==========  =========================================================================
kernel-id   ``kernel``: the id differs (any change of the ordered kernel list).
ulp         ``invariance``: 0 -> non-zero (lost) or non-zero -> 0 (regained);
            ``ulp-growth`` (informational): non-zero and grew by more than ``ulp_growth``.
u           ``accuracy``: max/min of the two values exceeds ``u_tolerance``, or the value
            crosses the bound (γ_K, or γ_K(TF32)) read from the ``u-bound`` series of the same class.
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

import itertools
import math
import shlex
from dataclasses import dataclass, field

import numpy as np

from matmul_drift.core import cases, mapruns, numerics, series
from matmul_drift.core.errors import UsageError
from matmul_drift.core.ids import hex_id
from matmul_drift.read.history import History, Run, Series, version_key
from matmul_drift.store import machine as hardware

KINDS = ("kernel", "order", "map", "invariance", "accuracy", "nonfinite", "input", "fix", "timing", "ulp-growth",
         "failure")
DEFAULT_FAIL_ON = frozenset({"kernel", "order", "map", "invariance", "accuracy", "nonfinite", "input", "fix"})
ACROSS = ("commits", "envs", "both", "machines")
TIMING = ("evidence", "suspects")
ID_UNITS = ("kernel-id", "env-id", "input-id", "fix-id", "order-id", "map-id")

# Identical kernels on identical inputs give identical bits, so any change of error_u is a
# change of route; the tolerance only keeps tiny reorderings (a different split of one sum,
# which moves the max error by well under 2x) out of the report. A real route change (split-K,
# TF32, a reduced-precision accumulator) moves it by 2x to orders of magnitude.
DEFAULT_U_TOLERANCE = 2.0
DEFAULT_ULP_GROWTH = 2.0
# asv compare's default factor: a 10 % step, and only when the 99 % CIs are apart.
DEFAULT_TIME_FACTOR = 1.1


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
            raise UsageError(f"--across must be one of {', '.join(ACROSS)}, not {self.across!r}")
        if (self.base is None) != (self.head is None):
            raise UsageError("--base and --head go together")
        if self.base is not None and self.across in ("envs", "machines"):
            raise UsageError(f"--base/--head compare two commits; --across {self.across} does not apply")
        if self.at is not None and (self.base is not None or self.across == "machines"):
            raise UsageError("--at goes with neither --base/--head nor --across machines")
        if self.timing not in TIMING:
            raise UsageError(f"--timing must be one of {', '.join(TIMING)}, not {self.timing!r}")
        for name in ("u_tolerance", "ulp_growth", "time_factor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 1):
                raise UsageError(f"--{name.replace('_', '-')} must be a number >= 1, not {v!r}")


@dataclass
class Side:
    """One side of a compared pair. ``value`` is in the benchmark's unit, None if not 'ok'."""

    commit: str
    env: str
    torch: str | None
    date: int  # commit date, ms since the epoch
    value: float | None = None
    status: str = "ok"  # 'ok', 'skipped' (asv NaN), 'failed' (asv null), 'n/a' (code flags)
    id: str | None = None  # 12-hex spelling, for id units
    kernels: object = None  # the kernels catalog entry, for kernel flags


@dataclass
class Flag:
    kind: str
    machine: str
    across: str  # 'commits' or 'envs'
    benchmark: str
    unit: str
    params: dict[str, str]
    before: Side
    after: Side
    detail: str
    attribution: list[str] = field(default_factory=list)


@dataclass
class Pair:
    machine: str
    across: str
    before: Run
    after: Run
    # The runs ``before`` and ``after`` are neighbours in: an environment's by commit order (commits
    # axis, --base/--head) or a commit's by torch version (envs), ``before`` at chain[at]. A
    # combination ``before`` has no value for (failed, skipped, not run) is judged against the
    # latest earlier run that has one, so a failed night between two kernels cannot hide the change.
    chain: list[Run] = field(default_factory=list)
    at: int = -1


@dataclass
class Summary:
    flags: list[Flag]
    pairs: int
    machines: list[str]
    warnings: list[str]
    different_hardware: list[str] = field(default_factory=list)  # neighbouring runs never judged
    method_notes: list[str] = field(default_factory=list)  # series not compared across a method change
    timing_notes: list[str] = field(default_factory=list)  # suspected timing changes without evidence

    def failing(self, fail_on) -> list[Flag]:
        return [f for f in self.flags if f.kind in fail_on]


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
    if alone:  # was "unknown kind 'all'" beside another word
        raise UsageError(f"--fail-on: {alone[0]} stands alone; give it by itself, or a comma list of {', '.join(KINDS)}")
    unknown = [w for w in words if w not in KINDS]
    if unknown or not words:
        raise UsageError(
            f"--fail-on: unknown kind {unknown[0] if unknown else text!r}; "
            f"expected a comma list of {', '.join(KINDS)}, or none, or all"
        )
    return frozenset(words)


# ---------------------------------------------------------------------------- pairing


def resolve_commit(history: History, prefix: str) -> str:
    """The one commit hash in the history that starts with ``prefix``."""
    p = prefix.strip().lower()
    commits = {r.commit for runs in history.runs.values() for r in runs}
    found = sorted(c for c in commits if p and c.lower().startswith(p))
    if not found:
        raise UsageError(f"no results for commit {prefix!r}")
    if len(found) > 1:
        raise UsageError(f"commit {prefix!r} is ambiguous: {', '.join(c[:12] for c in found)}")
    return found[0]


def hardware_key(run: Run) -> tuple:
    """What tells a run's hardware apart (asv's arch, cpu, num_cpu, isa, gpu): runs of one
    machine with different keys are never compared across commits or builds."""
    return tuple(_hardware_value(run.env_params, k) for k in hardware.HARDWARE_PARAMS)


def earlier_runs(runs: list[Run], commit: str) -> tuple[Run | None, Run | None]:
    """Of one machine's ``runs`` (history order), the latest run of an earlier commit than
    ``commit`` on ``commit``'s hardware (what a run of ``commit`` is compared with), and the
    latest run of an earlier commit on any hardware. None where there is none."""
    first = next(r for r in runs if r.commit == commit)
    before = [r for r in runs if r.order_key < first.order_key and r.commit != commit]
    same = [r for r in before if hardware_key(r) == hardware_key(first)]
    return (same[-1] if same else None), (before[-1] if before else None)


def _hardware_value(params: dict, key: str) -> str:
    """One spelling per hardware: no gpu recorded is "none", 2 cpus are "2" (asv writes
    strings); anything else a results file holds (a list) by its repr, which hashes."""
    v = params.get(key)
    if key == "gpu" and v in (None, ""):
        return "none"
    return v if isinstance(v, str) else str(v) if isinstance(v, int) and not isinstance(v, bool) else repr(v)


def _hardware_text(run: Run) -> str:
    p = run.env_params
    gpu = _hardware_value(p, "gpu")
    return ", ".join(str(x) for x in (p.get("cpu"), f"{p.get('num_cpu')} cpus", p.get("arch"),
                                       p.get("isa") and f"isa {p['isa']}", gpu != "none" and f"gpu {gpu}") if x)


def hardware_groups(history: History) -> dict[str, list[Run]]:
    """Runs split by machine and then by hardware (asv's cpu, num_cpu, arch, isa, gpu params),
    each list in history order. A machine whose runs all share one hardware keeps its name;
    otherwise each group is labelled ``machine [hardware]``."""
    out: dict[str, list[Run]] = {}
    for machine, runs in history.runs.items():
        by_hw: dict[tuple, list[Run]] = {}
        for r in runs:
            by_hw.setdefault(hardware_key(r), []).append(r)
        for group in by_hw.values():
            label = base = machine if len(by_hw) == 1 else f"{machine} [{_hardware_text(group[0])}]"
            n = 1
            while label in out:  # two hardwares described alike: each keeps its runs
                n += 1
                label = f"{base} #{n}"
            out[label] = group
    return out


def hardware_changes(history: History) -> list[str]:
    """One line for each place where a machine's runs change hardware: never judged."""
    notes = []
    for machine, runs in history.runs.items():
        for a, b in zip(runs, runs[1:]):
            if hardware_key(a) != hardware_key(b):
                notes.append(f"{machine}: {a.commit[:8]} ({_hardware_text(a)}) and {b.commit[:8]} "
                             f"({_hardware_text(b)}) are different hardware; not compared "
                             "(--across machines compares runs of one commit and torch build on two hardwares)")
    return list(dict.fromkeys(notes))


def make_pairs(history: History, options: Options) -> list[Pair]:
    """The (before, after) runs to compare, per machine and hardware, in history order."""
    pairs: list[Pair] = []
    groups = hardware_groups(history)
    if options.across == "machines":
        by_build: dict[tuple[str, str], list[tuple[str, Run]]] = {}
        for label, runs in sorted(groups.items()):
            for r in runs:
                by_build.setdefault((r.commit, r.env_name), []).append((label, r))
        for found in by_build.values():
            pairs += [Pair(f"{la} vs {lb}", "machines", a, b) for (la, a), (lb, b) in zip(found, found[1:])]
        return pairs

    if options.base is not None:
        base, head = resolve_commit(history, options.base), resolve_commit(history, options.head)
        if base == head:
            raise UsageError("--base and --head name the same commit")
        for machine, runs in groups.items():
            at_base = {r.env_name: r for r in runs if r.commit == base}
            at_head = {r.env_name: r for r in runs if r.commit == head}
            for env in sorted(at_base.keys() ^ at_head.keys()):
                side = "base" if env in at_base else "head"
                history.warnings.append(f"{machine}: environment {env} has results only at {side}; not compared")
            for env in sorted(at_base.keys() & at_head.keys()):
                # What base lacks is judged against the runs before it, as on the commits axis
                # (none when head is the earlier: there is nothing between to step over).
                chain = [r for r in runs if r.env_name == env]
                k = next(i for i, r in enumerate(chain) if r is at_base[env])
                later = at_base[env].order_key < at_head[env].order_key
                pairs.append(Pair(machine, "commits", at_base[env], at_head[env], *((chain, k) if later else ())))
        return pairs

    at = resolve_commit(history, options.at) if options.at is not None else None
    for machine, runs in groups.items():
        if options.across in ("commits", "both"):
            by_env: dict[str, list[Run]] = {}
            for r in runs:  # already in commit order
                by_env.setdefault(r.env_name, []).append(r)
            for env_runs in by_env.values():
                pairs += [Pair(machine, "commits", a, b, env_runs, k) for k, (a, b) in enumerate(zip(env_runs, env_runs[1:]))
                          if at is None or b.commit == at]
        if options.across in ("envs", "both"):
            by_commit: dict[str, list[Run]] = {}
            for r in runs:
                by_commit.setdefault(r.commit, []).append(r)
            for commit, commit_runs in by_commit.items():
                if at is not None and commit != at:
                    continue
                commit_runs.sort(key=lambda r: (version_key(r.torch), r.env_name))
                pairs += [Pair(machine, "envs", a, b, commit_runs, k) for k, (a, b) in enumerate(zip(commit_runs, commit_runs[1:]))]
    return pairs


# ---------------------------------------------------------------------------- judging


def summarise(history: History, options: Options | None = None) -> Summary:
    """Judge every pair of neighbouring runs. Raises UsageError for bad options."""
    options = options or Options()
    options.check()
    pairs = make_pairs(history, options)
    notes = [] if options.across == "machines" else hardware_changes(history)
    judge = _Judge(history, options)
    flags: list[Flag] = []
    with np.errstate(over="ignore"):  # a ratio of extreme values is inf: flagged, not warned about
        for pair in pairs:
            flags += judge.pair(pair)
    order = {k: i for i, k in enumerate(KINDS)}
    rank = {r.commit: r.rank for runs in history.runs.values() for r in runs}
    flags.sort(key=lambda f: (f.machine, order[f.kind], f.benchmark, rank[f.before.commit], rank[f.after.commit],
                              version_key(f.after.torch), f.after.env))
    return Summary(flags, len(pairs), sorted(history.runs), history.warnings, notes, judge.method_notes(),
                   judge.timing_notes())


def _series_of_unit(run: Run, units: dict[str, str], unit: str) -> Series | None:
    for name, s in run.series.items():
        if units.get(name) == unit:
            return s
    return None


class _Judge:
    """Holds the caches (alignments, attributions) shared by all pairs of one summary."""

    def __init__(self, history: History, options: Options):
        self.h = history
        self.o = options
        self.units = history.units()
        self._index_maps: dict[tuple[int, int], tuple] = {}
        self._combos: dict[int, tuple] = {}
        self._attrib: dict[tuple, list[str]] = {}
        self._unknown: set[str] = set()
        self._method_notes: dict[tuple, str] = {}
        self._timing_counts: dict[tuple[str, str], int] = {}
        # error_u and its bound live in one class: "drift.Drift.track_error_u" pairs with
        # "drift.Drift.track_gamma_k_u". With one bound series in all, it serves every class.
        bounds = [n for n, u in self.units.items() if u == "u-bound"]
        self._bound_of = {}
        for n, u in self.units.items():
            if u == "u":
                same = [b for b in bounds if b.rsplit(".", 1)[0] == n.rsplit(".", 1)[0]]
                self._bound_of[n] = same[0] if same else (bounds[0] if len(bounds) == 1 else None)

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
        """An auxiliary series' values laid out over ``params`` (NaN where it lacks a combination)."""
        if aux is None:
            return None
        if aux.params is params:
            return aux.values
        idx = self.index_map(aux.params, params)
        if not aux.values.size:
            return np.full(idx.shape, np.nan)
        return np.where(idx >= 0, aux.values[np.maximum(idx, 0)], np.nan)

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
        flags: list[Flag] = []
        unmatched = 0  # combinations of one run with no counterpart in the other (params changed)
        now_skipped: list[str] = []  # measured before, skipped (NaN) after: never compared, but said
        for name in sorted(B.series.keys() & A.series.keys()):
            unit = self.units.get(name)
            if unit is None:
                if name not in self._unknown:
                    self._unknown.add(name)
                    self.h.warnings.append(f"benchmark {name} is not in benchmarks.json; not judged")
                continue
            sb, sa = B.series[name], A.series[name]
            if sb.version != sa.version:
                self._code_note(pair, name, sb, sa)
                continue
            if not _judged(unit) or self.method_changed(pair, B, A, name):
                continue
            found, n = self.series(pair, name, unit, sb, sa)
            flags += found
            unmatched += n
            now_skipped += self._now_skipped(name, sb, sa)
        where = f"{pair.machine}: {B.commit[:8]} ({B.env_name}) -> {A.commit[:8]} ({A.env_name})"
        if unmatched:  # else a renamed case's flags would vanish without a word
            self.h.warnings.append(f"{where}: the benchmarks' params differ; {unmatched} combinations in one run only, "
                                   "not compared")
        if now_skipped:  # a budget spent, a probe switched off: no flag, yet not without a word
            self.h.warnings.append(f"{where}: {len(now_skipped)} value{'s' * (len(now_skipped) != 1)} measured before "
                                   f"{'are' if len(now_skipped) != 1 else 'is'} skipped now (asv NaN), not compared: "
                                   f"{now_skipped[0]}" + (", ..." if len(now_skipped) > 1 else ""))
        return flags + self.bridge(pair)

    def _now_skipped(self, name: str, sb: Series, sa: Series) -> list[str]:
        """The combinations (``name`` and its params, in words) ``sb`` measured and ``sa`` skipped."""
        ib, ia = self.align(sb, sa)
        vb = sb.values if ib is None else sb.values[ib]
        va, fa = (sa.values, sa.failed) if ia is None else (sa.values[ia], sa.failed[ia])
        combos = self.combos(sa.params)
        return [f"{name}({', '.join(self.h.params_dict(name, sa.params, combos[j if ia is None else int(ia[j])]).values())})"
                for j in np.nonzero(np.isfinite(vb) & np.isnan(va) & ~fa)[0]]

    def bridge(self, pair: Pair) -> list[Flag]:
        """Flags for the combinations that ``pair.after`` measured and ``pair.before`` did not
        (failed, skipped, not run), each judged against the latest earlier run of the chain
        that measured it with the same benchmark code."""
        flags: list[Flag] = []
        A = pair.after
        for name in sorted(A.series) if pair.at > 0 else ():
            unit = self.units.get(name)
            if not _judged(unit):
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
        in_b = _series_of_unit(B, self.units, "input-id")
        in_a = _series_of_unit(A, self.units, "input-id")
        inputs_comparable = in_b is not None and in_a is not None and in_b.version == in_a.version
        ctx = _Ctx(self, pair, name, unit, sb, sa, *self.align(sb, sa))
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
                                                  f"{hex_id(va[i])}); this combination is not compared"))
            return flags, unmatched
        return flags + _RULES[unit](ctx, vb, va, both), unmatched

    # -- timing: evidence across runs, never within one run

    def timing_evidence(self, ctx: _Ctx, i: int, slower: bool, within: str) -> str | None:
        """Why a suspected timing change is a flag (the evidence, in words), or None when it is
        not one (then counted in a note). In order: across commits, an environment (env-id)
        that did not change says the machine moved, not torch; a re-measurement recorded for this pair
        (results/confirm: confirmed or not); across builds, the same difference at the previous
        commit (as before: nothing changed); the change held at the next run, settings unchanged
        (persisted, as the PyTorch HUD's two violations in a row); else pending or transient."""
        pair, params = ctx.pair, self.h.params_dict(ctx.name, ctx.sb.params, ctx.combo(i))
        if pair.across == "commits" and self._env_same(*ctx.ids("env-id", i)):
            # one torch, one library, one setting on both sides: only this machine or this
            # project's code can have moved, and neither is worth an alarm
            self._timing_note(pair.machine, "in one recorded environment (this machine's own variation)")
            return None
        prev = self._same_builds(pair, ctx, i, -1) if pair.across == "envs" else None
        if prev is not None and not self._beyond(prev[0], slower) and self._builds_unchanged(prev, pair, ctx, i):
            # neither build changed since a commit where they did not differ: a re-measurement
            # now reproduces the machine's load on two builds that bear it unlike, not torch
            self._timing_note(pair.machine, "between two builds that did not change since the commit before, "
                                            "where they did not differ (this machine's conditions)")
            return None
        rec = self.h.confirmations.get(confirmation_key(pair.after.machine, ctx.name, params, pair.before, pair.after))
        if rec is not None:
            if self.o.timing == "suspects":
                return None  # judged already: nothing to measure again
            if rec.get("verdict") == "confirmed":
                return confirmed_text(rec)
            self._timing_note(pair.machine, "re-measured and not confirmed (noise)")
            return None
        if prev is not None and self._beyond(prev[0], slower):
            self._timing_note(pair.machine, "between two builds as at the commit before (not a change)")
            return None
        if self.o.timing == "suspects":
            return within
        held = self._held(pair, ctx, i, slower)
        if held is None:
            self._timing_note(pair.machine, "suspected at the latest run, not confirmed yet (a re-measurement or "
                                            "the next run decides)")
        elif held is False:
            self._timing_note(pair.machine, "gone at the next run (transient)")
        else:
            return held
        return None

    def _env_same(self, env_b: float, env_a: float) -> bool:
        """Whether two env-ids record one environment: equal ids, or entries whose every key that
        both record holds one value (a key one side lacks is this project recording more, not the
        environment changing; the method is judged apart)."""
        if not (math.isfinite(env_b) and math.isfinite(env_a)):
            return False
        if env_b == env_a:
            return True
        eb, ea = (self.h.catalog.get("env", e) for e in (env_b, env_a))
        if not isinstance(eb, dict) or not isinstance(ea, dict):
            return False
        if "env_vars" in eb and "env_vars" in ea and (eb["env_vars"] or {}) != (ea["env_vars"] or {}):
            return False  # a variable set on one side only is a setting changed, not a key recorded anew
        fb, fa = (flatten({k: v for k, v in e.items() if k not in ("method", "env_vars")}) for e in (eb, ea))
        return all(fb[k] == fa[k] for k in fb.keys() & fa.keys())

    def _beyond(self, ratio: float, slower: bool) -> bool:
        f = self.o.time_factor
        return not math.isnan(ratio) and ((ratio > f) if slower else (ratio < 1 / f))

    def _value(self, run: Run, ctx: _Ctx, i: int, unit: str | None = None) -> float:
        """Combination ``i``'s value in ``run`` (its series ``ctx.name``, or the one of ``unit``)."""
        s = run.series.get(ctx.name) if unit is None else _series_of_unit(run, self.units, unit)
        if s is None or s.version != ctx.sa.version and unit is None:
            return math.nan
        laid = self.on(s, ctx.sa.params)
        return math.nan if laid is None else float(laid[ctx.ja(i)])

    def _held(self, pair: Pair, ctx: _Ctx, i: int, slower: bool):
        """Persistence: the text of the evidence when the next run (the next commit's, between the
        same builds, for envs) shows the change again with its settings unchanged; False when it
        shows none; None when there is no next run to ask."""
        vb = self._value(pair.before, ctx, i)
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
        ratio = vn / vb
        return (f"held at the next run: {self._factor(ratio)} at {run.commit[:8]}"
                if self._beyond(ratio, slower) else False)

    def _same_builds(self, pair: Pair, ctx: _Ctx, i: int, step: int):
        """(after/before ratio, the after run, the before run) of the same two environments at the
        commit before (``step`` -1) or after (+1) on this hardware, for the combination; None where none."""
        runs = [r for r in self.h.runs.get(pair.after.machine, []) if hardware_key(r) == hardware_key(pair.after)]
        ranks = sorted({r.rank for r in runs if (r.rank - pair.after.rank) * step > 0}, reverse=step < 0)
        for rank in ranks:
            at = {r.env_name: r for r in runs if r.rank == rank}
            b, a = at.get(pair.before.env_name), at.get(pair.after.env_name)
            if b is None or a is None:
                continue
            vb, va = self._value(b, ctx, i), self._value(a, ctx, i)
            if math.isfinite(vb) and math.isfinite(va) and vb > 0:
                return va / vb, a, b
        return None

    def _builds_unchanged(self, prev: tuple, pair: Pair, ctx: _Ctx, i: int) -> bool:
        """Whether both builds recorded the environments they had in ``prev`` (_same_builds at the
        commit before): env-ids alike, side by side."""
        _, a, b = prev
        return all(self._env_same(self._value(old, ctx, i, "env-id"), self._value(new, ctx, i, "env-id"))
                   for old, new in ((b, pair.before), (a, pair.after)))

    @staticmethod
    def _factor(ratio: float) -> str:
        return f"{ratio:.3g}x slower" if ratio >= 1 else f"{1 / ratio:.3g}x faster"

    def _method_differs(self, b: Run, a: Run, name: str) -> bool:
        key = series.method_key(name)
        return key is not None and (b.method or {}).get(key) != (a.method or {}).get(key)

    def _timing_note(self, machine: str, why: str) -> None:
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
                f"{pair.machine}: the measuring method of the results at {', '.join(dict.fromkeys(unknown))} is not "
                "recorded and git does not know their commit; they are compared as before"))
            return False
        if vb == va:
            return False
        what = "; ".join(w for s, v, _, w in series.METHOD_CHANGES if s == key and min(vb, va) < v <= max(vb, va))
        self._method_notes.setdefault((pair.machine, key, vb, va), (
            f"{pair.machine}: {key}: method {vb} -> {va} between {B.commit[:8]} and {A.commit[:8]}"
            + (f" ({what})" if what else "")))
        return True

    def method_notes(self) -> list[str]:
        return list(self._method_notes.values())

    def _code_note(self, pair: Pair, name: str, sb: Series, sa: Series) -> None:
        """asv's version of a benchmark (a hash of its code, or a name it was given) moved: the
        series is not compared across it, and one note per machine and change says so."""
        short = lambda v: "none" if v is None else v[:12] if all(c in "0123456789abcdef" for c in v) else v  # noqa: E731  hashes cut, names whole
        self._method_notes.setdefault((pair.machine, name, sb.version, sa.version), (
            f"{pair.machine}: {_bench_name(name)}: benchmark code changed between {pair.before.commit[:8]} and "
            f"{pair.after.commit[:8]} (asv version {short(sb.version)} -> {short(sa.version)})"))

    # -- attribution

    def attribution(self, pair: Pair, env_b: float, env_a: float) -> list[str]:
        """What differs in the environment: dotted keys of the env-id catalog entries."""
        if math.isfinite(env_b) and math.isfinite(env_a):
            key = (env_b, env_a)
            if key not in self._attrib:
                if env_b == env_a:
                    self._attrib[key] = []
                else:
                    eb = self.h.catalog.get("env", env_b)
                    ea = self.h.catalog.get("env", env_a)
                    if eb is None or ea is None:
                        self._attrib[key] = [f"env-id {hex_id(env_b)} -> {hex_id(env_a)} (catalog entry missing)"]
                    else:  # the method is judged on its own (method_changed), not attributed
                        self._attrib[key] = diff_entries(*({k: v for k, v in e.items() if k != "method"}
                                                           if isinstance(e, dict) else e for e in (eb, ea)))
            return self._attrib[key]
        # No env-id recorded: fall back on asv's own environment params (python, matrix).
        return diff_entries(_asv_env(pair.before), _asv_env(pair.after))


def _asv_env(run: Run) -> dict:
    # Machine keys are the same on both sides of a pair; the rest is the environment.
    skip = {"machine", "os", "ram", *hardware.HARDWARE_PARAMS}
    return {k: v for k, v in run.env_params.items() if k not in skip}


def _side(run: Run, value, status: str = "ok") -> Side:
    return Side(run.commit, run.env_name, run.torch, run.date, value, status)


@dataclass
class _Ctx:
    """One benchmark within one pair: builds flags for the few flagged combinations."""

    judge: _Judge
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
                self.judge.on(_series_of_unit(self.pair.before, units, unit), self.sb.params),
                self.judge.on(_series_of_unit(self.pair.after, units, unit), self.sa.params),
            )
        eb, ea = self._aux[unit]
        return (math.nan if eb is None else float(eb[self.jb(i)]),
                math.nan if ea is None else float(ea[self.ja(i)]))

    @staticmethod
    def value(s: Series, j: int) -> tuple[float | None, str]:
        status = s.status(j)
        return (float(s.values[j]) if status == "ok" else None), status

    def flag(self, kind: str, i: int, detail: str) -> Flag:
        vb, stb = self.value(self.sb, self.jb(i))
        va, sta = self.value(self.sa, self.ja(i))
        before, after = _side(self.pair.before, vb, stb), _side(self.pair.after, va, sta)
        if self.unit in ID_UNITS:
            before.id = None if vb is None else hex_id(vb)
            after.id = None if va is None else hex_id(va)
        params = self.judge.h.params_dict(self.name, self.sb.params, self.combo(i))
        return Flag(kind, self.pair.machine, self.pair.across, self.name, self.unit, params,
                    before, after, detail, self.judge.attribution(self.pair, *self.ids("env-id", i)))


# ---------------------------------------------------------------------------- rules per unit


def _kernel(ctx: _Ctx, vb, va, both) -> list[Flag]:
    flags = []
    cat = ctx.judge.h.catalog
    for i in np.nonzero(both & (vb != va))[0]:
        kb, ka = cat.get("kernels", vb[i]), cat.get("kernels", va[i])
        detail = kernel_detail(vb[i], va[i], kb, ka)
        ob, oa = ctx.ids("order-id", i)
        full_changed = not isinstance(kb, dict) or not isinstance(ka, dict) or kb.get("full") != ka.get("full")
        if full_changed and math.isfinite(ob) and ob == oa:
            entry = cat.get("orders", ob)
            if isinstance(entry, dict) and entry.get("tree") is not None:
                detail += f"; renamed, same order: {describe_order(entry)} (order-id {hex_id(ob)})"
        f = ctx.flag("kernel", i, detail)
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
        fmt = lambda v: "none" if v is None else (", ".join(map(_inline, v)) if isinstance(v, list) else _inline(v))
        lines.append(f"{_inline(key)}: {fmt(old)} -> {fmt(new)}")
    return "\n".join(lines) or f"kernel-id {hex_id(id_b)} -> {hex_id(id_a)}"


def _inline(name) -> str:
    """A name from the catalog on one line of a detail, whose lines a newline separates: its
    own line breaks written as \\uXXXX (the flag's kernels keep the names as they are)."""
    return str(name).replace("\r", "\\u000d").replace("\n", "\\u000a")


def _order(ctx: _Ctx, vb, va, both) -> list[Flag]:
    cat = ctx.judge.h.catalog
    flags = []
    for i in np.nonzero(both & (vb != va))[0]:
        kb, ka = ctx.ids("kernel-id", i)
        same = math.isfinite(kb) and kb == ka
        flags.append(ctx.flag("order", i, order_detail(vb[i], va[i], cat.get("orders", vb[i]),
                                                       cat.get("orders", va[i]), same)))
    return flags


def describe_order(entry) -> str:
    """A catalog orders entry in words (words.describe), "not revealed" for the tree null."""
    from matmul_drift.core.words import describe

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
                f"order of entry (0, 0): another tree, alike in words ({wb}; order-id {hex_id(id_b)} -> {hex_id(id_a)})")
        if eb.get("k") != ea.get("k"):
            text += f"; K {eb.get('k')} -> {ea.get('k')}"
    if not same_kernels:
        return text
    return text + ("; kernel-id unchanged: the probe read the same kernels' order on one side only" if one_side else
                   "; kernel-id unchanged: the same kernels add in another order")


def _fix(ctx: _Ctx, vb, va, both) -> list[Flag]:
    cat = ctx.judge.h.catalog
    return [ctx.flag("fix", i, fix_detail(vb[i], va[i], cat.get("fixes", vb[i]), cat.get("fixes", va[i])))
            for i in np.nonzero(both & (vb != va))[0]]


def fix_detail(id_b: float, id_a: float, fb, fa) -> str:
    """Which candidates started or stopped removing every drift, and how the drifts changed."""
    if not isinstance(fb, dict) or not isinstance(fa, dict):
        return f"fix-id {hex_id(id_b)} -> {hex_id(id_a)} (verdicts not in the catalog)"
    kinds = lambda e: ", ".join(map(_inline, e.get("drifts") or [])) or "none"  # noqa: E731
    works = lambda e: {n for n, v in (e.get("verdicts") or {}).items() if v == "removes"}  # noqa: E731
    lines = [f"drifts: {kinds(fb)} -> {kinds(fa)}"] if fb.get("drifts") != fa.get("drifts") else []
    if fa.get("drifts"):
        if stopped := sorted(works(fb) - works(fa)):
            lines.append("stopped removing the drift: " + "; ".join(
                f"{_inline(n)} (now {_inline((fa.get('verdicts') or {}).get(n, 'not measured'))})" for n in stopped))
        if started := sorted(works(fa) - works(fb)):
            lines.append("started removing the drift: " + "; ".join(map(_inline, started)))
        lines.append("removes it now: " + ("; ".join(map(_inline, sorted(works(fa)))) or "no candidate"))
    return "\n".join(lines) or f"fix-id {hex_id(id_b)} -> {hex_id(id_a)} (verdicts otherwise alike)"


def _map(ctx: _Ctx, vb, va, both) -> list[Flag]:
    cat, pair = ctx.judge.h.catalog, ctx.pair
    where = (f" under torch {pair.after.torch}" if pair.across == "envs" and pair.after.torch else
             f" at {pair.after.commit[:8]}" if pair.across == "commits" else "")
    return [ctx.flag("map", i, map_detail(vb[i], va[i], cat.get("maps", vb[i]), cat.get("maps", va[i]), where))
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
        return f"map-id {hex_id(id_b)} -> {hex_id(id_a)} (maps not in the catalog or unreadable: {why})"
    lines = mapruns.changes(*runs)
    if lines:
        lines[0] += where
    else:
        wb, wa = (str(e.get("words", "")).splitlines() for e in (eb, ea))
        moved = [f"{_inline(b)} -> {_inline(a)}" for b, a in zip(wb, wa) if b != a]
        lines = [f"every M in the same state{where}" + ("; the words changed: " + "; ".join(moved) if moved else
                                                        f" (map-id {hex_id(id_b)} -> {hex_id(id_a)})")]
    pb, pa = (e.get("params") if isinstance(e.get("params"), dict) else {} for e in (eb, ea))
    other = [f"{_inline(k)} {_inline(pb.get(k))} -> {_inline(pa.get(k))}" for k in sorted(pb.keys() | pa.keys())
             if pb.get(k) != pa.get(k)]
    if other:
        lines.append("mapped otherwise: " + "; ".join(other))
    return "\n".join(lines)


def _ulp(ctx: _Ctx, vb, va, both) -> list[Flag]:
    flags = []
    lost = both & (vb == 0) & (va != 0)
    regained = both & (vb != 0) & (va == 0)
    grew = both & (vb > 0) & (va > vb * ctx.judge.o.ulp_growth)
    for i in np.nonzero(lost | regained | grew)[0]:
        change = f"{format_value(vb[i], 'ulp')} -> {format_value(va[i], 'ulp')}"
        if lost[i]:
            flags.append(ctx.flag("invariance", i, f"invariance lost: {change}"))
        elif regained[i]:
            flags.append(ctx.flag("invariance", i, f"invariance regained: {change}"))
        else:
            flags.append(ctx.flag("ulp-growth", i, f"drift grew {va[i] / vb[i]:.3g}x: {change}"))
    return flags


def _accuracy(ctx: _Ctx, vb, va, both) -> list[Flag]:
    tol = ctx.judge.o.u_tolerance
    lo, hi = np.minimum(vb, va), np.maximum(vb, va)
    changed = both & (hi > lo) & (hi > tol * lo)  # lo == 0 < hi counts: any route change from exact
    crossed = np.zeros_like(both)
    gb = ga = None
    bound = ctx.judge._bound_of.get(ctx.name)
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
            g = numerics.bound_name(ctx.judge.h.params_dict(ctx.name, ctx.sb.params, ctx.combo(i)).get("dtype"))
            detail += (f"; now above the {g} bound {format_value(ga[i], 'u')}" if va[i] > ga[i]
                       else f"; back within the {g} bound {format_value(ga[i], 'u')}")
        flags.append(ctx.flag("accuracy", i, detail))
    return flags


def _timing(ctx: _Ctx, vb, va, both) -> list[Flag]:
    """A timing change is first a suspect: beyond the factor, and apart by the 99% CIs where asv
    recorded them (else its IQRs; for a CUDA track, do_bench's 20-80% quantiles). A run whose
    GPU clock fell while timed is not compared (a note). It is flagged only on evidence across
    runs (_Judge.timing_evidence)."""
    f = ctx.judge.o.time_factor
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = va / vb
    big = both & (vb > 0) & ((ratio > f) | (ratio < 1 / f))
    if not big.any():
        return []
    apart = np.ones(big.shape, dtype=bool)  # without stats the ratio alone decides
    how = np.full(big.shape, "no stats", dtype=object)
    if ctx.sb.stats is not None and ctx.sa.stats is not None:
        b = {k: ctx.take_b(v) for k, v in ctx.sb.stats.items()}
        a = {k: ctx.take_a(v) for k, v in ctx.sa.stats.items()}
        # As asv compare: one sample (repeat 1) has no interval, so the factor alone decides.
        judged = (b["repeat"] != 1) & (a["repeat"] != 1)
        how[~judged] = "one sample"
        for lo, hi, label in (("ci_99_a", "ci_99_b", "99% CIs apart"), ("q_25", "q_75", "IQRs apart")):
            have = judged & ~(np.isnan(b[lo]) | np.isnan(b[hi]) | np.isnan(a[lo]) | np.isnan(a[hi]))
            apart[have] = ((b[hi] < a[lo]) | (a[hi] < b[lo]))[have]
            how[have] = label
            judged &= ~have  # the IQR only where there is no CI
    for i in np.nonzero(big & (how == "no stats"))[0]:  # a track (CUDA events): do_bench's quantiles
        (b20, a20), (b80, a80) = ctx.ids("q20-seconds", i), ctx.ids("q80-seconds", i)
        if all(math.isfinite(x) for x in (b20, a20, b80, a80)):
            apart[i], how[i] = (b80 < a20) or (a80 < b20), "20-80% quantiles apart"
    flags = []
    for i in np.nonzero(big & apart)[0]:
        if 1.0 in ctx.ids("clock-fell", i):  # the GPU slowed itself: that run's times say nothing of torch
            ctx.judge._timing_note(ctx.pair.machine, "where the GPU's SM clock fell while timed (not compared)")
            continue
        slower = bool(ratio[i] > 1)
        factor = ratio[i] if slower else 1 / ratio[i]
        detail = (f"{format_value(vb[i], 'seconds')} -> {format_value(va[i], 'seconds')} as recorded "
                  f"({factor:.3g}x {'slower' if slower else 'faster'})")
        evidence = ctx.judge.timing_evidence(ctx, i, slower, how[i])
        if evidence is not None:
            flags.append(ctx.flag("timing", i, f"{detail}; {evidence}"))
    return flags


def _bench_name(name: str) -> str:
    # "drift.Drift.track_error_u" -> "Drift.track_error_u": the module repeats the class.
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else name


def repro(flag: Flag) -> str | None:
    """A command that measures the flag's cell again on the reader's machine, pasteable into a
    shell: `matmul-drift explain --case C --dtype D --device X`. Only from values the case
    catalog knows (a results tree may name anything), each quoted; None otherwise."""
    p = flag.params
    if p.get("case") not in cases.CASE_IDS or p.get("dtype") not in cases.PRECISIONS or p.get("device") not in cases.DEVICES:
        return None
    return "matmul-drift explain " + " ".join(f"--{k} {shlex.quote(p[k])}" for k in ("case", "dtype", "device"))


def confirmation_key(machine: str, benchmark: str, params: dict, before: Run, after: Run) -> tuple:
    """How a re-measurement (results/confirm) names the pair of results it judged."""
    return (machine, benchmark, tuple(sorted(params.items())), before.commit, before.env_name, after.commit,
            after.env_name)


def confirmed_text(rec: dict) -> str:
    """A re-measurement in words: "re-measured 3 times interleaved: 1.92x slower (range 1.85-1.97)"."""
    ratios = [r for r in rec.get("ratios") or [] if isinstance(r, (int, float)) and r > 0]
    if not ratios:
        return f"re-measured: {rec.get('verdict')}"
    x = sorted(r if r >= 1 else 1 / r for r in ratios)
    mid = sorted(ratios)[len(ratios) // 2]
    return (f"re-measured {len(ratios)} time{'s' * (len(ratios) != 1)} interleaved: {x[len(x) // 2]:.3g}x "
            f"{'slower' if mid >= 1 else 'faster'} (range {x[0]:.3g}-{x[-1]:.3g})")


def _count(ctx: _Ctx, vb, va, both) -> list[Flag]:
    return [ctx.flag("nonfinite", i, f"non-finite outputs {vb[i]:.0f} -> {va[i]:.0f}")
            for i in np.nonzero(both & (vb != va))[0]]


_RULES = {"kernel-id": _kernel, "order-id": _order, "fix-id": _fix, "map-id": _map, "ulp": _ulp, "u": _accuracy,
          "seconds": _timing, "count": _count}


def _judged(unit: str | None) -> bool:
    """Whether a series of this unit is compared: env-id and u-bound serve the others, and
    unknown units are not judged."""
    return unit in _RULES or unit == "input-id"


# ---------------------------------------------------------------------------- helpers


def flatten(obj, prefix: str = "") -> dict[str, object]:
    """Nested dicts as {dotted.key: leaf}. None and {} add no key, so "cuda: null" against
    "cuda: {runtime: 13.0}" reads "cuda.runtime: none -> 13.0". A loop, not recursion: a
    catalog entry may nest as deep as json reads."""
    out: dict[str, object] = {}
    stack = [(prefix, obj)] if isinstance(obj, dict) else []
    while stack:
        base, d = stack.pop()
        for k, v in reversed(d.items()):
            key = f"{base}.{k}" if base else str(k)
            if isinstance(v, dict):
                stack.append((key, v))
            elif v is not None:
                out[key] = v
    return out


LEAF_CHARS = 200  # a value is shown up to this many characters, then "…"


def _leaf(v) -> str:
    """A value as text, lists and dicts written out, cut at LEAF_CHARS; a loop, not
    recursion, for values nested as deep as json reads."""
    parts, size, stack = [], 0, [v]
    while stack and size <= LEAF_CHARS:
        x = stack.pop()
        if isinstance(x, _Text):
            text = x.text
        elif isinstance(x, (list, dict)):
            items = list(x.items()) if isinstance(x, dict) else list(enumerate(x))
            stack.append(_Text("}" if isinstance(x, dict) else "]"))
            for i, (k, y) in enumerate(reversed(items)):
                stack.append(y)
                if isinstance(x, dict):
                    stack.append(_Text(f"{k}: "))
                if i < len(items) - 1:
                    stack.append(_Text(", "))
            text = "{" if isinstance(x, dict) else "["
        else:
            text = "none" if x is None else ("true" if x else "false") if isinstance(x, bool) else str(x)
        parts.append(text)
        size += len(text)
    out = "".join(parts)
    return out if not stack and size <= LEAF_CHARS else out[:LEAF_CHARS] + "…"


class _Text:
    """Punctuation on _leaf's stack, apart from the values (a str value is a value)."""

    def __init__(self, text: str):
        self.text = text


def diff_entries(before, after) -> list[str]:
    """["torch.version: 2.13.0+cpu -> 2.14.1+cu130", ...]: the dotted keys whose values differ."""
    fb, fa = flatten(before), flatten(after)
    out = []
    for key in sorted(fb.keys() | fa.keys()):
        vb, va = fb.get(key), fa.get(key)
        if vb != va:
            out.append(f"{key}: {_leaf(vb)} -> {_leaf(va)}")
    return out


def format_value(value: float | None, unit: str) -> str:
    """A value for people: ids in hex, seconds with an SI prefix, u and ulp to 3 digits."""
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if unit in ID_UNITS:
        return hex_id(value)
    if unit == "seconds":
        for scale, suffix in ((1, "s"), (1e-3, "ms"), (1e-6, "μs"), (1e-9, "ns")):
            if abs(value) >= scale or suffix == "ns":
                return f"{value / scale:.3g} {suffix}"
    if unit == "ulp":
        return f"{value:.3g} ulp"
    if unit == "ratio":
        return f"{value:.3g}x"
    if unit == "u":
        return f"{value:.3g} u"
    return f"{value:.4g}"
