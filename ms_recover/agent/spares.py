"""Pre-warmed spare rank processes: the training command, started before it is needed.

A spare runs the training script up to ``ms_recover.init()`` (MindSpore imported, the model
built and, with ``init(warm_up=...)``, the step graphs compiled) and then blocks reading a
pipe. To replace a failed rank, the agent writes that rank's environment to the pipe and
closes it; the spare takes the rank and registers like any restarted process, skipping the
cold start. Closing the pipe with nothing written tells an unused spare to exit. The spare's
side is :mod:`ms_recover.worker.spare`.

Refilling waits until the taken spare has *settled*: it committed its first step (it writes
a byte to a second pipe), exited, or :data:`SETTLE_TIMEOUT_S` passed. A new spare imports
MindSpore and compiles its graphs, seconds of CPU; started at once it would compete with the
recovery it is meant to shorten (measured on a 2-core host: resume 0.9-1.0 s instead of a few
steps).

A spare that dies while it waits (killed, out of memory) is replaced, after
:data:`RESPAWN_MIN_S`; each death within :data:`RESPAWN_RESET_S` of its start doubles that
pause, up to :data:`RESPAWN_MAX_S`, so a command that cannot start costs one process start
a minute, not one per agent loop. A pool with a ``fallback`` command (the agent's warm
standby, :mod:`ms_recover.agent.ranks`) switches to it for good on such an early death: the
program could not run up to ``init()`` without a rank's identity.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable
from typing import IO

from ms_recover.env import SPARE_FD, SPARE_SETTLED_FD

log = logging.getLogger(__name__)

#: Refill anyway this long after a spare was taken, if it neither committed a step nor exited
#: (a program that never commits through the session would otherwise never get a new spare).
SETTLE_TIMEOUT_S = 30.0
RESPAWN_MIN_S = 1.0  # a dead waiting spare is replaced this long after it was seen dead ...
RESPAWN_MAX_S = 60.0  # ... doubled per early death up to this
RESPAWN_RESET_S = 60.0  # a spare that lived this long died late: the pause starts over


@dataclasses.dataclass
class Spare:
    proc: subprocess.Popen[bytes]
    pipe: int  # write end; the spare reads its rank environment from the other end
    settled: int  # read end; the spare writes a byte once it committed its first step
    taken_at: float = 0.0
    started_at: float = dataclasses.field(default_factory=lambda: time.monotonic())  # module clock


class SparePool:
    """Keeps ``count`` spares alive for one node."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        count: int,
        log: IO[bytes] | None,
        preexec: Callable[[], None],
    ) -> None:
        self.command, self.env, self.count, self.log = command, env, count, log
        self._preexec = preexec
        self.spares: list[Spare] = []
        self.settling: list[Spare] = []  # taken, not yet settled: no refill meanwhile
        self.respawns = 0  # waiting spares that died and were replaced
        self.fallback: list[str] | None = None  # command to switch to on an early death
        self._pause = 0.0  # before the next replacement of a dead one (0: none yet)
        self._respawn_at = 0.0  # monotonic time of the next replacement, if one is due

    def fill(self) -> None:
        """Start spares until ``count`` are alive, unless a taken one has not settled yet."""
        self.spares = [s for s in self.spares if s.proc.poll() is None or _close(s)]
        if self.count and self._settling():
            return
        while len(self.spares) < self.count:
            read, write = os.pipe()
            settled_r, settled_w = os.pipe()
            os.set_blocking(settled_r, False)
            proc = subprocess.Popen(
                self.command,
                env={**self.env, SPARE_FD: str(read), SPARE_SETTLED_FD: str(settled_w)},
                stdout=self.log,
                stderr=self.log,
                pass_fds=(read, settled_w),
                preexec_fn=self._preexec,
            )
            os.close(read)
            os.close(settled_w)
            self.spares.append(Spare(proc, write, settled_r))

    def poll(self) -> None:
        """Refill once every taken spare has settled, and replace a waiting spare that died
        once its pause is over (called from the agent's loop)."""
        if self.settling:
            if not self._settling():
                self.fill()
            return
        if not self._respawn_at:
            dead = [s for s in self.spares if s.proc.poll() is not None]
            if not dead:
                return
            now = time.monotonic()
            if any(now - s.started_at < RESPAWN_RESET_S for s in dead):  # an early death
                self._fall_back()
                self._pause = min(RESPAWN_MAX_S, 2 * self._pause) if self._pause else RESPAWN_MIN_S
            else:
                self._pause = RESPAWN_MIN_S
            self._respawn_at = now + self._pause
            for spare in dead:
                log.warning(
                    "spare pid %d died while waiting (exit code %s); a new one in %.0f s",
                    spare.proc.pid,
                    spare.proc.returncode,
                    self._pause,
                )
        if time.monotonic() >= self._respawn_at:
            self._respawn_at = 0.0
            alive = sum(1 for s in self.spares if s.proc.poll() is None)
            self.fill()
            self.respawns += len(self.spares) - alive

    def _fall_back(self) -> None:
        if self.fallback is not None:
            log.warning(
                "a warm standby died before it took a rank; the node keeps a bare standby "
                "(MindSpore imported, nothing compiled) from now on"
            )
            self.command, self.fallback = self.fallback, None

    def activate(self, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        """Hand ``env`` (a rank's variables) to a live spare; None if none is left."""
        while self.spares:
            spare = self.spares.pop(0)
            if spare.proc.poll() is None:
                os.write(spare.pipe, json.dumps(env).encode())
                os.close(spare.pipe)
                spare.taken_at = time.monotonic()
                self.settling.append(spare)
                return spare.proc
            _close(spare)
        return None

    def close(self, kill: bool = False) -> None:
        """Release every unused spare (it exits when its pipe closes empty) and reap it; with
        ``kill``, SIGKILL it at once (a standby holds nothing, and may still be importing)."""
        for spare in self.spares:
            _close(spare)
            if kill:
                spare.proc.kill()
        for spare in self.settling:
            _close_fd(spare.settled)
        self.settling.clear()
        for spare in self.spares:
            try:
                spare.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                spare.proc.kill()
                spare.proc.wait()
        self.spares.clear()

    def _settling(self) -> bool:
        """Drop the taken spares that settled; True while some still have not."""
        now, left = time.monotonic(), []
        for spare in self.settling:
            try:
                os.read(spare.settled, 1)  # a byte (it committed a step), or EOF (it exited)
                done = True
            except BlockingIOError:
                done = now - spare.taken_at >= SETTLE_TIMEOUT_S
            if done:
                _close_fd(spare.settled)
            else:
                left.append(spare)
        self.settling = left
        return bool(left)


def _close(spare: Spare) -> bool:
    _close_fd(spare.pipe)
    _close_fd(spare.settled)
    return False


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
