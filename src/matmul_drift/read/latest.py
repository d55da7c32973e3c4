"""Which runs to summarise, decided here for every job: each machine's latest commit against
its earlier ones (the main job and its site), or each machine's latest night against the night
before on the same hardware (the nightly and its merge). Dates are ``YYYY-MM-DD`` (UTC)."""

from __future__ import annotations

from datetime import datetime, timezone

from matmul_drift.read import history, pairing, summary


def night_date(ms: int) -> str:
    """The UTC date of asv's ms since the epoch."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d")


def _commits(runs: list[history.Run]) -> list[str]:
    return list(dict.fromkeys(r.commit for r in runs))  # runs are in night (date) order


def night_pair(hist: history.History, machine: str,
               commit: str | None = None) -> tuple[str | None, str] | None:
    """(previous night's commit on the same hardware or None, the night's commit) for
    ``machine``: ``commit``, or its latest night when None. None if the machine has no
    readable results. The summary never compares two hardwares (pairing.hardware_key)."""
    runs = hist.runs.get(machine, [])
    head = commit if commit is not None else runs[-1].commit if runs else None
    if head is None or all(r.commit != head for r in runs):
        return None
    same, _ = pairing.earlier_runs(runs, head)
    return (same.commit if same else None), head


def _one_environment(hist: history.History, machine: str,
                     commits: tuple[str, str]) -> dict[str, str]:
    """Give ``machine``'s nights up to the later of ``commits`` one environment name, so that the
    summary pairs the two nights and judges what the earlier lacks against the nights before it.
    asv names an existing environment after its Python's path, so a fresh venv each night is a
    new environment; a night is compared with the ones before whichever Python each used.
    Returns {commit: its own environment name} for each night relabelled (one run a night)."""
    runs = hist.runs[machine]
    nights = _commits(runs)
    upto = nights[:max(nights.index(c) for c in commits) + 1]
    alone = {c: [r for r in runs if r.commit == c] for c in upto}
    alone = {c: found[0] for c, found in alone.items() if len(found) == 1}
    if not all(c in alone for c in commits):
        return {}  # a night of several environments: paired by name as they are
    before, after = (alone[c].env_name for c in commits)
    label = before if before == after else f"{before} -> {after}"
    own = {c: r.env_name for c, r in alone.items()}
    for r in alone.values():
        r.env_name = label
    return own


def compare(hist: history.History, pairs: dict[str, tuple[str | None, str]]) -> summary.Summary:
    """Each machine's night against its previous night, as one Summary over all of them."""
    flags, npairs, method, incidents, bits = [], 0, [], [], []
    for machine, (prev, head) in sorted(pairs.items()):
        if prev is None:
            continue  # a machine's first night has nothing to compare with
        own = _one_environment(hist, machine, (prev, head))
        # this machine's results alone: its flags (labelled "machine [hardware]" on two), pairs,
        # warnings
        try:
            s = summary.summarise(hist.of(machine), summary.Options(base=prev, head=head))
        finally:
            for r in hist.runs[machine]:
                r.env_name = own.get(r.commit, r.env_name)
        for side in (x for f in s.flags for x in (f.before, f.after)):
            side.env = own.get(side.commit, side.env)  # each night by its own environment
        flags += s.flags
        npairs += s.pairs
        method += s.method_notes
        incidents += s.incidents
        bits += s.bits_notes
    return summary.Summary(flags, npairs, sorted(pairs), list(dict.fromkeys(hist.warnings)),
                           method_notes=method,
                           incidents=incidents, bits_notes=bits)


def failed_in(hist: history.History, machine: str, commit: str) -> list[str]:
    """'benchmark param param ...' for each value asv recorded as failed (null) at ``commit``."""
    return [f"{o.benchmark} {' '.join(o.params.values())}".strip()
            for o in hist.observations(machine) if o.commit == commit and o.status == "failed"]


def night_info(hist: history.History, machine: str, prev: str | None, head: str) -> dict:
    """Plain facts about one machine's night for the summary and the site."""
    run = next(r for r in hist.runs[machine] if r.commit == head)
    before = next((r for r in hist.runs[machine] if r.commit == prev), None)
    # with no previous night on its hardware, the latest earlier night on another, not compared
    other = None if before else pairing.earlier_runs(hist.runs[machine], head)[1]
    return {"machine": machine, "date": night_date(run.date), "commit": head, "torch": run.torch,
            "previous": None if before is None else {"commit": prev,
                                                      "date": night_date(before.date),
                                                     "torch": before.torch},
            "other_hardware": other and {"commit": other.commit, "date": night_date(other.date)},
            "failed": failed_in(hist, machine, head)}


def bridged(n: dict, result: summary.Summary) -> list[dict]:
    """The earlier nights that flags of night ``n`` (night_info) were judged against, as the
    night before had no value there (summary's bridge): {"commit", "date", "flags"}, newest
    first."""
    prev = (n["previous"] or {}).get("commit")
    out: dict[str, dict] = {}
    for f in result.flags:
        # "vm [cpu, ...]" on two hardwares
        mine = f.machine == n["machine"] or f.machine.startswith(f"{n['machine']} [")
        if mine and f.after.commit == n["commit"] and f.before.commit != prev:
            out.setdefault(f.before.commit, {"commit": f.before.commit,
                                             "date": night_date(f.before.date),
                                             "flags": 0})["flags"] += 1
    return sorted(out.values(), key=lambda b: b["date"], reverse=True)


def night_line(n: dict) -> str:
    """One line about a machine's night (a dict of night_info, with "bridged" where
    known) and the one before."""
    prev, other = n["previous"], n.get("other_hardware")
    against = (f"against {prev['date']} ({prev['commit'][:8]}, torch {prev['torch']})" if prev
               else f"the first night on this hardware: nothing to compare with ({other['date']} "
                    f"({other['commit'][:8]}) ran on other hardware)" if other
               else "the first night: nothing to compare with")
    line = f"{n['machine']}: {n['date']} ({n['commit'][:8]}, torch {n['torch']}), {against}"
    if n.get("bridged"):
        earlier = " and ".join(
            f"{b['flags']}{' flag' + 's' * (b['flags'] != 1) if i == 0 else ''} against "
            f"{b['date']} ({b['commit'][:8]})" for i, b in enumerate(n["bridged"]))
        line += f"; {earlier} instead, where {prev['date']} had no value"
    return line


def nights(hist: history.History) -> tuple[dict[str, tuple[str | None, str]], list[dict]]:
    """Every machine's latest night: {machine: (previous commit, commit)} and night_info of each."""
    pairs = {m: p for m in sorted(hist.runs) if (p := night_pair(hist, m)) is not None}
    return pairs, [night_info(hist, m, *p) for m, p in pairs.items()]


def runs(hist: history.History) -> tuple[summary.Summary, list[dict]]:
    """Every machine's latest commit: the Summary of what changed there (--at), and one
    plain dict per machine for the site (machine, commit, line, failed)."""
    flags, pairs, notes, method, runs, incidents, bits = [], 0, [], [], [], [], []
    for name, machine_runs in sorted(hist.runs.items()):
        if not machine_runs:
            continue
        head = machine_runs[-1].commit
        one = hist.of(name)
        s = summary.summarise(one, summary.Options(at=head))
        flags += s.flags
        pairs += s.pairs
        notes += s.different_hardware
        method += s.method_notes
        incidents += s.incidents
        bits += s.bits_notes
        builds = [r.torch or r.env_name for r in machine_runs if r.commit == head]
        same, other = pairing.earlier_runs(machine_runs, head)
        against = (f"against {same.commit[:8]}" if same
                   else f"its first recorded commit on this hardware ({other.commit[:8]} ran on "
                        "other hardware; not compared)" if other else "its first recorded commit")
        runs.append({"machine": name, "commit": head,
                     "line": f"{name}: {head[:8]}, torch {', '.join(builds)}; {against}",
                     "failed": failed_in(one, name, head)})
    return summary.Summary(flags, pairs, sorted(hist.runs), list(dict.fromkeys(hist.warnings)),
                           notes, method,
                           incidents=incidents, bits_notes=bits), runs


def compared(hist: history.History, commit: str) -> str:
    """One line naming the comparisons ``summary --at commit`` makes on this machine."""
    builds, earlier = [], []
    for p in pairing.make_pairs(hist, summary.Options(at=commit)):
        if p.across == "envs":
            builds.append(f"torch {p.before.torch} vs {p.after.torch}")
        else:
            earlier.append(f"torch {p.after.torch} at {p.before.commit[:8]} vs {commit[:8]}")
    parts = builds or ["one torch build only"]
    parts += earlier or ["no earlier commit recorded on this machine"]
    return f"matmul-drift run: compared at {commit[:8]}: {'; '.join(parts)}"
