"""Fault injection for tests and the demo: a small builder and its env encoding.

A fault plan travels to rank processes in ``MS_RECOVER_FAULTS`` as ``;``-separated specs,
``kind:rank=R:step=K[:inc=N]``. A spec fires only in incarnation ``inc`` (0 by default, the
first process of the rank), so a restarted rank does not kill itself again.

Kinds:

* ``kill``        SIGKILL this rank right after it commits step K (after its data plane has
  handed its last sends to the kernel, so every peer can finish step K: the survivors'
  target is K whatever the timing; a death with data in flight is ``allreduce``);
* ``node``        SIGKILL this rank's whole process group (its agent and siblings): a lost node;
* ``hang``        SIGSTOP this rank after step K (it stops heartbeating: a hung process);
* ``allreduce``   SIGKILL this rank in the middle of step K's gradient allreduce;
* ``transient``   raise a transient data-plane error in step K's allreduce (the rank survives);
* ``memory``      corrupt this rank's state in step K and report a device memory error;
* ``bitflip``     flip one bit of this rank's state when it commits step K, and report nothing
  (silent data corruption: only the replicas' digests can tell);
* ``corrupt``     flip one byte of the state this rank sends in its first repair;
* ``boot``        SIGKILL this rank as soon as the manager accepted its registration;
* ``repairdie``   SIGKILL this rank in the middle of sending its state for a repair.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable

from ms_recover.errors import CommError, ConfigError

KINDS = (
    "kill",
    "node",
    "hang",
    "allreduce",
    "transient",
    "memory",
    "bitflip",
    "corrupt",
    "boot",
    "repairdie",
)


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int
    step: int = -1
    inc: int = 0

    def encode(self) -> str:
        return f"{self.kind}:rank={self.rank}:step={self.step}:inc={self.inc}"


class Faults:
    """Builder: ``Faults().kill(rank=1, step=5).node(rank=2, step=9).to_env()``."""

    def __init__(self, specs: tuple[FaultSpec, ...] = ()) -> None:
        self.specs = specs

    def add(self, kind: str, rank: int, step: int = -1, inc: int = 0) -> Faults:
        if kind not in KINDS:
            raise ConfigError(f"fault kind {kind!r} is not one of: {', '.join(KINDS)}")
        return Faults(self.specs + (FaultSpec(kind, rank, step, inc),))

    def kill(self, rank: int, step: int, inc: int = 0) -> Faults:
        return self.add("kill", rank, step, inc)

    def node(self, rank: int, step: int) -> Faults:
        return self.add("node", rank, step)

    def hang(self, rank: int, step: int) -> Faults:
        return self.add("hang", rank, step)

    def in_allreduce(self, rank: int, step: int) -> Faults:
        return self.add("allreduce", rank, step)

    def transient(self, rank: int, step: int) -> Faults:
        return self.add("transient", rank, step)

    def corrupt(self, rank: int) -> Faults:
        return self.add("corrupt", rank)

    def to_env(self) -> dict[str, str]:
        return {"MS_RECOVER_FAULTS": ";".join(s.encode() for s in self.specs)}


def parse(text: str) -> tuple[FaultSpec, ...]:
    """Parse ``MS_RECOVER_FAULTS``; raises ConfigError naming the bad spec and valid kinds."""
    specs = []
    for raw in filter(None, (t.strip() for t in text.split(";"))):
        kind, *pairs = raw.split(":")
        if kind not in KINDS:
            raise ConfigError(
                f"fault spec {raw!r}: kind {kind!r} is not one of: {', '.join(KINDS)}"
            )
        try:
            fields = {k: int(v) for k, v in (p.split("=", 1) for p in pairs)}
            specs.append(FaultSpec(kind, **fields))
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"fault spec {raw!r} must look like kind:rank=R:step=K[:inc=N]"
            ) from exc
    return tuple(specs)


class FaultInjector:
    """Fires this rank's faults at the named points of the worker's step loop."""

    def __init__(self, specs: tuple[FaultSpec, ...], rank: int, incarnation: int) -> None:
        self._specs = [s for s in specs if s.rank == rank and s.inc == incarnation]
        self._fired: set[FaultSpec] = set()
        self.armed = bool(self._specs)  # False: every hook is a no-op (skipped on hot paths)

    @classmethod
    def from_env(cls, rank: int, incarnation: int) -> FaultInjector:
        return cls(parse(os.environ.get("MS_RECOVER_FAULTS", "")), rank, incarnation)

    def _take(self, kinds: tuple[str, ...], step: int) -> FaultSpec | None:
        for spec in self._specs:
            if spec.kind in kinds and spec not in self._fired and spec.step in (step, -1):
                self._fired.add(spec)
                return spec
        return None

    def after_commit(self, step: int, flush: Callable[[], None] | None = None) -> None:
        """Fire ``kill``, ``node`` or ``hang`` for ``step``; ``flush`` (closing the data plane
        gracefully) runs before a ``kill``."""
        spec = self._take(("kill", "node", "hang"), step)
        if spec is None:
            return
        if spec.kind == "kill":
            if flush is not None:
                flush()
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind == "node":
            os.killpg(os.getpgid(0), signal.SIGKILL)
        else:
            os.kill(os.getpid(), signal.SIGSTOP)

    def in_allreduce(self, step: int) -> bool:
        """True if this rank must die during this step's allreduce (the caller arranges it)."""
        return self._take(("allreduce",), step) is not None

    def before_allreduce(self, step: int) -> None:
        if self._take(("transient",), step) is not None:
            raise CommError(f"injected transient data-plane failure at step {step}")

    def memory_error(self, step: int) -> bool:
        return self._take(("memory",), step) is not None

    def bitflip(self, step: int) -> bool:
        return self._take(("bitflip",), step) is not None

    def corrupt_repair(self) -> bool:
        return self._take(("corrupt",), -1) is not None

    def die_in_repair(self) -> bool:
        return self._take(("repairdie",), -1) is not None

    def at_registration(self) -> None:
        if self._take(("boot",), -1) is not None:
            os.kill(os.getpid(), signal.SIGKILL)
