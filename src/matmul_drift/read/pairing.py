"""Which runs are compared with which. Never imports torch.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from matmul_drift.core.errors import Misuse, Param, UsageError
from matmul_drift.read.history import History, Run, version_key
from matmul_drift.store import machine as hardware

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
    return (v if isinstance(v, str) else str(v) if isinstance(v, int) and not isinstance(v, bool)
            else repr(v))


def _hardware_text(run: Run) -> str:
    p = run.env_params
    gpu = _hardware_value(p, "gpu")
    return ", ".join(str(x) for x in (p.get("cpu"), f"{p.get('num_cpu')} cpus", p.get("arch"),
                                       p.get("isa") and f"isa {p['isa']}",
                                       gpu != "none" and f"gpu {gpu}") if x)


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
                             "(--across machines compares runs of one commit and torch build "
                             "on two hardwares)")
    return list(dict.fromkeys(notes))


def make_pairs(history: History, options) -> list[Pair]:
    """The (before, after) runs to compare, per machine and hardware, in history order, as
    ``options`` (read/summary.py's Options: across, base, head, at) ask."""
    pairs: list[Pair] = []
    groups = hardware_groups(history)
    if options.across == "machines":
        by_build: dict[tuple[str, str], list[tuple[str, Run]]] = {}
        for label, runs in sorted(groups.items()):
            for r in runs:
                by_build.setdefault((r.commit, r.env_name), []).append((label, r))
        for found in by_build.values():
            pairs += [Pair(f"{la} vs {lb}", "machines", a, b)
                      for (la, a), (lb, b) in zip(found, found[1:])]
        return pairs

    if options.base is not None:
        base, head = resolve_commit(history, options.base), resolve_commit(history, options.head)
        if base == head:
            raise Misuse(Param("base"), " and ", Param("head"), " name the same commit")
        for machine, runs in groups.items():
            at_base = {r.env_name: r for r in runs if r.commit == base}
            at_head = {r.env_name: r for r in runs if r.commit == head}
            for env in sorted(at_base.keys() ^ at_head.keys()):
                side = "base" if env in at_base else "head"
                history.warnings.append(f"{machine}: environment {env} has results only at "
                                        f"{side}; not compared")
            for env in sorted(at_base.keys() & at_head.keys()):
                # What base lacks is judged against the runs before it, as on the commits axis
                # (none when head is the earlier: there is nothing between to step over).
                chain = [r for r in runs if r.env_name == env]
                k = next(i for i, r in enumerate(chain) if r is at_base[env])
                later = at_base[env].order_key < at_head[env].order_key
                pairs.append(Pair(machine, "commits", at_base[env], at_head[env],
                                  *((chain, k) if later else ())))
        return pairs

    at = resolve_commit(history, options.at) if options.at is not None else None
    for machine, runs in groups.items():
        if options.across in ("commits", "both"):
            by_env: dict[str, list[Run]] = {}
            for r in runs:  # already in commit order
                by_env.setdefault(r.env_name, []).append(r)
            for env_runs in by_env.values():
                pairs += [Pair(machine, "commits", a, b, env_runs, k)
                          for k, (a, b) in enumerate(zip(env_runs, env_runs[1:]))
                          if at is None or b.commit == at]
        if options.across in ("envs", "both"):
            by_commit: dict[str, list[Run]] = {}
            for r in runs:
                by_commit.setdefault(r.commit, []).append(r)
            for commit, commit_runs in by_commit.items():
                if at is not None and commit != at:
                    continue
                commit_runs.sort(key=lambda r: (version_key(r.torch), r.env_name))
                pairs += [Pair(machine, "envs", a, b, commit_runs, k)
                          for k, (a, b) in enumerate(zip(commit_runs, commit_runs[1:]))]
    return pairs
