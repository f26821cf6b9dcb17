"""Measured numbers beside docs/design.md §8's targets: a small result type, its table and its JSON.

Every ``ms-recover bench`` subcommand builds a :class:`Report` of :class:`Measure` rows. A row
with a target gets PASS or MISS; a row without one is context (step time, sample count, ...)
and gets ``-``. Values are stored in the unit they are shown in.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

OPS = {
    "<=": lambda v, lim: v <= lim,
    ">=": lambda v, lim: v >= lim,
    "<": lambda v, lim: v < lim,
}


@dataclasses.dataclass(frozen=True)
class Measure:
    """One measured number; ``op``/``limit`` (in ``unit``) make it a target check.

    ``failed`` says why there is no value because the thing measured did not happen (a job that
    did not form): such a row is a MISS whatever its target, never a silent ``-``.
    """

    name: str
    value: float | None
    unit: str
    op: str = ""
    limit: float | None = None
    note: str = ""
    failed: str = ""

    @property
    def target(self) -> str:
        return f"{self.op} {fmt_num(self.limit)} {self.unit}" if self.op else "-"

    @property
    def passed(self) -> bool | None:
        """True/False against the target; None when there is no target or no value; False
        when the measurement ``failed``."""
        if self.failed:
            return False
        if not self.op or self.limit is None or self.value is None or math.isnan(self.value):
            return None
        return bool(OPS[self.op](self.value, self.limit))

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "-"}[self.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": self.target,
            "op": self.op or None,
            "limit": self.limit,
            "pass": self.passed,
            "note": self.note,
            "failed": self.failed or None,
        }


@dataclasses.dataclass
class Report:
    """A benchmark's result: the rows, the settings it ran with, raw samples and caveats."""

    bench: str
    title: str
    measures: list[Measure] = dataclasses.field(default_factory=list)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    samples: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def add(self, *measures: Measure) -> None:
        self.measures.extend(measures)

    @property
    def ok(self) -> bool:
        """No target was missed (rows without a verdict do not count)."""
        return all(m.passed is not False for m in self.measures)

    def to_json(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "title": self.title,
            "ok": self.ok,
            "settings": self.settings,
            "measures": [m.to_json() for m in self.measures],
            "samples": self.samples,
            "notes": self.notes,
        }

    def format(self) -> str:
        rows = [("measure", "value", "target", "result")]
        rows += [(m.name, _cell(m), m.target, m.verdict) for m in self.measures]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [self.title, ""]
        for i, row in enumerate(rows):
            lines.append(
                "  ".join(
                    cell.ljust(w) if c == 0 else cell.rjust(w)
                    for c, (cell, w) in enumerate(zip(row, widths, strict=True))
                )
            )
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        notes = [f"  {m.name}: {m.note}" for m in self.measures if m.note and not m.failed]
        notes += [f"  {m.name}: MISS, {m.failed}" for m in self.measures if m.failed]
        if notes:
            lines += ["", "where:"] + notes
        if self.notes:
            lines += [""] + [f"* {n}" for n in self.notes]
        return "\n".join(lines)

    def emit(self, json_path: str | None) -> int:
        """Print the table and write the JSON if asked; exit status 0 (a MISS is a result)."""
        print(self.format(), flush=True)
        if json_path:
            write_json(json_path, self.to_json())
        return 0


def summary(values: Iterable[float]) -> dict[str, float | int | None]:
    """n, median, min and max of the samples (None for an empty list)."""
    vals = sorted(values)
    if not vals:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(vals), "median": statistics.median(vals), "min": vals[0], "max": vals[-1]}


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def write_json(path: str, payload: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")


def _cell(m: Measure) -> str:
    shown = fmt_num(m.value)
    return shown if shown == "n/a" else f"{shown} {m.unit}".strip()


def fmt_num(value: float | None) -> str:
    """A measured number as the tables show it: integers whole, else 3 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if float(value).is_integer() and abs(value) >= 1:
        return f"{int(value)}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
