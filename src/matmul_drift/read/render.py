"""Flags out as text: plain tables, GitHub Markdown, or JSON. Never imports torch.

JSON schema (``--format json``), one document::

    {
      "version": 2,                 # of this schema
      "fail_on": ["accuracy", ...], # kinds that make the exit status 1
      "failing": 2,                 # number of flags that fail (kind in fail_on, not benign)
      "pairs": 14,                  # number of (before, after) run pairs compared
      "machines": ["name", ...],
      "incidents": [                # the flags grouped by cause, failing incidents first
        {
          "key": "0123456789ab",    # names the cause apart from the commit (a nightly's issue)
          "machine": "name",
          "across": "commits",      # as a flag's
          "commit": "<full hash>",  # where it happened: the later side's commit
          "cause": "threads 2 -> 1 (OMP_NUM_THREADS, MKL_NUM_THREADS) at 663e8023",
          "changes": ["threads: 2 -> 1", ...],  # every recorded difference of the two sides
          "failing": true,          # one of its flags fails
          "verdict": ["slower (square float32)", "output bits unchanged", ...],
          "cells": [{"case": "square", "dtype": "float32", "device": "cpu", "build": "2.13.0+cpu",
                     "bits": "same", "kernel": "renamed", "timing": "1.6x slower"}],
                                    # one per cell, a mark per column it fills
          "repros": [{"side": "before", "torch": "2.13.0+cpu", "command": "env -u ... explain ..."},
                     {"side": "after", ...}],   # one per side, with that side's settings
          "notes": ["..."],
          "flags": [0, 3]           # indices into "flags"
        }
      ],
      "flags": [                    # one record per flag, grouped by machine and kind
        {
          "kind": "kernel",         # bits | kernel | order | map | invariance | accuracy |
                                    # nonfinite | input | fix | timing | ulp-growth | failure
          "failing": true,          # kind is in fail_on and the flag is not benign
          "benign": "",             # why a flag of a failing kind does not fail: same output
                                    # bits, faster, more accurate, invariance regained
          "machine": "name",
          "across": "commits",      # commits: same env, neighbouring commits;
                                    # envs: same commit, neighbouring torch versions;
                                    # machines: same commit and env, two hardwares
          "benchmark": "drift.Drift.track_kernel_id",
          "unit": "kernel-id",      # asv unit of the benchmark (seconds, u, ulp, kernel-id, ...)
          "params": {"case": "square", "dtype": "float32", "device": "cpu"},
          "before": {
            "commit": "<full hash>",
            "date": 1767225600000,  # commit date, ms since the epoch
            "env": "<asv env name>",
            "torch": "2.13.0+cpu",  # or null when unknown
            "value": 0.81,          # in the unit; ids as integers; null unless status is ok
            "status": "ok",         # ok | skipped (asv NaN) | failed (asv null) | n/a (code)
            "id": "0123456789ab",   # id units only: the 12-hex catalog id
            "kernels": {...}        # kernel flags only: the kernels catalog entry, or null
          },
          "after": {... as before ...},
          "detail": "full: a, b -> a, c",   # what changed, one line per item
          "attribution": ["torch.version: 2.13.0+cpu -> 2.14.1+cu130"],
                                    # environment keys that differ between the two sides
          "repro": "matmul-drift explain --case square --dtype float32 --device cpu"
                                    # measures the cell again; null where the params are no case's
        }
      ],
      "different_hardware": ["..."] # neighbouring runs of one machine name on two hardwares:
                                    # one line each, never judged
      "method_notes": ["..."]       # series not compared because this project changed how it
                                    # measures them (core/series.py METHOD, or asv's version)
      "timing_notes": ["..."]       # timing differences without evidence across runs, counted
      "bits_notes": ["..."]         # results recorded before the output digest: judged as before
      "warnings": ["..."]           # what was not read or not compared (a corrupt file skipped,
                                    # params that differ, a value skipped now), each once
    }
"""

from __future__ import annotations

import json
import math
import re

from tabulate import tabulate

from matmul_drift.read.flags import ID_UNITS, KINDS, Flag, Side, format_value
from matmul_drift.read.incidents import COLUMNS, Incident, ordered
from matmul_drift.read.rules import repro
from matmul_drift.read.summary import DEFAULT_FAIL_ON, Summary

FORMATS = ("plain", "github", "json")
JSON_SCHEMA_VERSION = 2
HEADERS = ["benchmark", "params", "before", "after", "change", "attribution", "repro"]


def render(summary: Summary, fmt: str = "plain", fail_on=DEFAULT_FAIL_ON) -> str:
    if fmt == "plain":
        return render_plain(summary, fail_on)
    if fmt == "github":
        return render_github(summary, fail_on)
    if fmt == "json":
        return render_json(summary, fail_on)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


# ---------------------------------------------------------------------------- shared


def groups(summary: Summary, fail_on=DEFAULT_FAIL_ON) -> list[tuple[str, str, list[Flag]]]:
    """(machine, kind, flags): the failing kinds first, then the informational ones; within
    each, machines in name order and kinds in KINDS order."""
    out: dict[tuple[str, str], list[Flag]] = {}
    for f in summary.flags:
        out.setdefault((f.machine, f.kind), []).append(f)
    order = {k: i for i, k in enumerate(KINDS)}
    return [(m, k, fl) for (m, k), fl in sorted(out.items(), key=lambda kv: (
        not any(f.fails(fail_on) for f in kv[1]), kv[0][0], order[kv[0][1]]))]


def group_status(flags: list[Flag], fail_on) -> str:
    n = sum(f.fails(fail_on) for f in flags)
    return "failing" if n == len(flags) else "informational" if not n else f"{n} failing"


def notes(summary: Summary) -> list[tuple[str, list[str]]]:
    """(heading, lines) of what was not compared or not flagged, after the flags."""
    return [(h, lines) for h, lines in (
        (f"method changed ({len(summary.method_notes)}, not compared)", summary.method_notes),
        (f"timing differences without evidence ({len(summary.timing_notes)}, not flagged)",
         summary.timing_notes),
        (f"different hardware ({len(summary.different_hardware)}, not compared)",
         summary.different_hardware),
        ("output bits not recorded (judged as before)", summary.bits_notes),
    ) if lines]


def headline(summary: Summary, fail_on) -> str:
    failing = summary.failing(fail_on)
    machines = len(summary.machines)
    where = f"{summary.pairs} comparisons on {machines} machine{'s' if machines != 1 else ''}"
    if not summary.flags:
        return f"no changes flagged in {where}"
    kinds = sorted({f.kind for f in failing}, key=KINDS.index)
    fails = f"{len(failing)} failing ({', '.join(kinds)})" if failing else "none failing"
    n = len(summary.incidents)
    bad = sum(i.failing(fail_on) for i in summary.incidents)
    return (f"{n} incident{'s' * (n != 1)} ({bad} failing): "
            f"{len(summary.flags)} flag{'s' if len(summary.flags) != 1 else ''}, {fails}, "
            f"in {where}")


def incident_title(k: int, inc: Incident, fail_on) -> str:
    return f"incident {k} ({'failing' if inc.failing(fail_on) else 'informational'}): {inc.cause}"


def incident_where(inc: Incident) -> str:
    """The pair compared, on one line."""
    side = lambda s: s.commit[:8] + (f" torch {s.torch}" if s.torch else f" {s.env}")  # noqa: E731
    return f"{inc.machine}, {inc.across}: {side(inc.before)} -> {side(inc.after)}"


def cell_table(inc: Incident) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of an incident's cells: case, dtype, device, build, then only the
    columns some cell fills."""
    rows = inc.cells()
    cols = [c for c in COLUMNS if any(r.get(c) for r in rows)]
    heads = ["case", "dtype", "device", "build", *cols]
    return heads, [[str(r.get(h, "")) for h in heads] for r in rows]


def cells_and_flags(inc: Incident) -> str:
    n, k = len(inc.cells()), len(inc.flags)
    return f"{n} cell{'s' * (n != 1)}, {k} flag{'s' * (k != 1)}"


def repro_label(r: dict) -> str:
    """An incident's repro named by its side and the torch build it needs: "repro before
    (torch 2.13.0+cpu)"."""
    return f"repro {r['side']}" + (f" (torch {r['torch']})" if r.get("torch") else "")


def repro_lines(inc: Incident) -> list[str]:
    return [f"{repro_label(r)}: {r['command']}" for r in inc.repros]


def _short_bench(name: str) -> str:
    # "drift.Drift.track_error_u" -> "Drift.track_error_u": the module repeats the class.
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else name


def _side_text(side: Side, unit: str) -> str:
    where = side.commit[:8] + (f" torch {side.torch}" if side.torch else f" {side.env}")
    if side.status == "n/a":
        return where
    value = format_value(side.value, unit) if side.status == "ok" else side.status
    return f"{where}: {value}"


# Control characters (C0 but newline, C1), the bidirectional controls that reorder what a
# reader sees ("Trojan Source"), and lone surrogates (a JSON "\udcff"), which no UTF-8 output
# can hold, in names that come from results trees: shown as \uXXXX.
_INVISIBLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                        "\u2066-\u2069\ud800-\udfff]")


def visible(text, newlines: bool = False) -> str:
    """``text`` with every control and bidi character written as \\uXXXX (newlines too,
    unless ``newlines``), so a name shows as what it is in any output."""
    out = _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", str(text))
    return out if newlines else out.replace("\n", "\\u000a")


def row(f: Flag) -> list[str]:
    params = " ".join(visible(v) for v in f.params.values()) if f.params else "(all)"
    return [visible(_short_bench(f.benchmark)), params,
            visible(_side_text(f.before, f.unit), newlines=True),
            visible(_side_text(f.after, f.unit), newlines=True), visible(f.detail, newlines=True),
            "\n".join(visible(a) for a in f.attribution), visible(repro(f) or "")]


LINE = 160  # characters a line of the plain or Markdown report shows; the JSON keeps the rest


def cut(text: str, width: int = LINE) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def why(f: Flag) -> str:
    """The attribution on one line, long values (hashes) cut to 12 characters."""
    def short(item: str) -> str:
        key, sep, change = item.partition(": ")
        sides = [s if len(s) <= 24 else s[:12] + "…" for s in change.split(" -> ")]
        return key + sep + " -> ".join(sides)
    return "; ".join(short(a) for a in f.attribution)


def _block(f: Flag) -> list[str]:
    """One flag in a few lines: where, what changed, why, and how to see it again."""
    params = " ".join(f.params.values()) if f.params else "(all)"
    where = lambda s: s.commit[:8] + (f" torch {s.torch}" if s.torch else f" {s.env}")  # noqa: E731
    head = f"{params}: {_short_bench(f.benchmark)}, {where(f.before)} -> {where(f.after)}"
    lines = [cut(visible(head))]
    lines += [cut("  " + visible(d)) for d in f.detail.split("\n")]
    if f.attribution:
        lines.append(cut("  why: " + visible(why(f))))
    command = repro(f)
    if command:
        lines.append("  repro: " + visible(command))
    return lines


# ---------------------------------------------------------------------------- plain


def render_plain(summary: Summary, fail_on=DEFAULT_FAIL_ON) -> str:
    """For a terminal: the failing flags, then the informational ones, then the notes."""
    out = [f"matmul-drift summary: {headline(summary, fail_on)}"]
    for k, inc in enumerate(ordered(summary.incidents, fail_on), 1):
        out += ["", f"== {cut(visible(incident_title(k, inc, fail_on)))} =="]
        out.append(cut(visible(incident_where(inc))))
        out.append(cut(visible("verdict: " + "; ".join(inc.verdict())), 2 * LINE))
        heads, rows = cell_table(inc)
        table = tabulate([[visible(c) for c in r] for r in rows], headers=heads, tablefmt="plain")
        out += ["  " + line for line in table.split("\n")]
        out += [visible(line) for line in repro_lines(inc)]
        out += [cut("note: " + visible(n)) for n in inc.notes]
    if summary.flags:
        out += ["", "== the flags, by machine and kind =="]
    for machine, kind, flags in groups(summary, fail_on):
        out += ["", f"== {visible(machine)}: {kind} ({len(flags)}, "
                    f"{group_status(flags, fail_on)}) =="]
        for f in flags:
            out += _block(f)
    for heading, lines in notes(summary):
        out += ["", f"== {heading} =="]
        out += [visible(n) for n in lines]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------- github


# Markdown that reads as text raw and renders as the same text on GitHub: a backslash before
# each character GFM would read as markup (cells split on "|", emphasis, links, code, HTML,
# strikethrough, math); "_" only where it could open or close emphasis (not inside a word,
# where kernel names have them); "&" as &amp; so that no entity is decoded. Newlines become
# <br>, the one tag we emit. A line GitHub would link (a URL, www., an @mention) becomes a
# code span instead, where nothing is linked.
_MD_SPECIAL = set("\\|`*[]<~$")
_LINKISH = re.compile(r"://|www\.|\.[a-z]{2,}/|@", re.IGNORECASE)


def _md_text(line: str) -> str:
    out = []
    for i, c in enumerate(line):
        if c == "&":
            out.append("&amp;")
        elif c in _MD_SPECIAL or (c in "#>+-" and i == 0):
            # a heading, quote or list at a line's start
            out.append("\\" + c)
        elif c == "_" and not (i > 0 and line[i - 1].isalnum() and i + 1 < len(line)
                               and line[i + 1].isalnum()):
            out.append("\\_")
        else:
            out.append(c)
    return "".join(out)


def md_escape(text: str) -> str:
    """Text safe in a GitHub Markdown table cell, list item or heading; renders as the text
    itself, and reads as it raw."""
    text = visible(str(text).replace("\r\n", "\n").replace("\r", "\n"), newlines=True)
    return "<br>".join(_md_code(line) if _LINKISH.search(line) else _md_text(line)
                       for line in text.split("\n"))


def _md_code(line: str) -> str:
    # A code span: fenced by more backticks than any run inside; "|" still ends a table cell
    # in GFM unless escaped, even in code.
    fence = "`" * (max((len(r) for r in re.findall("`+", line)), default=0) + 1)
    return f"{fence} {line.replace('|', chr(92) + '|')} {fence}"


def render_github(summary: Summary, fail_on=DEFAULT_FAIL_ON) -> str:
    """Markdown for a job summary or an issue body (GitHub-flavoured tables): a section per
    incident, failing ones first, its flags folded beneath it; then the notes."""
    out = ["### matmul-drift summary", "", md_escape(headline(summary, fail_on)) + "."]
    for k, inc in enumerate(ordered(summary.incidents, fail_on), 1):
        out += ["", *incident_markdown(k, inc, fail_on)]
    for heading, lines in notes(summary):
        out += ["", f"#### {md_escape(heading)}", ""]
        out += [f"- {md_escape(n)}" for n in lines]
    if summary.warnings:
        out += ["", "<details><summary>warnings</summary>", ""]
        out += [f"- {md_escape(w)}" for w in summary.warnings]
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


INCIDENT_MARK = "<!-- matmul-drift incident {key} -->"  # how a nightly finds an incident's issue


def incident_markdown(k: int, inc: Incident, fail_on=DEFAULT_FAIL_ON) -> list[str]:
    """One incident as a Markdown section: its cause as the heading, where, the verdict, a
    repro per side, then its cells' table and its flags folded in <details>."""
    out = [f"#### {md_escape(incident_title(k, inc, fail_on))}",
           INCIDENT_MARK.format(key=inc.key), "",
           md_escape(incident_where(inc)), "",
           "**Verdict:** " + md_escape("; ".join(inc.verdict())), ""]
    out += [f"- {md_escape(repro_label(r))}: {_md_code(visible(r['command']))}" for r in inc.repros]
    out += [f"- {md_escape(n)}" for n in inc.notes]
    heads, rows = cell_table(inc)
    out += ["", f"<details><summary>{cells_and_flags(inc)}</summary>", ""]
    out.append("| " + " | ".join(heads) + " |")
    out.append("|" + "---|" * len(heads))
    out += ["| " + " | ".join(md_escape(c) for c in r) + " |" for r in rows]
    out.append("")
    out.append("| " + " | ".join(HEADERS) + " |")
    out.append("|" + "---|" * len(HEADERS))
    for f in inc.flags:
        cells = row(f)
        cells[4] = "\n".join(cut(d) for d in cells[4].split("\n"))
        cells[5] = cut(why(f))
        cells[6] = _md_code(cells[6]) if cells[6] else ""
        out.append("| " + " | ".join(md_escape(c) if k != 6 else c for k, c in enumerate(cells))
                   + " |")
    return out + ["", "</details>"]


# ---------------------------------------------------------------------------- json


def _side_record(side: Side, unit: str, kind: str) -> dict:
    value = side.value
    if value is not None and math.isfinite(value) and unit in ID_UNITS:
        value = int(value)  # 48-bit ids: exact as JSON integers
    elif value is not None and not math.isfinite(value):
        value = None  # JSON has no NaN; status says why there is no value
    rec = {"commit": side.commit, "date": side.date, "env": side.env, "torch": side.torch,
           "value": value, "status": side.status}
    if unit in ID_UNITS:
        rec["id"] = side.id
    if kind == "kernel":
        rec["kernels"] = side.kernels
    return rec


def flag_record(f: Flag, fail_on=DEFAULT_FAIL_ON) -> dict:
    """One flag as a JSON-ready dict (schema in the module docstring)."""
    return {
        "kind": f.kind,
        "failing": f.fails(fail_on),
        "benign": f.benign,
        "machine": f.machine,
        "across": f.across,
        "benchmark": f.benchmark,
        "unit": f.unit,
        "params": dict(f.params),
        "before": _side_record(f.before, f.unit, f.kind),
        "after": _side_record(f.after, f.unit, f.kind),
        "detail": f.detail,
        "attribution": list(f.attribution),
        "repro": repro(f),
    }


def incident_record(inc: Incident, fail_on, index: dict[int, int]) -> dict:
    """One incident as a JSON-ready dict; ``index`` maps a flag's id() to its place in "flags"."""
    return {"key": inc.key, "machine": inc.machine, "across": inc.across, "commit": inc.commit,
            "cause": inc.cause, "changes": list(inc.changes), "failing": inc.failing(fail_on),
            "verdict": inc.verdict(), "cells": inc.cells(), "repros": [dict(r) for r in inc.repros],
            "notes": list(inc.notes), "flags": [index[id(f)] for f in inc.flags]}


def render_json(summary: Summary, fail_on=DEFAULT_FAIL_ON) -> str:
    listed = [f for _, _, flags in groups(summary, fail_on) for f in flags]
    index = {id(f): k for k, f in enumerate(listed)}
    doc = {
        "version": JSON_SCHEMA_VERSION,
        "fail_on": sorted(fail_on, key=KINDS.index),
        "failing": len(summary.failing(fail_on)),
        "pairs": summary.pairs,
        "machines": list(summary.machines),
        "incidents": [incident_record(inc, fail_on, index)
                      for inc in ordered(summary.incidents, fail_on)],
        "flags": [flag_record(f, fail_on) for f in listed],
        "different_hardware": list(summary.different_hardware),
        "method_notes": list(summary.method_notes),
        "timing_notes": list(summary.timing_notes),
        "bits_notes": list(summary.bits_notes),
        # a JSON reader learns what was left out too
        "warnings": list(dict.fromkeys(summary.warnings)),
    }
    text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return visible(text, newlines=True)  # as JSON escapes: the same data reads back
