"""`matmul-drift`: run (the main job), explain, scan, summary, nightly, catalog, machine.

Usage errors print one line and exit 2; nothing here prints a traceback for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

# Only the standard library up here: every other import happens inside main's try, where Ctrl-C is one line.

EXIT_USAGE = 2
MAX_FIX_TIMEOUT_S = 10**6  # well below subprocess's limit of 2**31 - 1 ms (about 24.8 days)


class UsageError(Exception):
    """Bad input from the user: one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UsageError(message)


def say_error(prog: str, message) -> None:
    """``prog: error: message`` on stderr, one line whatever the message holds: its control and
    bidi characters (a newline in a file's name) are written as \\uXXXX (render.visible).
    Every subcommand prints its errors here."""
    from .render import visible

    print(f"{prog}: error: {visible(message)}", file=sys.stderr)


def _progress(msg: str) -> None:
    if sys.stderr.isatty():
        print(f"matmul-drift: {msg}", file=sys.stderr, flush=True)


def add_shape_arguments(p: argparse.ArgumentParser) -> None:
    """--m/--k/--n or --case: what explain and order measure."""
    from . import cases
    from .cli_args import positive  # one parser of positive sizes for every subcommand

    p.add_argument("--m", type=positive)
    p.add_argument("--k", type=positive)
    p.add_argument("--n", type=positive)
    p.add_argument("--case", help=f"a catalog case: {', '.join(cases.CASE_IDS)}")


def configure_explain(p: argparse.ArgumentParser) -> None:
    from . import cases
    from .cli_args import positive

    add_shape_arguments(p)
    p.add_argument("--a", type=Path, help="A as .npy or .pt: (M, K) or (K,)")
    p.add_argument("--b", type=Path, help="B as .npy or .pt: (K, N)")
    p.add_argument("--dtype", choices=cases.DTYPES, help="required, except with --render")
    p.add_argument("--device", default="cpu", choices=cases.DEVICES)
    p.add_argument("--slice-n", type=positive, help="compare A @ B[:, :n] with (A @ B)[:, :n]")
    p.add_argument("--slice-m", type=positive, help="compare A[:m] @ B with (A @ B)[:m]")
    p.add_argument("--repeat", type=positive, help="identical calls compared run to run (default 3)")
    p.add_argument("--layout", choices=("as-stored", "contiguous"), default="as-stored",
                   help="--a/--b files: keep the strides they were saved with (a Fortran-order .npy is a "
                        "transposed view; a .pt view keeps its strides and offset), or copy them contiguous")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--try-fixes", action="store_true",
                   help="measure every candidate fix (fixes.py) in a fresh process and say which removes the drift")
    p.add_argument("--fix-timeout", type=positive, default=None, metavar="S",
                   help="with --try-fixes: seconds each candidate's process may take (default 600)")
    p.add_argument("--fix-budget", type=positive, default=None, metavar="S",
                   help="with --try-fixes: start no candidate's process after S seconds of trying "
                        "(the rest are reported as not tried); default: no limit")
    p.add_argument("--orders", action="store_true",
                   help="reveal the summation order of entry (0, 0) of the product and of each slice (matmul-drift order)")
    p.add_argument("--render", type=Path, metavar="JSON",
                   help="print a report saved with --json as text, measuring nothing")
    add_memory_argument(p, "the product")


def add_memory_argument(p: argparse.ArgumentParser, what: str) -> None:
    """--no-host-memory-check, as explain and scan take it."""
    p.add_argument("--no-host-memory-check", action="store_true",
                   help=f"start even when {what} needs more than MemAvailable (a virtual machine whose "
                        "memory grows as it is used reports too little); the GPU's free memory is still checked")


def _load_array(path: Path, host_check: bool = True):
    """A float array from .npy or .pt, as a torch tensor; UsageError if unreadable.
    ``host_check``: refuse a file that must be read whole (legacy .pt) when it exceeds MemAvailable."""
    import warnings

    import numpy as np
    import torch

    from . import bounded

    try:
        try:  # before opening: a FIFO would make np.load or torch.load wait for a writer
            bounded.check_regular(path)
        except bounded.Refused as exc:
            raise UsageError(f"{path}: {exc}") from None
        # Mapped, not read: the memory check comes before a single value is, so a file larger
        # than memory is one line, not an OOM kill (restride copies them after the check).
        if path.suffix == ".npy":
            with warnings.catch_warnings():  # torch warns that the mapping is read-only: it is never written
                warnings.simplefilter("ignore")
                arr = np.load(path, allow_pickle=False, mmap_mode="r")
                if not arr.dtype.isnative:  # torch.from_numpy refuses it: swapped, which reads it whole
                    _check_read_whole(path, host_check, "values in the other byte order, swapped to this machine's,",
                                      "or re-save it in this machine's byte order, which is mapped")
                    arr = arr.astype(arr.dtype.newbyteorder("="))  # order "K": a Fortran array stays one
                t = torch.from_numpy(arr)
        elif path.suffix == ".pt":
            with warnings.catch_warnings():  # torch warns that sparse CSR is beta: the refusal below says enough
                warnings.simplefilter("ignore")
                try:
                    t = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError as exc:  # torch's legacy format cannot be mapped: read it
                    if "_use_new_zipfile_serialization" not in str(exc):
                        raise
                    _check_read_whole(path, host_check, "torch's legacy format,",  # before the product's check
                                      "or re-save it with torch.save's default format, which is mapped")
                    t = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(t, torch.Tensor):
                raise UsageError(f"{path}: expected one tensor, found {type(t).__name__}")
        else:
            raise UsageError(f"{path}: unknown file type (expected .npy or .pt)")
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"cannot read {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if t.is_nested:  # before anything asks its shape: a nested tensor has none
        raise UsageError(f"{path}: a nested tensor; explain measures dense operands")
    if t.layout != torch.strided:  # refused, not densified: torch.sparse's kernels are not the dense GEMM measured here
        raise UsageError(f"{path}: a sparse tensor ({t.layout}); explain measures dense operands (save t.to_dense())")
    if t.is_meta:
        raise UsageError(f"{path}: a meta tensor, shape {tuple(t.shape)} and no values: nothing to measure")
    if not t.is_floating_point():
        raise UsageError(f"{path}: expected a floating-point array, found {t.dtype}")
    return t.detach()  # requires_grad (an nn.Parameter): the values are what is measured


def _check_read_whole(path: Path, host_check: bool, what: str, remedy: str) -> None:
    """UsageError (one line: ``what``, then ``remedy``) when a file read whole is larger than
    memory.check allows."""
    from . import memory

    try:
        memory.check((path.stat().st_size, 0), f"{path}: {what} read whole,", "cpu", host_check)
    except memory.TooLarge as exc:
        raise UsageError(f"{exc}; {remedy}") from None


def _file_case(args):
    """Operands from --a/--b, rounded to --dtype with their layout kept (or made contiguous),
    and an ad-hoc case describing them."""
    import torch

    from . import cases, inputs
    from .measure import Operands, restride, restride_elements, tensor_bits

    a, b = (_load_array(p, not args.no_host_memory_check) for p in (args.a, args.b))
    if a.dim() not in (1, 2) or b.dim() != 2:
        raise UsageError(f"A must be (M, K) or (K,) and B (K, N); got A {tuple(a.shape)} and B {tuple(b.shape)}")
    if a.shape[-1] != b.shape[0]:
        raise UsageError(f"shapes do not match: A {tuple(a.shape)} @ B {tuple(b.shape)} (K {a.shape[-1]} != {b.shape[0]})")
    m = 1 if a.dim() == 1 else a.shape[0]
    empty = [f"{d} = 0" for d, v in (("M", m), ("K", b.shape[0]), ("N", b.shape[1])) if v == 0]
    if empty:
        raise UsageError(f"A {tuple(a.shape)} @ B {tuple(b.shape)} is empty ({', '.join(empty)}): nothing to measure"
                         + (" (with K = 0 every output is exactly 0)" if "K = 0" in empty and len(empty) == 1 else ""))
    dt = getattr(torch, args.dtype)
    for path, t in ((args.a, a), (args.b, b)):
        try:  # one entry: float4_e2m1fn_x2 is a floating-point dtype that torch converts to nothing
            t[(0,) * t.dim()].to(dt)
        except (RuntimeError, NotImplementedError):
            raise UsageError(f"{path}: torch cannot convert {t.dtype} to {args.dtype}") from None
    shape = cases.Shape(m, b.shape[0], b.shape[1])
    case = cases.Case(
        f"files:{_text_name(args.a)}@{_text_name(args.b)}", "mv" if a.dim() == 1 else "mm", shape, shape, layout="strided",
        forms=("as-is", "2d") if a.dim() == 1 else ("as-is",),
    )
    keep = args.layout == "as-stored"
    gaps = sum((restride_elements(t, keep) or t.numel()) - t.numel() for t in (a, b))  # offsets and strides kept
    _check_memory(case, shape, args, gaps * dt.itemsize)  # before the files' values are read
    a_t, b_t = (restride(t, dt, args.device, keep) for t in (a, b))
    rounding = {"a": _rounded_away(a, a_t), "b": _rounded_away(b, b_t)}
    return case, Operands(a_t, b_t, case.op, case.layout), inputs.checksum(tensor_bits(a_t), tensor_bits(b_t)), rounding


def _rounded_away(t, rounded) -> dict:
    """Entries of a file's tensor ``t`` that rounding to the measured dtype made ±inf
    (``to_inf``, finite before) or 0 (``to_zero``, non-zero before): counts. Rounding keeps
    NaN, ±inf and 0, and never makes a value non-zero or finite, so the differences of the
    two tensors' counts are those entries."""
    import torch

    from .reference import all_finite

    if t.dtype.itemsize == 1:  # the float8 kinds: torch counts nothing in them; float32 holds each value
        t = t.float()
    to_inf = 0 if all_finite(rounded) else int(torch.isfinite(t).sum()) - int(torch.isfinite(rounded).sum())
    return {"to_inf": to_inf, "to_zero": int(torch.count_nonzero(t)) - int(torch.count_nonzero(rounded))}


def _render_orders(o: dict) -> str:
    full = o["full"]
    lines = [f"order of entry (0, 0): full product {full['order_id'] or 'not revealed'}"
             + (f": {full['summary']}" if full.get("summary") else f" ({full.get('reason')})")]
    for s in o["slices"]:
        where = f"[:, :{s['size']}]" if s["slice"] == "n" else f"[:{s['size']}]"
        where += " (A 2-D)" if s.get("form") == "2d" else ""
        lines.append(f"  slice {where}: {s['order_id'] or 'not revealed'}; {s['verdict']}")
    return "\n".join(lines)


def _render_saved(path: Path) -> int:
    """The text of an explain report saved with --json (and its fixes, if tried)."""
    from . import bounded, explain, fixfind, render

    try:
        r = json.loads(bounded.read_bytes(path), parse_constant=bounded.no_constant)
        text = explain.render(r) + ("\n" + fixfind.render(r["fixes"]) if r.get("fixes") else "")
        text += "\n" + _render_orders(r["orders"]) if r.get("orders") else ""
        defect = r["verdict"]["kind"] == "defect"
    except (OSError, bounded.Refused) as exc:
        raise UsageError(f"--render {path}: cannot read it: {exc}") from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError, ArithmeticError) as exc:
        raise UsageError(f"--render {path}: not an explain report saved with --json ({type(exc).__name__}: {exc})") from None
    print(render.visible(text, newlines=True))  # a saved file's escape sequences must not reach the terminal
    return 1 if defect else 0


def _text_name(path: Path) -> str:
    """A file's name as text: bytes that are not UTF-8 as \\xNN (Python keeps them as lone
    surrogates, which no JSON reader takes as text)."""
    return os.fsencode(path.name).decode("utf-8", "backslashreplace")


def run_explain(args) -> int:
    from . import cases, explain
    from .measure import Unavailable, check_device, measure, measure_operands

    if args.render is not None:
        given = [f"--{k.replace('_', '-')}" for k in ("case", "m", "k", "n", "a", "b", "dtype", "slice_n", "slice_m",
                                                       "repeat", "json", "try_fixes", "fix_timeout", "fix_budget", "orders")
                 if getattr(args, k) not in (None, False)]
        given += ["--device"] * (args.device != "cpu") + ["--layout"] * (args.layout != "as-stored")
        if given:  # ignored, they would mislead: the report is as it was saved
            raise UsageError(f"--render prints a saved report as text and measures nothing; it takes no {given[0]}")
        return _render_saved(args.render)
    if args.dtype is None:
        raise UsageError("the following arguments are required: --dtype")
    for flag, value in (("--fix-timeout", args.fix_timeout), ("--fix-budget", args.fix_budget)):
        if value is not None and not args.try_fixes:
            raise UsageError(f"{flag} goes with --try-fixes")
    if args.fix_timeout is not None and args.fix_timeout > MAX_FIX_TIMEOUT_S:  # subprocess polls in C-int milliseconds
        raise UsageError(f"--fix-timeout {args.fix_timeout} is beyond {MAX_FIX_TIMEOUT_S} s (about 11.6 days)")
    given = [args.case is not None, any(v is not None for v in (args.m, args.k, args.n)), args.a is not None or args.b is not None]
    if sum(given) != 1:
        raise UsageError("give exactly one of --case ID, --m M --k K --n N, or --a A --b B")
    if given[1] and None in (args.m, args.k, args.n):
        raise UsageError("--m, --k and --n go together")
    if given[2] and (args.a is None or args.b is None):
        raise UsageError("--a and --b go together")
    if given[2] and args.try_fixes:  # before measuring, not after
        raise UsageError("--try-fixes takes --case ID or --m M --k K --n N (inputs the candidates can redraw)")
    if given[2] and args.orders:
        raise UsageError("--orders takes --case ID or --m M --k K --n N (the probe makes its own inputs)")
    try:
        case = cases.get(args.case) if given[0] else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if given[1]:
        case = cases.adhoc(args.m, args.k, args.n)
    if not given[2]:  # before the device: a slice the case lacks says so on a machine without the GPU too
        _check_slices(args, case, case.shape(args.device))
    try:
        check_device(args.device, args.dtype)
    except Unavailable as exc:
        raise UsageError(str(exc)) from None
    if given[2]:
        case, ops, checksum, rounding = _file_case(args)  # memory checked there, before the files are read
        _check_slices(args, case, case.shape(args.device))
    shape = case.shape(args.device)
    if not given[2]:
        _check_memory(case, shape, args)
    if args.orders:  # before measuring, not after: K = 1, or beyond the probe's exact range
        from . import order, order_probe

        try:
            order_probe.target(case, args.dtype, args.device)
        except order.ProbeError as exc:
            raise UsageError(f"--orders: {exc}") from None
    slice_n = (args.slice_n,) if args.slice_n else None
    slice_m = (args.slice_m,) if args.slice_m else None
    repeat = args.repeat
    if given[1] and slice_n is None:
        slice_n = (max(1, shape.n - 1),)  # one column fewer: the seed's question
    if given[1] and slice_m is None and shape.m > 1:
        slice_m = (1,)
    _progress(f"measuring {case.id} in {args.dtype} on {args.device} ...")
    if given[2]:
        m = measure_operands(
            ops, case=case, precision=args.dtype, device=args.device, checksum=checksum,
            slice_n=slice_n or (), slice_m=slice_m or (), repeat=repeat or 3,
        )
    else:
        m = measure(case, args.dtype, args.device, slice_n=slice_n, slice_m=slice_m, repeat=repeat)
    r = explain.report(m, args.slice_n, args.slice_m, layout=m.layout, rounding=rounding if given[2] else None)
    if args.try_fixes:
        r["fixes"] = _try_fixes(args, case, given, slice_n, slice_m, repeat)
    stopped = r.get("fixes", {}).get("stopped")  # a signal while trying fixes: print what there is, at once
    if args.orders and not stopped:
        from . import order_probe

        slices = [("n", s["n"], bool(s["max_ulp"] or s["frac_differ"]), s["form"]) for s in m.slice_n]
        slices += [("m", s["m"], bool(s["max_ulp"] or s["frac_differ"]), "as-is") for s in m.slice_m]
        r["orders"] = order_probe.slice_orders(case, args.dtype, args.device, slices)
    if args.json:
        print(json.dumps(r, indent=2, allow_nan=False))
    else:
        print(explain.render(r))
        if args.try_fixes:
            from . import fixfind

            print(fixfind.render(r["fixes"]))
        if r.get("orders"):
            print(_render_orders(r["orders"]))
    if stopped:
        print(f"matmul-drift explain: {_stopped_line(r['fixes'])}", file=sys.stderr)
        return 128 + signal.Signals[stopped]
    if "failed" in r.get("fixes", {}):  # the measurement above stands; the fixes are missing
        say_error("matmul-drift explain", f"--try-fixes: {r['fixes']['failed']}")
        return 1
    return 1 if r["verdict"]["kind"] == "defect" else 0


def _check_slices(args, case, shape, form: str = "as-is") -> None:
    """UsageError (one line) when --slice-n or --slice-m asks for more than the case has.
    form "2d" (order's --form) makes a 1-D A into one row, which --slice-m can take."""
    if args.slice_n is not None and args.slice_n > shape.n:
        raise UsageError(f"--slice-n {args.slice_n} is larger than N = {shape.n}")
    if args.slice_m is not None:
        if case.op == "mv" and form != "2d":
            raise UsageError("--slice-m needs a 2-D A; this A is 1-D")
        if args.slice_m > shape.m:
            raise UsageError(f"--slice-m {args.slice_m} is larger than M = {shape.m}")


def _check_memory(case, shape, args, extra: int = 0) -> None:
    """UsageError (one line) when measuring the product, and ``extra`` bytes more on its
    device, needs more memory than there is."""
    from . import memory

    batch = shape.batch or 1
    host, device = memory.bytes_needed(shape.m, shape.k, shape.n, args.dtype, args.device, batch, fixes=args.try_fixes)
    need = (host, device + extra) if args.device == "cuda" else (host + extra, device)
    what = (f"the product, {'' if batch == 1 else f'batch={batch} '}m={shape.m} k={shape.k} n={shape.n} in {args.dtype}"
            f"{' with --try-fixes' * args.try_fixes},")
    try:
        memory.check(need, what, args.device, not args.no_host_memory_check)
    except memory.TooLarge as exc:
        raise UsageError(str(exc)) from None


def _try_fixes(args, case, given, slice_n, slice_m, repeat) -> dict:
    from . import fixes, fixfind, interrupt

    spec = {"case": args.case} if given[0] else {"m": args.m, "k": args.k, "n": args.n}
    spec.update(dtype=args.dtype, device=args.device, repeat=repeat or 3,
                slice_n=list(slice_n or case.slice_n), slice_m=list(slice_m or case.slice_m))
    isa = fixes.onednn_isa_in_force() if args.device == "cpu" else None
    if args.device == "cuda":  # the measurement's blocks, cached by torch, back to the GPU for the candidates' processes
        import torch

        torch.cuda.empty_cache()
    # SIGINT or SIGTERM (`timeout` sends its command two: to it, then to its group) ends the
    # process in hand and starts none: the report so far is printed, not lost with the process.
    with _Bar("try-fixes", "process") as bar, interrupt.deferred([], escalate=False) as stopped:
        report = fixfind.try_fixes_many([spec], isa, timeout=args.fix_timeout or fixfind.TIMEOUT_S,
                                        progress=bar.update, budget=args.fix_budget, stopped=stopped)[0]
    return json.loads(json.dumps(report, allow_nan=False))


def _stopped_line(fixes: dict) -> str:
    """What a stopped --try-fixes kept, in one line."""
    rows = [r for r in fixes["candidates"] if r["verdict"] != "not applicable"]
    kept = [r for r in rows if r["verdict"] != "not tried"]
    what = (f"no candidate ({fixes['failed']})" if "failed" in fixes
            else f"{len(kept)} of {len(rows)} candidates measured; the rest say \"not tried\"")
    return f"stopped by {fixes['stopped']} while trying fixes; printed the measurement and {what}"


class _Bar:
    """A tqdm bar on stderr when it is a terminal: update(what runs now, done, total)."""

    def __init__(self, desc: str, unit: str):
        from tqdm import tqdm

        self.bar = tqdm(total=1, desc=desc, unit=unit, file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)

    def update(self, what: str, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.n = done
        self.bar.set_postfix_str(what)  # refreshes

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="matmul-drift", description="Why does torch.matmul drift? Measure, explain and track it.")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    from . import cli_args, cli_nightly, cli_order, cli_run, cli_scan, cli_summary

    cli_run.configure(sub.add_parser("run", help="the main job: every torch build of the matrix, side by side, "
                                                 "with asv on this machine; then the site and what changed"))
    configure_explain(sub.add_parser("explain", help="measure one shape: error, slice drift, kernels, verdict"))

    cli_scan.configure(sub.add_parser("scan", help="vary one dimension: where do the kernels or the drift change?"))
    cli_order.configure(sub.add_parser("order", help="reveal in which order the kernel adds the K products of an entry"))
    cli_summary.configure(sub.add_parser("summary", help="flag kernel, accuracy and timing changes in asv history"))
    cli_nightly.configure(sub.add_parser("nightly", help="one night on one machine (or --merge): asv run, summary, site"))
    cat = sub.add_parser("catalog", help="the kernel names or environment behind an id, as asv shows it")
    cat.add_argument("id", metavar="ID", help="12 hex digits, or the number asv shows (143656636881798.0, 1.9e+12)")
    cat.add_argument("--root", type=cli_args.folder, help="the catalog (default: results/catalog of the checkout)")
    mach = sub.add_parser("machine", help="this hardware's asv machine name, and what it is made of")
    mach.add_argument("--register", action="store_true",
                      help="also record it in ~/.asv-machine.json (as `asv machine --yes` does), for `asv run --machine NAME`")
    return p


def run_catalog(args) -> int:
    """Print every catalog entry the id can name; 2 when none does or one is unreadable."""
    from . import catalog
    from .render import visible

    root = args.root or catalog.default_root()
    if args.root is not None and not args.root.is_dir():  # was "no catalog entry under it has the id"
        raise UsageError(f"--root {args.root}: no such folder")
    try:
        found = catalog.find(root, args.id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not found:
        raise UsageError(f"no catalog entry under {root} has the id {args.id}")
    if len(found) > 1:
        print(f"{args.id} can be any of {len(found)} entries (asv rounded it):")
    broken = []
    for kind, ident in found:
        try:
            entry = catalog.load(root, kind, ident)
        except catalog.MissingEntry as exc:
            broken.append(str(exc))  # the other candidates are still shown
            continue
        print(f"{kind} {catalog.hex_id(ident)} (asv: {float(ident):.1f}, {float(ident):.3g})")
        if kind == "kernels" and isinstance(entry, dict):
            for product, names in entry.items():
                if product != "device":
                    # a hostile entry's escape sequences must not reach the terminal
                    print(f"  {visible(product)} ({visible(entry.get('device', '?'))}):")
                    print("".join(f"    {visible(n)}\n" for n in (names if isinstance(names, list) else [names])), end="")
        elif kind == "orders":  # a tree K deep: json.dumps would recurse
            from . import order

            print(f"  K = {entry['k']}: {order.describe(entry['tree'])}\n  {order.to_json(entry['tree'])}")
        else:
            print("  " + json.dumps(entry, indent=2, sort_keys=True).replace("\n", "\n  "))
    if broken:
        raise UsageError("; ".join(broken))
    return 0


def run_machine(register: bool) -> int:
    """Print this hardware's machine name (stdout) and its fingerprint (stderr)."""
    from . import machine

    fp = machine.fingerprint()
    try:
        print(machine.register(fp) if register else machine.name(fp))
    except machine.NotRegistered as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(fp, indent=2), file=sys.stderr)
    return 0


class OutputError(Exception):
    """Writing stdout failed (a full disk, a reader that left). Not an OSError, so that no
    handler of a subcommand's own files (`except OSError`) takes it for theirs."""


class _Stdout:
    """sys.stdout while main runs: its OSErrors become OutputError; the rest passes through."""

    def __init__(self, stream):
        self.stream = stream

    def __getattr__(self, name):  # isatty, fileno, encoding, ...
        return getattr(self.stream, name)

    def write(self, text):
        try:
            try:
                return self.stream.write(text)
            except UnicodeEncodeError:  # PYTHONIOENCODING=ascii: 'μ' as \u03bc, not a traceback
                enc = self.stream.encoding
                return self.stream.write(text.encode(enc, "backslashreplace").decode(enc))
        except OSError as exc:
            raise OutputError(exc) from None

    def flush(self):
        try:
            self.stream.flush()
        except OSError as exc:
            raise OutputError(exc) from None


def main(argv=None) -> int:
    return guarded(lambda: _main(argv), "matmul-drift")


def guarded(run, prog: str) -> int:
    """``run()``'s exit status, where a stdout that fails is one line on stderr and exit 1, and
    a reader that left (EPIPE) is silence and 141: for every entry point that prints."""
    out = sys.stdout = _Stdout(sys.stdout)
    try:
        try:
            status = run()
        except SystemExit:  # argparse's --help: its text may still be buffered
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, not at the interpreter's exit, where a failure is a traceback
        return status
    except OutputError as exc:
        import errno
        import os

        # Whatever is still buffered goes to /dev/null, not into a second error at exit
        # (https://docs.python.org/3/library/signal.html#note-on-sigpipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.stream.fileno())
        cause = exc.args[0]
        if cause.errno == errno.EPIPE:  # `matmul-drift ... | head`: the reader left; nothing to say
            return 141
        say_error(prog, f"cannot write to stdout: {cause.strerror or cause}")
        return 1
    finally:
        sys.stdout = out.stream


def _main(argv) -> int:
    try:
        parser = build_parser()  # inside: its imports take a while, and Ctrl-C may come then
        args = parser.parse_args(argv)
        if args.command == "explain":
            return run_explain(args)
        if args.command == "run":
            from . import cli_run

            return cli_run.run(args)
        if args.command == "catalog":
            return run_catalog(args)
        if args.command == "machine":
            return run_machine(args.register)
        if args.command == "scan":
            from . import cli_scan

            return cli_scan.run(args)
        if args.command == "order":
            from . import cli_order

            return cli_order.run(args)
        if args.command == "summary":
            from . import cli_summary

            return cli_summary.run(args)
        if args.command == "nightly":
            from . import cli_nightly

            return cli_nightly.run(args)
        parser.print_help()
        return EXIT_USAGE
    except UsageError as exc:
        say_error("matmul-drift", exc)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("matmul-drift: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as exc:  # the estimate ahead of time can err: one line, not a traceback
        from .kernels import ProfilerLost

        if isinstance(exc, ProfilerLost):
            say_error("matmul-drift", exc)
            return 1
        text = str(exc).strip()
        if not (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
                or "can't allocate memory" in text):
            raise
        say_error("matmul-drift", f"out of memory: {text.splitlines()[0] if text else type(exc).__name__}")
        return 1


if __name__ == "__main__":
    # `python -m matmul_drift.cli` (as gpu_check.sh runs it): main from the package's own module,
    # so that the UsageError the subcommands import is the one caught here.
    from matmul_drift.cli import main as package_main

    sys.exit(package_main())
