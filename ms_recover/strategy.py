"""The ``recover-strategy`` annotation: parsing, validation and priority order.

MindCluster accepts a comma list of ``retry, recover, recover-in-place, elastic-training, dump,
exit``. ms_recover applies them in a fixed priority order, whatever order the user wrote:
``retry > recover-in-place > recover > elastic-training > dump > exit``.
"""

from __future__ import annotations

import enum
import re

from ms_recover.errors import ConfigError


class Strategy(str, enum.Enum):
    """One recovery strategy; the value is the annotation token."""

    RETRY = "retry"
    RECOVER_IN_PLACE = "recover-in-place"
    RECOVER = "recover"
    ELASTIC_TRAINING = "elastic-training"
    DUMP = "dump"
    EXIT = "exit"

    def __str__(self) -> str:
        return self.value


PRIORITY: tuple[Strategy, ...] = tuple(Strategy)
VALID_NAMES = ", ".join(s.value for s in PRIORITY)
#: The strategies that may start a rank again on its own node (the agent's StartRanks):
#: only they can use a node's standby interpreter.
RESTART_IN_PLACE = frozenset({Strategy.RECOVER_IN_PLACE, Strategy.ELASTIC_TRAINING})


def restarts_in_place(strategies: tuple[Strategy, ...]) -> bool:
    """Whether a job with these strategies may restart a rank on its own node."""
    return any(s in RESTART_IN_PLACE for s in strategies)


def parse_strategies(text: str) -> tuple[Strategy, ...]:
    """Parse a comma list into strategies in priority order.

    Raises ConfigError naming the bad token and the valid ones on an unknown, empty or
    duplicated entry. An empty string yields an empty tuple (no process-level recovery).
    """
    if not text.strip():
        return ()
    seen: list[Strategy] = []
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            raise ConfigError(f"recover-strategy {text!r} has an empty entry; valid: {VALID_NAMES}")
        try:
            strategy = Strategy(token)
        except ValueError:
            raise ConfigError(f"recover-strategy {token!r} is not one of: {VALID_NAMES}") from None
        if strategy in seen:
            raise ConfigError(f"recover-strategy {token!r} is listed twice in {text!r}")
        seen.append(strategy)
    return tuple(s for s in PRIORITY if s in seen)


def format_strategies(strategies: tuple[Strategy, ...]) -> str:
    """The canonical comma list, in priority order."""
    return ",".join(s.value for s in strategies)


_TFT_FLAG = re.compile(r"([A-Z]+)\s*:\s*(\d+)")


def from_operator_env(ms_enable_tft: str, restart_fault_process: str) -> tuple[Strategy, ...]:
    """Strategies implied by the Ascend Operator's MindSpore env injection.

    ``MS_ENABLE_TFT={ARF:1}`` means process rescheduling (``recover``, and ``exit`` shares the
    flag); with ``ENABLE_RESTART_FAULT_PROCESS=on`` it becomes ``recover-in-place`` too.
    ``UCE:1`` / ``HCCE:1`` mean ``retry``; ``TTP:1`` means ``dump``.
    """
    flags = {name for name, value in _TFT_FLAG.findall(ms_enable_tft) if value != "0"}
    chosen: set[Strategy] = set()
    if flags & {"UCE", "HCCE"}:
        chosen.add(Strategy.RETRY)
    if "ARF" in flags:
        chosen.add(Strategy.RECOVER)
        if restart_fault_process.strip().lower() == "on":
            chosen.add(Strategy.RECOVER_IN_PLACE)
    if "TTP" in flags:
        chosen.add(Strategy.DUMP)
    if chosen:
        chosen.add(Strategy.EXIT)
    return tuple(s for s in PRIORITY if s in chosen)
