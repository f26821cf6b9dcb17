"""Every benchmark in one run (``ms-recover bench all``), and its table (docs/benchmarks.md).

Each benchmark runs as its own ``ms-recover bench <name> --json DIR/<name>.json`` process, one
after the other, so one's MindSpore threads and sockets cannot slow the next. The host's load
average is sampled before and after each; it goes into ``DIR/run.json`` and under the table,
because on a shared host a figure means little without it.

``DIR/measured.md`` is the Markdown table of every row of every report: the stable row name,
the value, the target and PASS/MISS (a row without a target is context and shows ``-``). With
``--readme PATH`` the table also replaces what stands between the two marker lines
``<!-- bench-all:begin -->`` and ``<!-- bench-all:end -->`` in that file, so the README's
figures always come from one run. ``--doc PATH`` writes the same table into the benchmarks
document (``docs/benchmarks.md``): a new file gets a short preamble and the marked block, an
existing one has only its marked block replaced. ``--render DIR`` does only these last parts,
from the JSON files of an earlier run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from ms_recover.bench.table import fmt_num
from ms_recover.errors import ConfigError

#: The benchmarks ``all`` runs, in order, with the flags it gives each beyond ``--json``.
PLAN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("detect", ()),
    ("recovery", ()),
    ("overhead", ()),
    ("controlplane", ()),
    ("allreduce", ()),
    ("goodput", ()),
)
BEGIN, END = "<!-- bench-all:begin -->", "<!-- bench-all:end -->"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", metavar="DIR", help="write DIR/<bench>.json, DIR/run.json and DIR/measured.md"
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="BENCH",
        help=f"run only these (of: {', '.join(n for n, _ in PLAN)})",
    )
    p.add_argument(
        "--args",
        action="append",
        default=[],
        metavar="BENCH:FLAGS",
        help="extra flags for one benchmark, e.g. 'recovery:--repeats 5' (repeatable)",
    )
    p.add_argument("--readme", metavar="PATH", help="replace the Measured table in this file")
    p.add_argument(
        "--doc",
        metavar="PATH",
        help="write the table into this benchmarks document, e.g. docs/benchmarks.md "
        "(created if missing, else its marked block replaced)",
    )
    p.add_argument(
        "--render",
        metavar="DIR",
        help="run nothing: render DIR's JSON files of an earlier run (with --readme to splice)",
    )


def run(args: argparse.Namespace) -> int:
    if args.render:
        out = args.render
        if not os.path.isfile(os.path.join(out, "run.json")):
            raise ConfigError(f"--render: no run.json in {out!r} (run 'ms-recover bench all')")
    else:
        if not args.out:
            raise ConfigError("ms-recover bench all needs --out DIR (or --render DIR)")
        out = args.out
        names = _selected(args.only)
        extra = _extra_flags(args.args, names)
        os.makedirs(out, exist_ok=True)
        _run_all(out, names, extra)
    if args.readme and not os.path.isfile(args.readme):
        raise ConfigError(f"--readme: no such file {args.readme!r}")
    table = render(out)
    with open(os.path.join(out, "measured.md"), "w", encoding="utf-8") as fh:
        fh.write(table)
    print(table, end="")
    if args.readme:
        splice(args.readme, table)
    if getattr(args, "doc", None):
        write_doc(args.doc, table)
    return 0


def _selected(only: Sequence[str] | None) -> list[str]:
    known = [n for n, _ in PLAN]
    bad = [n for n in only or () if n not in known]
    if bad:
        raise ConfigError(f"--only: unknown benchmark {bad[0]!r}; valid: {', '.join(known)}")
    return [n for n in known if not only or n in only]


def _extra_flags(specs: Sequence[str], names: Sequence[str]) -> dict[str, list[str]]:
    extra: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, flags = spec.partition(":")
        if not sep or name not in [n for n, _ in PLAN]:
            valid = ", ".join(n for n, _ in PLAN)
            raise ConfigError(f"--args must be BENCH:FLAGS with BENCH one of {valid}, got {spec!r}")
        try:
            extra.setdefault(name, []).extend(shlex.split(flags))
        except ValueError as exc:
            raise ConfigError(f"--args {spec!r}: {exc}") from exc
    return {n: extra.get(n, []) for n in names}


def _run_all(out: str, names: Sequence[str], extra: dict[str, list[str]]) -> None:
    flags = dict(PLAN)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: list[dict[str, Any]] = []
    for name in names:
        path = os.path.join(out, f"{name}.json")
        cmd = [sys.executable, "-m", "ms_recover.cli", "bench", name, *flags[name], *extra[name]]
        cmd += ["--json", path]
        print(f"== ms-recover bench {name}", flush=True)
        before, t0 = os.getloadavg(), time.monotonic()
        rc = subprocess.call(cmd)
        runs.append(
            {
                "bench": name,
                # the report's name relative to DIR: the run directory may be moved or published
                "argv": ["ms-recover", *cmd[3:-1], os.path.basename(path)],
                "exit_code": rc,
                "seconds": round(time.monotonic() - t0, 1),
                "load_before": [round(x, 2) for x in before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            }
        )
        _write(os.path.join(out, "run.json"), _meta(started, runs))


def _meta(started: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"started": started, "cores": os.cpu_count(), "runs": runs}
    commit = _commit()
    if commit:
        meta["commit"] = commit
    return meta


def _commit() -> str | None:
    """The checkout's short commit, when the run starts inside a git work tree."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def _write(path: str, payload: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2)
        fh.write("\n")


def render(out: str) -> str:
    """The Markdown table of every report in ``out``, with each run's load underneath."""
    with open(os.path.join(out, "run.json"), encoding="utf-8") as fh:
        meta = json.load(fh)
    lines = ["| bench | measure | measured | target | result |", "|---|---|---|---|---|"]
    notes: list[str] = []
    for run_ in meta["runs"]:
        name = run_["bench"]
        report = _load_report(os.path.join(out, f"{name}.json"))
        if report is None:
            lines.append(f"| {name} | (no report) | exit {run_['exit_code']} | - | MISS |")
            continue
        for m in report["measures"]:
            lines.append(_row(name, m))
            if m.get("failed"):
                notes.append(f"- {name} / {m['name']}: {m['failed']}")
    load = "; ".join(
        f"{r['bench']} {r['load_before'][0]:g} -> {r['load_after'][0]:g} ({r['seconds']:g} s)"
        for r in meta["runs"]
    )
    foot = [
        "",
        f"One run of `ms-recover bench all`, started {meta['started']} on {meta['cores']} cores"
        + (f", commit {meta['commit']}." if meta.get("commit") else "."),
        f"Load average (1 min) before -> after each bench: {load}.",
    ]
    return "\n".join(lines + foot + ([""] + notes if notes else [])) + "\n"


def _load_report(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            report: dict[str, Any] = json.load(fh)
    except (OSError, ValueError):
        return None
    return report


def _row(bench: str, m: dict[str, Any]) -> str:
    verdict = {True: "PASS", False: "MISS", None: "-"}[m.get("pass")]
    value = m.get("value")
    shown = "n/a" if value is None else f"{fmt_num(value)} {m.get('unit', '')}".strip()
    cells = [bench, str(m["name"]), shown, str(m.get("target", "-")), verdict]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def splice(path: str, table: str, flag: str = "--readme") -> None:
    """Replace the text between the marker lines in ``path`` with ``table``."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ConfigError(f"{flag}: {path!r} has no {BEGIN} ... {END} block to replace")
    new = text[: start + len(BEGIN)] + "\n" + table + text[end:]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(new)


DOC_HEAD = """# Benchmarks

Written by `ms-recover bench all --out DIR --doc docs/benchmarks.md` from one run of every
benchmark; edit the text outside the markers, never the table. Each row's name is stable from
run to run; each figure stands next to its target from `docs/design.md` §8 with PASS or MISS
(a row without a target is context, `-`). Each benchmark compares against what a user would run
instead, side by side in the same run: a plain `TrainOneStepCell` step, msrun's own restart and
its mccl `DistributedGradReducer` step, MindSpore's CPU AllReduce, a raw socket exchange. The
load average before and after each benchmark is under the table: on a shared host a figure
means little without it.

"""


def write_doc(path: str, table: str) -> None:
    """Create the benchmarks document at ``path`` with ``table``, or splice it into one."""
    if os.path.isfile(path):
        splice(path, table, "--doc")
        return
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        raise ConfigError(f"--doc: no such directory {parent!r}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"{DOC_HEAD}{BEGIN}\n{table}{END}\n")
