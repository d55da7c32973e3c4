"""Flags grouped by cause: one incident per thing that changed outside this project between two
runs (docs/summary.md, "Incidents"). Never imports torch.

An incident is the flags of one machine, one axis and one commit whose two sides differ in the
same recorded ways (the env entries' keys: the torch build and its libraries, CUDA and the
driver, a route variable or the thread count, the hardware). It says, in this order, the cause
in one line, the verdict, the cells it touched (case x dtype x device x build, a column per
kind) and one repro per side with that side's settings.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from dataclasses import dataclass, field

from matmul_drift.core.ids import ID_HEX_DIGITS
from matmul_drift.read.flags import Flag, Side, flatten
from matmul_drift.read.rules import repro

# The columns of an incident's table of cells, in the order a user reads them; a kind without
# a column of its own (input, failure, ulp-growth) goes under "other".
COLUMNS = ("bits", "kernel", "order", "accuracy", "invariance", "map", "fix", "nonfinite", "timing",
           "other")
_COLUMN = {"ulp-growth": "invariance", "input": "other", "failure": "other"}

# Recorded library versions (measure/environment.py) by their names for people.
LIBRARIES = {"mkl": "MKL", "onednn": "oneDNN", "cublas": "cuBLAS", "cublaslt": "cuBLASLt",
             "cudnn": "cuDNN", "nccl": "NCCL", "openblas": "OpenBLAS"}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class Incident:
    """One cause and the flags it explains. ``key`` (12 hex digits) names the cause apart from
    the commit, so a nightly can keep one issue per incident while it persists."""

    key: str
    machine: str
    across: str  # commits | envs | machines
    commit: str  # the later side's commit: where the incident happened
    before: Side  # the pair compared (its first flag's)
    after: Side
    cause: str  # one line
    changes: list[str]  # every recorded difference, "key: old -> new"
    flags: list[Flag] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    repros: list[dict] = field(default_factory=list)  # {"side", "torch", "command"}

    def failing(self, fail_on) -> bool:
        return any(f.fails(fail_on) for f in self.flags)

    def verdict(self) -> list[str]:
        return verdict(self.flags)

    def cells(self) -> list[dict]:
        return cells(self.flags)


def group(flags: list[Flag], entry) -> list[Incident]:
    """The incidents of ``flags``, in the order of their first flag. ``entry(env_id)`` gives an
    env catalog entry (a dict) or None."""
    out: dict[tuple, Incident] = {}
    for f in flags:
        changes = list(f.attribution)
        if changes:
            key = (f.machine, f.across, f.after.commit, tuple(changes))
        else:  # nothing recorded differs: each pair stands alone
            key = (f.machine, f.across, f.before.commit, f.before.env, f.after.commit, f.after.env)
        inc = out.get(key)
        if inc is None:
            eb, ea = (entry(e) if math.isfinite(e) else None for e in f.envs)
            cause = (cause_line(changes, eb, ea) if changes
                     else "no recorded difference between the two runs")
            where = f" at {f.after.commit[:8]}" if f.across != "machines" else f" ({f.machine})"
            ident = _key([f.machine, f.across, changes or list(key)])
            inc = out[key] = Incident(ident, f.machine, f.across, f.after.commit, f.before, f.after,
                                      cause + where, changes)
            inc.repros = repros(f, eb, ea)
        inc.flags.append(f)
    for inc in out.values():
        inc.notes = _notes(inc.flags)
    return list(out.values())


def _key(obj) -> str:
    """12 hex digits of the sha256 of ``obj``'s JSON, every character escaped: names from a
    results tree may hold lone surrogates, which UTF-8 cannot encode."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:ID_HEX_DIGITS]


def ordered(incidents: list[Incident], fail_on) -> list[Incident]:
    """Failing incidents first, then the informational; within each, as found."""
    return sorted(incidents, key=lambda i: not i.failing(fail_on))


# ---------------------------------------------------------------------------- the cause


def cause_line(changes: list[str], eb, ea) -> str:
    """What changed, in one line: "threads 2 -> 1 (OMP_NUM_THREADS, MKL_NUM_THREADS)", "torch
    2.13.0+cpu -> 2.14.1+cu130: oneDNN 3.12.0 -> 3.13.0, MKL unchanged". ``changes`` are the
    flags' attribution ("key: old -> new"); ``eb``/``ea`` the two env entries, where known,
    which tell the libraries that did not change."""
    diff = {}
    for item in changes:
        key, _, change = item.partition(": ")
        old, _, new = change.partition(" -> ")
        diff[key] = (old, new)
    parts, used = [], set()

    def take(*keys) -> list[tuple[str, tuple[str, str]]]:
        found = [(k, diff[k]) for k in keys if k in diff]
        used.update(k for k, _ in found)
        return found

    torch = take("torch.version")
    libs = [(k, diff[k]) for k in diff if k.startswith("libs.")]
    used.update(k for k, _ in libs)
    take("torch.cuda_build")
    if torch:
        text = f"torch {torch[0][1][0]} -> {torch[0][1][1]}"
        lib_words = [f"{_lib(k)} {o} -> {n}" for k, (o, n) in libs]
        same = _unchanged_libs(eb, ea, {k for k, _ in libs})
        if same:
            lib_words.append(", ".join(same) + " unchanged")
        parts.append(text + (": " + ", ".join(lib_words) if lib_words else ""))
        take("torch.git")
    else:
        git = take("torch.git")
        if git:
            parts.append(f"torch build {git[0][1][0][:12]} -> {git[0][1][1][:12]}")
        parts += [f"{_lib(k)} {o} -> {n}" for k, (o, n) in libs]
    cuda = [(k, diff[k]) for k in diff if k.startswith("cuda.")]
    used.update(k for k, _ in cuda)
    parts += [f"CUDA {k.split('.', 1)[1].replace('_', ' ')} {o} -> {n}" for k, (o, n) in cuda]
    threads = take("threads")
    thread_vars = [k for k in diff
                   if k.split(".", 1)[-1] in THREAD_VARS and k.startswith("env_vars.")]
    if threads:
        used.update(thread_vars)
        names = ", ".join(k.split(".", 1)[1] for k in thread_vars)
        parts.append(f"threads {threads[0][1][0]} -> {threads[0][1][1]}"
                     + (f" ({names})" if names else ""))
    for k in [k for k in diff if k.startswith("env_vars.") and k not in used]:
        used.add(k)
        parts.append(_variable(k.split(".", 1)[1], *diff[k]))
    for k in [k for k in diff if k.startswith("flags.") and k not in used]:
        used.add(k)
        parts.append(f"torch setting {k.split('.', 1)[1]} {diff[k][0]} -> {diff[k][1]}")
    hardware = [k for k in diff if k.startswith("cpu.") or k.startswith("gpu") or k == "device"]
    if hardware:
        used.update(hardware)
        parts.append("hardware: " + ", ".join(f"{k} {diff[k][0]} -> {diff[k][1]}"
                                               for k in hardware))
    parts += [f"{k} {o} -> {n}" for k, (o, n) in diff.items() if k not in used]
    return "; ".join(parts)


def _lib(key: str) -> str:
    name = key.split(".", 1)[1]
    return LIBRARIES.get(name, name)


def _unchanged_libs(eb, ea, changed: set[str]) -> list[str]:
    """The libraries both entries record at one version."""
    if not isinstance(eb, dict) or not isinstance(ea, dict):
        return []
    fb, fa = flatten(eb.get("libs") or {}, "libs"), flatten(ea.get("libs") or {}, "libs")
    return [_lib(k) for k in sorted(fb.keys() & fa.keys()) if k not in changed and fb[k] == fa[k]]


def _variable(name: str, old: str, new: str) -> str:
    if old == "none":
        return f"{name}={new} set"
    if new == "none":
        return f"{name}={old} unset"
    return f"{name} {old} -> {new}"


# ---------------------------------------------------------------------------- the verdict


def verdict(flags: list[Flag]) -> list[str]:
    """The verdict in phrases, what users live with first: the confirmed speed, the output
    bits, accuracy, invariance, then the routes (kernels, orders, maps, fixes)."""
    out = []
    timing = [f for f in flags if f.kind == "timing"]
    for direction in ("slower", "faster"):
        found = [f for f in timing if f.direction == direction]
        if found:
            out.append(f"{direction} ({_cells_text(found)})")
    bits = [f.bits for f in flags]
    recorded = [b for b in bits if all(math.isfinite(x) for x in b)]
    if any(f.kind == "bits" for f in flags):
        out.append(f"output bits changed ({_cells_text([f for f in flags if f.kind == 'bits'])})")
    elif recorded and len(recorded) == len(bits):
        out.append("output bits unchanged")
    else:
        out.append("output bits not recorded on both sides")
    acc = [f for f in flags if f.kind == "accuracy"]
    worse = [f for f in acc if not f.benign and _ratio(f) >= 1]
    better = [f for f in acc if f not in worse]
    if worse:
        out.append(f"accuracy worse ({_cells_text(worse)}, "
                   f"up to {max(_ratio(f) for f in worse):.3g}x)")
    if better:
        out.append(f"accuracy better ({_cells_text(better)})")
    if not acc:
        out.append("accuracy the same")
    for word in ("lost", "regained"):
        found = [f for f in flags if f.kind == "invariance" and _invariance(f) == word]
        if found:
            out.append(f"invariance {word} ({_cells_text(found)})")
    maps = [f for f in flags if f.kind == "map"]
    if maps:
        out.append(f"invariance map changed ({_cells_text(maps)})")
    nonfinite = [f for f in flags if f.kind == "nonfinite"]
    if nonfinite:
        out.append(f"non-finite outputs changed ({_cells_text(nonfinite)})")
    kernels = [f for f in flags if f.kind == "kernel"]
    renamed = [f for f in kernels if f.benign]
    if len(kernels) > len(renamed):
        out.append(f"kernels changed ({_cells_text([f for f in kernels if not f.benign])})")
    if renamed:
        out.append(f"kernels renamed, same bits ({_cells_text(renamed)})")
    for kind, words in (("order", "summation order changed"), ("fix", "fix verdicts changed"),
                        ("input", "inputs differ"), ("failure", "failures changed")):
        found = [f for f in flags if f.kind == kind]
        if found:
            out.append(f"{words} ({_cells_text(found)})")
    return out


def _ratio(f: Flag) -> float:
    b, a = f.before.value, f.after.value
    if b is None or a is None or not b:
        return math.inf if a else 1.0
    return a / b


def _cells_text(flags: list[Flag]) -> str:
    """'square float32, skinny float16' for up to three cells, else 'N cells'."""
    found = list(dict.fromkeys(_cell_name(f) for f in flags))
    return ", ".join(found) if len(found) <= 3 else f"{len(found)} cells"


def _cell_name(f: Flag) -> str:
    p = f.params
    name = " ".join(p[k] for k in ("case", "dtype") if k in p) or "(all)"
    return name + (f" {p['device']}" if p.get("device") not in (None, "cpu") else "")


# ---------------------------------------------------------------------------- the cells


def _by_cell(flags: list[Flag]) -> dict[tuple, list[Flag]]:
    out: dict[tuple, list[Flag]] = {}
    for f in flags:
        p = f.params
        out.setdefault((p.get("case", ""), p.get("dtype", ""), p.get("device", ""),
                        f.after.torch or f.after.env), []).append(f)
    return out


def cells(flags: list[Flag]) -> list[dict]:
    """One row per cell (case, dtype, device, build: the later side's torch) with a short mark
    per column of COLUMNS that the cell's flags fill ("changed", "same names" ...)."""
    rows = []
    for (case, dtype, device, build), found in _by_cell(flags).items():
        row = {"case": case, "dtype": dtype, "device": device, "build": build}
        for f in found:
            col = _COLUMN.get(f.kind, f.kind)
            row[col] = "; ".join(filter(None, [row.get(col), _mark(f)]))
        if "bits" not in row:
            b = found[0].bits
            row["bits"] = (("same" if b[0] == b[1] else "changed")
                           if all(map(math.isfinite, b)) else "")
        rows.append(row)
    return rows


def _mark(f: Flag) -> str:
    if f.kind == "kernel":
        return "renamed" if f.benign else "changed"
    if f.kind == "accuracy":
        r = _ratio(f)
        return f"{r:.3g}x worse" if r >= 1 else f"{1 / r:.3g}x better"
    if f.kind == "invariance":
        return _invariance(f)
    if f.kind == "ulp-growth":
        return "drift grew"
    if f.kind == "timing":
        return f.detail.split(",", 1)[0]
    if f.kind == "nonfinite":
        return f"{_count(f.before.value)} -> {_count(f.after.value)}"
    if f.kind in ("input", "failure"):
        return f.kind if f.kind == "input" else f.detail
    return "changed"


def _invariance(f: Flag) -> str:
    """"lost" or "regained": an invariance flag's direction, as rules._ulp words its detail."""
    return "lost" if f.detail.startswith("invariance lost") else "regained"


def _count(v) -> str:
    return "n/a" if v is None else f"{v:.0f}"


# ---------------------------------------------------------------------------- repros


def repros(f: Flag, eb, ea) -> list[dict]:
    """One command per side that measures ``f``'s cell again with that side's settings: its
    route variables set, the other side's unset (``env -u``), and the thread count where it
    differs without a variable to say so; with no env entry, the command alone. [] where the
    cell is no case's (rules.repro: a results tree may name anything)."""
    command = repro(f)
    if command is None:
        return []
    vb, va = (_vars(e) for e in (eb, ea))
    tb, ta = (e.get("threads") if isinstance(e, dict) else None for e in (eb, ea))
    out = []
    for side, own, other, threads, other_threads, s in (("before", vb, va, tb, ta, f.before),
                                                        ("after", va, vb, ta, tb, f.after)):
        own = dict(own)
        if (isinstance(threads, int) and threads != other_threads
                and not set(THREAD_VARS) & own.keys()):
            own["OMP_NUM_THREADS"] = str(threads)  # what this side's default gave on its machine
        words = [f"{k}={shlex.quote(v)}" for k, v in sorted(own.items())]
        unset = sorted(k for k in other if k not in own)
        prefix = (["env"] + [f"-u {k}" for k in unset] if unset else []) + words
        out.append({"side": side, "torch": s.torch, "command": " ".join([*prefix, command])})
    return out


def _vars(entry) -> dict[str, str]:
    if not isinstance(entry, dict) or not isinstance(entry.get("env_vars"), dict):
        return {}
    return {str(k): str(v) for k, v in entry["env_vars"].items()
            if str(k).replace("_", "").isalnum()}


def _notes(flags: list[Flag]) -> list[str]:
    renamed = [f for f in flags if f.kind == "kernel" and f.benign]
    return ([f"{len(renamed)} kernel change{'s' * (len(renamed) != 1)} with the same output bits: "
             "renamed, nothing computed changed"] if renamed else [])
