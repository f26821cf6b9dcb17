"""Measure ms_recover against the numbers docs/design.md §8 holds it to.

Each benchmark prints a table of measured values next to their targets with PASS or MISS, and
``--json PATH`` writes the same as JSON. Speed targets are checked here, never by timed tests.
The host is shared, so every number is a median over repeats.

  detect        kill -9 of a rank / a node -> the manager's fault event (<= 200 ms / <= 3 s)
  recovery      recover-in-place MTTR vs plain msrun restarting the whole job (<= 5 %), with a
                warm spare (<= 0.15 s), and vs a restart of our own job from a disk checkpoint
                (a reference row, the earlier <= 25 %)
  overhead      GraphStep vs a plain GRAPH_MODE TrainOneStepCell step of the same model (<= +10 %
                at ~1 ms, <= +2 % at ~10 ms), and 2 ranks vs msrun's mccl step (faster)
  controlplane  16,384 simulated ranks on 2,048 agents at the default heartbeat: forms
                (<= 5 s), stop-all (<= 0.3 s), manager CPU between faults (< 10 %)
  allreduce     host allreduce bus bandwidth vs MindSpore's CPU AllReduce (>= 5x), 16-64 MiB vs
                a raw full-duplex socket exchange (>= 85 %), 37 KB vs a one-way socket copy
                (<= 2x its time)
  goodput       ETTR under rank kills (>= 98 %), node losses and a mixed schedule (>= 95 %),
                ms_recover vs plain msrun restarting from its checkpoints, same job and faults
  all           every benchmark above, one after the other, and the Measured table from them
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
from collections.abc import Callable

from ms_recover import inputs
from ms_recover.errors import ConfigError

# (name, module, one-line help); each module exposes configure(parser) and run(args) -> int.
BENCHES: list[tuple[str, str, str]] = [
    ("detect", "ms_recover.bench.detect", "kill -9 to fault event, for a rank and for a node"),
    (
        "recovery",
        "ms_recover.bench.recovery",
        "recover-in-place MTTR vs a job-level restart from a checkpoint and vs msrun's restart",
    ),
    (
        "overhead",
        "ms_recover.bench.overhead",
        "step time against a plain TrainOneStepCell step and msrun's mccl step",
    ),
    (
        "controlplane",
        "ms_recover.bench.controlplane",
        "manager formation, stop-all, CPU and message rate with thousands of simulated ranks",
    ),
    (
        "allreduce",
        "ms_recover.bench.allreduce",
        "host allreduce vs MindSpore's CPU AllReduce and raw socket copies and exchanges",
    ),
    (
        "goodput",
        "ms_recover.bench.goodput",
        "ETTR under seeded fault schedules: ms_recover vs plain msrun's restart, same job",
    ),
    (
        "all",
        "ms_recover.bench.everything",
        "every benchmark above in one run; its table into docs/benchmarks.md with --doc",
    ),
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="bench", metavar="WHAT", required=True)
    for name, module_name, help_text in BENCHES:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a broken benchmark must not break the rest of the CLI
            child = sub.add_parser(name, help=f"{help_text} (unavailable)")
            child.set_defaults(_bench=_unavailable(module_name, exc))
            continue
        child = sub.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.configure(child)
        child.set_defaults(_bench=module.run)


def _unavailable(module_name: str, exc: Exception) -> Callable[[argparse.Namespace], int]:
    def fail(args: argparse.Namespace) -> int:
        raise ConfigError(f"benchmark {module_name} cannot be loaded: {exc!r}") from exc

    return fail


def run(args: argparse.Namespace) -> int:
    _check_common(args)
    if not getattr(args, "verbose", False):  # the table tells the story; manager logs with -v
        logging.getLogger("ms_recover").setLevel(logging.WARNING)
    return int(args._bench(args))


#: Flags several benchmarks share, checked here once, before anything runs.
_SECONDS = ("timeout", "heartbeat", "reschedule_delay")
_MAX_WORLD = 64  # bench allreduce: one process per rank on this machine


def _check_common(args: argparse.Namespace) -> None:
    for name in _SECONDS:
        value = getattr(args, name, None)
        if value is not None:
            inputs.check_seconds(f"--{name.replace('_', '-')}", value)
    if getattr(args, "json", None):
        inputs.check_output_file("--json", args.json)
    if getattr(args, "workdir", None):
        inputs.check_output_dir("--workdir", args.workdir)
    sizes = getattr(args, "sizes", None) or []
    if not all(math.isfinite(s) and s > 0 for s in sizes):
        raise ConfigError(f"--sizes must be positive numbers of MB, got {sizes}")
    if getattr(args, "ranks_per_agent", 1) < 1:
        raise ConfigError(f"--ranks-per-agent must be at least 1, got {args.ranks_per_agent}")
    world = getattr(args, "world", None)
    if world is not None and world > _MAX_WORLD:  # the low bound is the benchmark's own check
        raise ConfigError(f"--world must be at most {_MAX_WORLD} (a process per rank), got {world}")
