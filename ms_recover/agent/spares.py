"""Pre-warmed spare rank processes: the training command, started before it is needed.

A spare runs the training script up to ``ms_recover.init()`` (so MindSpore is imported and
the model built) and then blocks reading a pipe. To replace a failed rank, the agent writes
that rank's environment to the pipe and closes it; the spare takes the rank and registers
like any restarted process, skipping the cold start. Closing the pipe with nothing written
tells an unused spare to exit. The spare's side is :mod:`ms_recover.worker.spare`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Callable
from typing import IO

from ms_recover.env import SPARE_FD


@dataclasses.dataclass
class Spare:
    proc: subprocess.Popen[bytes]
    pipe: int  # write end; the spare reads its rank environment from the other end


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

    def fill(self) -> None:
        """Start spares until ``count`` are alive."""
        self.spares = [s for s in self.spares if s.proc.poll() is None or _close(s)]
        while len(self.spares) < self.count:
            read, write = os.pipe()
            proc = subprocess.Popen(
                self.command,
                env={**self.env, SPARE_FD: str(read)},
                stdout=self.log,
                stderr=self.log,
                pass_fds=(read,),
                preexec_fn=self._preexec,
            )
            os.close(read)
            self.spares.append(Spare(proc, write))

    def activate(self, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        """Hand ``env`` (a rank's variables) to a live spare; None if none is left."""
        while self.spares:
            spare = self.spares.pop(0)
            if spare.proc.poll() is None:
                os.write(spare.pipe, json.dumps(env).encode())
                os.close(spare.pipe)
                return spare.proc
            _close(spare)
        return None

    def close(self) -> None:
        """Release every unused spare (it exits when its pipe closes empty) and reap it."""
        for spare in self.spares:
            _close(spare)
        for spare in self.spares:
            try:
                spare.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                spare.proc.kill()
                spare.proc.wait()
        self.spares.clear()


def _close(spare: Spare) -> bool:
    try:
        os.close(spare.pipe)
    except OSError:
        pass
    return False
