"""What a judgement gives: a flag, its two sides, the kinds of flag, and the words for values and
for differences between two environment records. Never imports torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from matmul_drift.core.ids import hex_id

KINDS = ("bits", "kernel", "order", "map", "invariance", "accuracy", "nonfinite", "input", "fix",
         "timing", "ulp-growth", "failure")
ID_UNITS = ("bits-id", "kernel-id", "env-id", "input-id", "fix-id", "order-id", "map-id")


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
    # Why a flag of a failing kind does not fail (docs/summary.md, "Severity"): "same output
    # bits" for kernels renamed, "faster", "more accurate", "invariance regained" where the
    # bits' own flag says the numbers changed. Empty: the flag fails when its kind does.
    benign: str = ""
    # The cell's env-ids and output-bits ids on the two sides (NaN: not recorded): the
    # incident's cause, its repros and its bits verdict read them.
    envs: tuple[float, float] = (math.nan, math.nan)
    bits: tuple[float, float] = (math.nan, math.nan)
    # A timing flag's direction against the baseline: "slower" or "faster" ("" otherwise).
    direction: str = ""

    def fails(self, fail_on) -> bool:
        """Whether this flag fails a report that fails on the kinds ``fail_on``."""
        return self.kind in fail_on and not self.benign


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
            text = ("none" if x is None else ("true" if x else "false") if isinstance(x, bool)
                    else str(x))
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
