"""msrun's own answer to a ``kill -9`` of one worker: the job-level restart (``bench recovery``).

The user's alternative to ms_recover is plain msrun (no ms_recover shim, no ``MS_ENABLE_TFT``)
running the same training job: :mod:`ms_recover.mindspore.programs.msrun_ckpt_train`, the demo
MLP in MindSpore's own data-parallel ``TrainOneStepCell`` over mccl, rank 0 checkpointing every
``ckpt_every`` steps. One sample:

1. ``msrun --join True`` on one node, ``world`` workers, until training is warm and a
   checkpoint exists;
2. ``kill -9`` of one worker (``t_kill``); msrun sees it within its 1 s poll, kills the other
   workers and then waits for MindSpore's scheduler, which gives up on the dead worker only
   after its own timeouts. **exit** = msrun's exit - ``t_kill``;
3. msrun is started again on the same checkpoint directory. **relaunch** = the last rank's
   first step after ``load_checkpoint`` - msrun's exit (process start, import, cluster
   formation, load, compile, one step, all ranks at once);
4. **recompute**: the work since the last checkpoint is lost; for a fault at a uniformly random
   time that is half a checkpoint interval on average, at the job's steady step time (the same
   model as the checkpoint-restart baseline). The steps this sample actually lost are shown too.

    baseline = exit + relaunch + (ckpt_every / 2) * step_time

msrun starts ``python`` from ``PATH``: this interpreter's directory is put first. msrun puts each
worker in its own session, so killing msrun's process group does not reach them: every pid seen
under msrun is remembered (with its start time, so a reused pid is never signalled) and its
group is SIGKILLed at the end, whatever happened. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from ms_recover import env as E
from ms_recover.bench.mscluster import INHERITED_CLUSTER_VARS, free_port
from ms_recover.bench.table import Measure, median
from ms_recover.integrations import shims
from ms_recover.localrun.msrunjob import msrun_path, script_command
from ms_recover.localrun.wait import wait_for

PROGRAM = [sys.executable, "-m", "ms_recover.mindspore.programs.msrun_ckpt_train"]
LONG_RUN_STEPS = 10**7
POLL_S = 0.05


@dataclasses.dataclass(frozen=True)
class Sample:
    """One kill -> msrun exit -> relaunch, in seconds, with the steps it lost."""

    exit_s: float
    relaunch_s: float
    killed_at_step: int
    loaded_step: int

    @property
    def lost_steps(self) -> int:
        return self.killed_at_step - self.loaded_step


def read_records(out: str, pattern: str) -> list[dict[str, Any]]:
    """Every complete JSON record ``out/pattern`` holds (files are replaced atomically)."""
    found = []
    for path in sorted(glob.glob(os.path.join(out, pattern))):
        with contextlib.suppress(OSError, ValueError):
            with open(path) as fh:
                found.append(json.load(fh))
    return found


def first_steps(out: str, world: int) -> list[dict[str, Any]] | None:
    """Every rank's first-step record, or None while one is missing."""
    found = read_records(out, "timing_*.json")
    return found if len({t["rank"] for t in found}) == world else None


def killed_at(progress: Mapping[str, Any], t_kill: float, step_s: float) -> int:
    """The step a rank was at when killed: its last progress record, advanced by the time since."""
    return int(progress["step"]) + max(0, int((t_kill - float(progress["t"])) / step_s))


def msrun_env(base: Mapping[str, str]) -> dict[str, str]:
    """Plain msrun's environment: nothing of ms_recover (no shim, no TFT), no inherited cluster,
    this interpreter first on PATH."""
    shim = os.path.realpath(shims.path())
    env = {
        k: v
        for k, v in base.items()
        if k not in INHERITED_CLUSTER_VARS
        and not k.startswith("MS_RECOVER_")
        and k not in (E.ENABLE_TFT, E.TASK_ID, E.PORT)
    }
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if os.path.realpath(p) != shim)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", "")
    return env


class MsrunRun:
    """One ``msrun --join True`` in its own session, and every process seen under it."""

    def __init__(self, argv: list[str], env: dict[str, str], log: str) -> None:
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.seen: dict[int, str] = {}  # pid -> start time (field 22 of /proc/pid/stat)

    def note_descendants(self) -> None:
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{pid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
                for kid in kids:
                    start = _start_time(kid)
                    if start:
                        self.seen.setdefault(kid, start)
                todo += kids

    def wait_exit(self, timeout_s: float) -> float:
        """Wall time msrun exited at (its deadline: TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            self.note_descendants()
            if time.monotonic() > deadline:
                raise TimeoutError(f"msrun did not exit within {timeout_s:g} s of the kill")
            time.sleep(POLL_S)
        return time.time()

    def kill(self) -> None:
        """SIGKILL msrun's group and every group seen under it (same start time only); reap."""
        self.note_descendants()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid, start in self.seen.items():
            if _start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        wait_for(
            lambda: not any(_start_time(p) == s for p, s in self.seen.items()),
            30.0,
            "msrun's processes to be gone",
        )


def _start_time(pid: int) -> str:
    """A zombie counts as gone: its parent (msrun, or init once msrun died) reaps it."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return ""
    return "" if fields[0] == "Z" else fields[19]


@dataclasses.dataclass
class Restarts:
    """Runs the samples; ``program`` is the rank program's argv head (a stand-in in tests)."""

    world: int
    ckpt_every: int
    warm_steps: int
    timeout_s: float
    workdir: str
    program: list[str] = dataclasses.field(default_factory=lambda: list(PROGRAM))
    on_start: Callable[[str], None] = dataclasses.field(default=lambda tag: None)

    def start(self, tag: str) -> tuple[MsrunRun, str]:
        out = os.path.join(self.workdir, tag)
        os.makedirs(out, exist_ok=True)
        argv = [
            msrun_path(),
            "--worker_num", str(self.world), "--local_worker_num", str(self.world),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            "--node_rank", "0", "--join", "True",
            "--cluster_time_out", str(max(1, int(self.timeout_s))),
            "--log_dir", os.path.join(out, "msrun_log"),
            *script_command(self.program),
            "--steps", str(LONG_RUN_STEPS), "--out", out,
            "--ckpt-dir", self.ckpt_dir, "--ckpt-every", str(self.ckpt_every),
        ]  # fmt: skip
        self.on_start(tag)
        return MsrunRun(argv, msrun_env(os.environ), os.path.join(out, "msrun.out")), out

    @property
    def ckpt_dir(self) -> str:
        return os.path.join(self.workdir, "ckpt")

    def measure(self, repeats: int) -> dict[str, Any]:
        os.makedirs(self.ckpt_dir, exist_ok=True)
        run, out = self.start("run0")
        samples: list[Sample] = []
        step_s = 0.0
        try:
            for i in range(repeats):
                self._warm(run, out)
                step_s = self._step_time(run, out)
                target = max(read_records(out, "progress_*.json"), key=lambda p: p["rank"])
                t_kill = time.time()
                os.kill(int(target["pid"]), signal.SIGKILL)
                at = max(killed_at(p, t_kill, step_s) for p in read_records(out, "progress_*.json"))
                t_exit = run.wait_exit(self.timeout_s)
                run.kill()
                run, out = self.start(f"run{i + 1}")
                firsts = self._wait(
                    run, functools.partial(first_steps, out, self.world), "first steps"
                )
                samples.append(
                    Sample(
                        exit_s=t_exit - t_kill,
                        relaunch_s=max(t["times"]["first_step"] for t in firsts) - t_exit,
                        killed_at_step=at,
                        loaded_step=int(firsts[0]["loaded_step"]),
                    )
                )
        finally:
            run.kill()
        return {"step_s": step_s, "samples": [dataclasses.asdict(s) for s in samples]}

    def _wait(self, run: MsrunRun, cond: Callable[[], Any], what: str) -> Any:
        def check() -> Any:
            run.note_descendants()
            if run.proc.poll() is not None:
                raise RuntimeError(f"msrun exited ({run.proc.returncode}) before {what}")
            return cond()

        return wait_for(check, self.timeout_s, f"msrun job: {what}", poll_s=POLL_S)

    def _warm(self, run: MsrunRun, out: str) -> None:
        ckpt = os.path.join(self.ckpt_dir, "latest.ckpt")

        def warm() -> bool:
            prog = read_records(out, "progress_*.json")
            steps = [p["step"] for p in prog]
            return (
                len(prog) == self.world and min(steps) >= self.warm_steps and os.path.exists(ckpt)
            )

        self._wait(run, warm, f"every rank past step {self.warm_steps} and a checkpoint")

    def _step_time(self, run: MsrunRun, out: str, window_s: float = 2.0) -> float:
        def rank0() -> dict[str, Any]:
            return next(p for p in read_records(out, "progress_*.json") if p["rank"] == 0)

        a = rank0()
        b = self._wait(run, lambda: (p := rank0())["t"] >= a["t"] + window_s and p, "step time")
        return float(b["t"] - a["t"]) / max(1, int(b["step"]) - int(a["step"]))


TARGET_RATIO_PCT = 5.0  # docs/design.md §8: MTTR <= 5 % of msrun's restart


def rows(mttr_s: float | None, result: dict[str, Any] | None, ckpt_every: int) -> list[Measure]:
    """The baseline's rows and ms_recover's MTTR as a share of it (PASS/MISS against 5 %).

    ``result`` is :meth:`Restarts.measure`'s, or ``{"failed": reason}``; a failed or empty
    baseline makes the ratio row a MISS naming the reason, never a silent ``-``.
    """
    result = result or {"failed": "not run"}
    samples = result.get("samples") or []
    failed = result.get("failed") or ("" if samples else "no sample")
    n = len(samples)
    exit_s = median([s["exit_s"] for s in samples])
    relaunch_s = median([s["relaunch_s"] for s in samples])
    step_s = result.get("step_s") or None
    recompute_s = ckpt_every / 2 * step_s if step_s else None
    parts = (exit_s, relaunch_s, recompute_s)
    total = None if None in parts else sum(p for p in parts if p is not None)
    ratio = None if total is None or mttr_s is None else mttr_s / total * 100
    why = f"msrun baseline not measured: {failed}" if failed else ""
    return [
        Measure(
            "msrun restart: kill -9 -> msrun exits",
            exit_s,
            "s",
            note=f"median of {n}; plain msrun --join True, no ms_recover: MindSpore's scheduler "
            "gives up on the dead worker, then msrun exits",
        ),
        Measure(
            "msrun restart: relaunch -> every rank's first step",
            relaunch_s,
            "s",
            note="msrun started again on the checkpoint: import, cluster formation, "
            "load_checkpoint, compile, one step",
        ),
        Measure("msrun restart: steady step time", None if step_s is None else step_s * 1e3, "ms"),
        Measure(
            f"msrun restart: expected recompute, {ckpt_every}/2 steps",
            recompute_s,
            "s",
            note=f"rank 0 checkpoints every {ckpt_every} steps; a fault at a random time "
            "loses half an interval on average",
        ),
        Measure(
            "msrun restart: steps lost in this run (max)",
            max((s["killed_at_step"] - s["loaded_step"] for s in samples), default=None),
            "steps",
        ),
        Measure("msrun restart: exit + relaunch + expected recompute", total, "s"),
        Measure(
            "recover-in-place MTTR / msrun restart",
            ratio,
            "%",
            "<=",
            TARGET_RATIO_PCT,
            failed=why,
        ),
    ]
