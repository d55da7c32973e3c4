"""Which torch build changed one product's bits, and what in it changed.

``plan`` checks the product as explain does (its case, slices, device and memory) before any
install, and names it as probes/buildpoint.py takes it. ``run`` measures builds (builds.py:
each in its own environment, a fresh process each) in the order ``search`` asks for them:
the range's two ends, then bisection on the output bits' id (bits_id) against the start's,
a build that cannot be installed, imported or measured skipped as ``git bisect skip`` does.
A step measures the digests alone (buildpoint's ``detail`` off); the two builds either side of
the change are measured again in full (kernels, order), and their bits must agree with the
step's. With ``every`` it measures each build in full, in turn. Every answer is kept in a state file
under the cache folder as it comes, so an interrupted run goes on where it stopped
(``resume``). ``render`` puts the report in words.

The report's schema is SCHEMA; its keys are those ``run`` returns. Durations in seconds;
error_u in u of the output dtype.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from tabulate import tabulate

from matmul_drift.core import ids
from matmul_drift.jobs import builds
from matmul_drift.store import atomic

SCHEMA = "matmul-drift-bisect/1"
UNBISECTABLE = (
    ". No build changed between them, or a change came and went: a history that changes and "
    "changes back cannot be bisected; --all measures every build"
)
LIBS = (("onednn", "oneDNN"), ("mkl", "MKL"), ("cuda", "CUDA"), ("cublas", "cuBLAS"))


class Unfinished(Exception):
    """An interrupted bisection of the same question is kept at ``path``, with ``count``
    builds measured; ``resume`` goes on with it."""

    def __init__(self, path: Path, count: int):
        self.path, self.count = path, count
        super().__init__(
            f"an interrupted bisection of this product over these builds is kept in {path} "
            f"({count} build{'s' * (count != 1)} measured)"
        )


def plan(req) -> dict:
    """The product of explain's Request ``req`` as buildpoint takes it, after explain's own
    checks (its case, slices, device, and memory: refused before any install, as explain
    refuses it)."""
    # here: the checks ask torch, and the parser of every command imports this
    from matmul_drift.probes import explain_run

    ready = explain_run.prepare(req)
    case = {"case": req.case} if req.case is not None else {"m": req.m, "k": req.k, "n": req.n}
    return {
        **case,
        "dtype": req.dtype,
        "device": req.device,
        "slice_n": list(ready.slice_n) if ready.slice_n else None,
        "slice_m": list(ready.slice_m) if ready.slice_m else None,
        "orders": True,
    }


def search(n: int, digest) -> dict:
    """Bisection over builds 0..n-1 on ``digest(i)`` (a string, or None where build i cannot be
    measured: skipped). The ends move inward past skipped builds. Returns ``start`` and ``end``
    (the indices measured as the ends; None where fewer than two builds measure), ``agree``
    (the ends gave the same digest), and where they did not, ``before`` and ``after``: the
    last build found with the start's digest and the first found without it, adjacent but
    for the skipped builds between them."""
    start = next((i for i in range(n) if digest(i) is not None), None)
    end = (
        next((i for i in range(n - 1, start, -1) if digest(i) is not None), None)
        if start is not None
        else None
    )
    if end is None:
        return {"start": start, "end": None, "agree": None}
    first = digest(start)
    if digest(end) == first:
        return {"start": start, "end": end, "agree": True}
    lo, hi, skipped = start, end, set()
    while True:
        inner = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inner:
            return {"start": start, "end": end, "agree": False, "before": lo, "after": hi}
        mid = min(inner, key=lambda i: (abs(i - (lo + hi) // 2), i))
        d = digest(mid)
        if d is None:
            skipped.add(mid)
        elif d == first:
            lo = mid
        else:
            hi = mid


def expected(n: int) -> int:
    """Builds a bisection of ``n`` measures where none is skipped: both ends, then log2."""
    return 2 + max(0, (n - 2).bit_length())


def state_path(
    cache: Path, product: dict, versions: list[str], find_links: Path | None, every: bool
) -> Path:
    """The state file of one question: the product, the builds, where they come from, the mode."""
    question = {
        "product": product,
        "builds": versions,
        "every": every,
        "source": str(find_links.resolve()) if find_links is not None else "index",
    }
    return cache / "bisections" / f"{ids.hex_id(ids.object_id(question))}.json"


def _load(path: Path, resume: bool) -> dict:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = None
    if state is not None and not state.get("done") and not resume and state.get("points"):
        raise Unfinished(path, len(state["points"]))
    return state if resume and state is not None else {"points": {}, "done": False}


def run(
    product: dict,
    versions: list[str],
    cache: Path,
    *,
    find_links: Path | None = None,
    repo: Path | None = None,
    every: bool = False,
    resume: bool = False,
    log=lambda _: None,
    free: int | None = None,
) -> dict:
    """Measure ``versions`` (oldest first) for ``product`` (``plan``), bisecting unless
    ``every``; see the module docstring. ``log(line)`` shows progress; ``free``: the free
    bytes the install check takes instead of the file system's. space.NoSpace stops the run
    before the install it refuses (what was measured is kept); Unfinished before anything is
    measured. ``resume`` with no state of this question starts afresh."""
    t0 = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    path = state_path(cache, product, versions, find_links, every)
    state = _load(path, resume)
    points, order, installs = state["points"], [], {}
    log(
        f"{len(versions)} builds from {builds.source_name(find_links)}: {', '.join(versions)}"
        + ("" if every else f"; bisecting: about {expected(len(versions))} builds to measure")
    )
    if resume:
        log(
            f"resuming {path}: {len(points)} builds measured before"
            if points
            else f"nothing to resume in {path}: starting afresh"
        )
    code = builds.code_path(cache)

    def measure(v: str, detail: bool) -> dict:
        t = time.monotonic()
        try:
            env = builds.environment(v, cache, find_links, repo, log, free)
            installs.setdefault(v, env.how)
            got = builds.measure(env, {**product, "detail": detail}, code)
            got.update(
                seconds=time.monotonic() - t, environment=env.how, install_seconds=env.seconds
            )
        except builds.Failed as exc:
            got = {"failed": exc.stage, "why": str(exc)}
        return got

    def digest(i: int) -> str | None:
        v = versions[i]
        if v not in order:
            order.append(v)
        if v not in points:
            of = len(versions) if every else f"about {expected(len(versions))}"
            log(f"torch {v} (build {len(order)} of {of})")
            got = points[v] = measure(v, every)
            atomic.write_text(path, json.dumps({"schema": SCHEMA, **state}, indent=1))
            log(
                f"torch {v}: "
                + (
                    f"{got['failed']} failed: {got['why']}"
                    if "failed" in got
                    else f"bits {got['bits_id']} in {got['seconds']:.0f} s ({got['environment']})"
                )
            )
        return points[v].get("bits_id")

    if every:
        for i in range(len(versions)):
            digest(i)
        found = _every(versions, points)
    else:
        found = search(len(versions), digest)
    for side in ("before", "after") if found.get("before") is not None else ():
        v = versions[found[side]]
        if not points[v].get("detail"):  # the pair in full: kernels, order, each call's drift
            log(f"torch {v}: measuring the kernels and the order ({side} the change)")
            got = measure(v, True)
            if got.get("bits_id", points[v]["bits_id"]) != points[v]["bits_id"]:
                got["unsteady"] = (
                    f"gave bits {points[v]['bits_id']}, then {got['bits_id']} when measured again"
                )
            points[v] = got if "bits_id" in got else {**points[v], "detail_failed": got["why"]}
            atomic.write_text(path, json.dumps({"schema": SCHEMA, **state}, indent=1))
    state["done"] = True
    atomic.write_text(path, json.dumps({"schema": SCHEMA, **state}, indent=1))
    return _report(
        product,
        versions,
        points,
        order,
        installs,
        found,
        every,
        find_links,
        path,
        time.monotonic() - t0,
    )


def _every(versions: list[str], points: dict) -> dict:
    """--all's verdict: each measured build against the first measured, and the changes
    between neighbouring measured builds."""
    ok = [i for i, v in enumerate(versions) if "bits_id" in points[v]]
    if len(ok) < 2:
        return {"start": ok[0] if ok else None, "end": None, "agree": None}
    steps = [
        (a, b)
        for a, b in zip(ok, ok[1:])
        if points[versions[a]]["bits_id"] != points[versions[b]]["bits_id"]
    ]
    out = {
        "start": ok[0],
        "end": ok[-1],
        "agree": not steps,
        "changes": [{"before": versions[a], "after": versions[b]} for a, b in steps],
    }
    if steps:
        out.update(before=steps[0][0], after=steps[0][1])
    return out


def _report(
    product, versions, points, order, installs, found, every, find_links, path, seconds
) -> dict:
    name = {
        k: versions[v] if isinstance(v, int) else v
        for k, v in found.items()
        if k in ("start", "end")
    }
    if found["agree"] is None:
        kind = "not measurable"
    elif found.get("before") is not None:
        kind = "changed"
    else:
        kind = "no change"
    out = {
        "schema": SCHEMA,
        "product": product,
        "mode": "all" if every else "bisect",
        "source": builds.source_name(find_links),
        "builds": versions,
        "measured": order,
        "installed": sorted(v for v, how in installs.items() if how == "installed"),
        "points": {v: points[v] for v in order},
        "skipped": [
            {"build": v, "stage": points[v]["failed"], "why": points[v]["why"]}
            for v in order
            if "failed" in points[v]
        ],
        "verdict": {"kind": kind, **name, "ends_agree": found["agree"]},
        "state": str(path),
        "seconds": seconds,
    }
    if every:
        out["verdict"]["changes"] = found.get("changes", [])
    if kind == "changed":
        before, after = versions[found["before"]], versions[found["after"]]
        lo, hi = versions.index(before), versions.index(after)
        out["verdict"].update(
            first_changed=after, before=before, skipped_between=[v for v in versions[lo + 1 : hi]]
        )
        out["pair"] = {
            "before": before,
            "after": after,
            "differs": differs(points[before], points[after]),
            "repro": {
                v: repro(product, v, find_links, points[v].get("env_vars") or {})
                for v in (before, after)
            },
        }
    return out


def differs(a: dict, b: dict) -> list[str]:
    """What differs between two builds' answers, by name: bits, kernels, order, error, each
    library, the settings."""
    out = [
        what
        for what, key in (("bits", "bits_id"), ("kernels", "kernel_id"), ("error_u", "error_u"))
        if a.get(key) != b.get(key)
    ]
    if (a.get("order") or {}).get("order_id") != (b.get("order") or {}).get("order_id"):
        out.insert(2, "order")
    out += [
        label
        for key, label in LIBS
        if (a.get("libs") or {}).get(key) != (b.get("libs") or {}).get(key)
    ]
    return out + (["torch settings"] if a.get("env_vars") != b.get("env_vars") else [])


def repro(product: dict, version: str, find_links: Path | None, env_vars: dict) -> str:
    """One command measuring ``product`` again under torch ``version``, in the environment where
    matmul-drift is installed, under the route variables the build was measured with."""
    where = f" --find-links {shlex.quote(str(find_links))}" if find_links is not None else ""
    shape = (
        ["--case", product["case"]]
        if product.get("case")
        else ["--m", str(product["m"]), "--k", str(product["k"]), "--n", str(product["n"])]
    )
    for dim in ("n", "m"):
        for size in product.get(f"slice_{dim}") or ():
            shape += [f"--slice-{dim}", str(size)]
    shape += ["--dtype", product["dtype"], "--device", product["device"], "--orders"]
    setting = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(env_vars.items()))
    return (
        f"pip install{where} torch=={shlex.quote(version)} && {setting}matmul-drift explain "
        + " ".join(shlex.quote(x) for x in shape)
    )


def _product_words(p: dict) -> str:
    what = f"--case {p['case']}" if p.get("case") else f"m={p['m']} k={p['k']} n={p['n']}"
    slices = [
        f"slice_{d} {','.join(map(str, p[f'slice_{d}']))}"
        for d in ("n", "m")
        if p.get(f"slice_{d}")
    ]
    return ", ".join([what, *slices, p["dtype"], p["device"]])


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def _side(p: dict) -> dict[str, str]:
    order = p.get("order") or {}
    kern = p.get("kernels") or {}
    out = {
        "torch": p.get("torch", "?"),
        "bits-id": p.get("bits_id", "?"),
        "kernel-id": p.get("kernel_id") or "—",
        "kernels (full)": "\n".join(kern.get("full") or []) or "—",
        "order of entry (0, 0)": (
            f"{order['order_id']}: {order.get('summary')}"
            if order.get("order_id")
            else f"not revealed ({order.get('reason')})"
        ),
        "error_u (u)": _fmt(p.get("error_u")),
    }
    out.update({label: _fmt((p.get("libs") or {}).get(key)) for key, label in LIBS})
    out["settings"] = (
        " ".join(f"{k}={v}" for k, v in sorted((p.get("env_vars") or {}).items())) or "—"
    )
    return out


def render(r: dict) -> str:
    """The report in words: the builds, the verdict, the pair compared and a repro per side;
    with --all, every build's digest as a table."""
    v, every = r["verdict"], r["builds"]
    lines = [
        f"torch {every[0]} .. {every[-1]}: {len(every)} builds from {r['source']} "
        f"({', '.join(every)}); {len(r['measured'])} tried ({len(r['skipped'])} skipped), "
        f"{len(r['installed'])} installed by this run, in {r['seconds']:.0f} s",
        f"product: {_product_words(r['product'])}",
    ]
    for s in r["skipped"]:
        done = {"install": "installed", "import": "imported", "measure": "measured"}.get(
            s["stage"], s["stage"]
        )
        lines.append(f"skipped torch {s['build']}: could not be {done}: {s['why']}")
    if r["mode"] == "all":
        rows = [
            [
                b,
                p.get("bits_id", "—"),
                p.get("kernel_id") or "—",
                (p.get("order") or {}).get("order_id") or "—",
                _fmt(p.get("error_u")),
                "" if "bits_id" in p else f"{p['failed']} failed",
            ]
            for b, p in r["points"].items()
        ]
        lines += [
            "",
            tabulate(
                rows, headers=["torch", "bits-id", "kernel-id", "order-id", "error_u (u)", ""]
            ),
        ]
    lines.append("")
    if v["kind"] == "not measurable":
        lines.append("fewer than two builds could be measured: nothing to compare")
    elif v["kind"] == "no change":
        lines.append(
            f"the ends agree: torch {v['start']} and {v['end']} give the same bits"
            + ("; every build measured gives them" if r["mode"] == "all" else UNBISECTABLE)
        )
    else:
        skipped = v.get("skipped_between") or []
        head = (
            f"first build whose bits differ from torch {v['start']}: {v['first_changed']} "
            f"(the one before: {v['before']})"
            if not skipped
            else f"the bits changed between torch {v['before']} and {v['first_changed']}; "
            f"{', '.join(skipped)} between them could not be measured"
        )
        if r["mode"] == "all" and len(v.get("changes", [])) > 1:
            head += "; further changes: " + ", ".join(
                f"{c['before']} -> {c['after']}" for c in v["changes"][1:]
            )
        lines.append(head)
        pair = r["pair"]
        a, b = _side(r["points"][pair["before"]]), _side(r["points"][pair["after"]])
        lines.append(
            tabulate([[k, a[k], b[k]] for k in a], headers=["", pair["before"], pair["after"]])
        )
        lines.append(f"what differs: {', '.join(pair['differs'])}")
        for side in ("before", "after"):
            p = r["points"][pair[side]]
            if p.get("unsteady"):
                lines.append(
                    f"WARNING: torch {pair[side]} {p['unsteady']}: its bits are not reproducible, "
                    "so the bisection may have been misled"
                )
        for side in ("before", "after"):
            lines.append(f"repro ({side}, torch {pair[side]}): {pair['repro'][pair[side]]}")
    return "\n".join(lines)
