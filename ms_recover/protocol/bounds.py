"""Bounds on every decoded value, so no single frame can make a receiver fail or overreach.

:func:`check_field` is the one type-and-range check for message fields; :data:`UNPACK_LIMITS`
caps what msgpack may allocate for one frame before any of our code runs; :func:`depth_ok` is
the nesting check, done without recursion before anything else walks or prints a value (a
deeply nested value otherwise raises ``RecursionError`` in ``repr`` and ``==``).

Guaranteed, for a value that passes: nesting at most :data:`MAX_DEPTH`; every int within int64
(and within the field's own range, see :data:`INT_RANGES`), so arithmetic on a step and
re-encoding it never overflows msgpack; every float finite; every str at most
:data:`MAX_STR` characters; every list and map at most :data:`MAX_ITEMS` entries.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 8  # envelope > body > status > ranks list > rank map > value: 6 levels in use
MAX_STR = 65536  # characters of one string: a fault message, a path, an endpoint list entry
MAX_ITEMS = 1 << 17  # entries of one list or map: every rank of a 65,536-rank job, twice
INT64 = (-(2**63), 2**63 - 1)
STEP_MAX = 2**53  # steps, seqs and epochs stay exact as JSON numbers and can be incremented
_ID = (-1, 2**31 - 1)  # ranks, nodes, pids, exit codes and signals are C ints; -1 means none

#: The range of each int field by name; any other int must be within int64.
INT_RANGES: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("step", "committed_step", "target_step"), (-1, STEP_MAX)),
    "steps": (-1, STEP_MAX),  # AgentHeartbeat.steps: rank -> committed step (ranks checked later)
    **dict.fromkeys(("epoch", "seq", "attempt", "incarnation", "size"), (0, STEP_MAX)),
    **dict.fromkeys(("epochs", "seqs"), (0, STEP_MAX)),  # relayed envelopes (RelayUp/Down)
    **dict.fromkeys(("nonce", "nonces"), (0, INT64[1])),
    **dict.fromkeys(("rank", "node_rank", "recv_from", "failed_peer", "pid", "shard"), _ID),
    **dict.fromkeys(("ranks", "send_to", "world", "nodes", "leader"), _ID),
    **dict.fromkeys(("exit_code", "code", "signal"), (-(2**31), 2**31 - 1)),
    "world_size": (0, 2**31 - 1),
    "counts": (0, MAX_ITEMS),  # GroupStopped: items per node
}

#: The range of each float field by name that is narrower than int64's: a planned stop's
#: deadline is a pod's termination grace (Kubernetes takes any int64 seconds; a day is plenty).
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "deadline_s": (0.0, 86400.0),
    "stopped_s": (0.0, 86400.0),  # RankFrozen: how long a rank has been stopped
    "manager_age_s": (0.0, 86400.0),  # GroupAck: since the group leader heard the manager
}

#: Narrower ranges of a field in one message kind: the values the manager takes a successor of.
#: It resumes at the step after a committed step it learnt from a registration, a stop or a
#: repair (``Resume(step + 1)``), and starts a round at the epoch after the one a registering
#: member reports (see :data:`EPOCH_RANGES`); so those are at most ``STEP_MAX - 1``, and what
#: it derives from them is still within :data:`INT_RANGES`, which its members check. (A
#: heartbeat's committed step may be ``STEP_MAX`` itself: the one that closes that Resume.)
KIND_RANGES: dict[tuple[bytes, str], tuple[int, int]] = dict.fromkeys(
    ((kind, "committed_step") for kind in (b"worker_hello", b"stopped", b"repaired")),
    (-1, STEP_MAX - 1),
)

#: The envelope epoch a message kind may carry, where narrower than ``0..STEP_MAX``: a
#: restarted manager adopts a registering member's epoch and starts its next round at the
#: epoch after it.
EPOCH_RANGES: dict[bytes, tuple[int, int]] = dict.fromkeys(
    (b"worker_hello", b"agent_hello"), (0, STEP_MAX - 1)
)


def int_range(name: str, kind: bytes = b"") -> tuple[int, int]:
    """The inclusive range of int field ``name`` (of message ``kind``, if given)."""
    return KIND_RANGES.get((kind, name)) or INT_RANGES.get(name, INT64)


def epoch_range(kind: bytes) -> tuple[int, int]:
    """The inclusive range of the envelope epoch of a message of ``kind``."""
    return EPOCH_RANGES.get(kind) or INT_RANGES["epoch"]


#: The length of each str field by name that is shorter than :data:`MAX_STR`: a state digest
#: is a hex CRC-32 (8 characters) or SHA-256 (64), and the manager keeps a few per rank.
STR_LIMITS: dict[str, int] = {"digest": 64, "digests": 64}

#: msgpack's own caps for one frame: strings, binaries, lists and maps; no extension types.
UNPACK_LIMITS: dict[str, int] = {
    "max_str_len": MAX_STR * 4,  # bytes of UTF-8; MAX_STR characters is checked afterwards
    "max_bin_len": MAX_STR,
    "max_array_len": MAX_ITEMS,
    "max_map_len": MAX_ITEMS,
    "max_ext_len": 0,
}


def depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests lists and maps at most ``limit`` deep (iterative: no recursion).
    Only containers are visited (map keys cannot be lists or maps), so a flat body costs one
    pass over its values."""
    if not isinstance(value, (list, dict)):
        return True
    if limit < 1:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, (list, dict)):
                if level >= limit:
                    return False
                stack.append((child, level + 1))
    return True


def show(value: Any) -> str:
    """A short, safe rendering of an untrusted value for an error message (never recurses)."""
    if isinstance(value, (str, bytes)):
        return repr(value[:64])
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)[:64]
    return f"a {type(value).__name__}"


def int_in(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def scalar_ok(value: Any) -> bool:
    """An untyped (``Any``) leaf: None, bool, an int64, a finite float, a bounded str/bytes."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return INT64[0] <= value <= INT64[1]
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (str, bytes)):
        return len(value) <= MAX_STR
    return isinstance(value, (list, dict)) and all_ok(value)


def all_ok(value: list[Any] | dict[Any, Any]) -> bool:
    """Every leaf of a container is :func:`scalar_ok` (iterative; depth checked before)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif not scalar_ok(item):
            return False
    return True


def check_field(value: Any, hint: Any, name: str = "", kind: bytes = b"") -> bool:
    """Whether a decoded value matches a field's type hint and bounds (of message ``kind``,
    if given), elements included."""
    if hint is Any:
        return scalar_ok(value)
    if hint is float:
        lo, hi = FLOAT_RANGES.get(name, (-(2.0**63), 2.0**63))
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and abs(value) < 2.0**63
            and lo <= value <= hi
        )
    if hint is int:
        return int_in(value, *int_range(name, kind))
    if hint is str:
        return isinstance(value, str) and len(value) <= STR_LIMITS.get(name, MAX_STR)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return isinstance(value, list) and all(check_field(v, args[0], name, kind) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            check_field(k, args[0], name, kind) and check_field(v, args[1], name, kind)
            for k, v in value.items()
        )
    return isinstance(value, hint)


def compile_check(hint: Any, name: str = "", kind: bytes = b"") -> Callable[[Any], bool]:
    """:func:`check_field` for one field, built once per message kind: the same answer for
    every decoded value, without walking the type hint again for each value (a node agent's
    heartbeat carries two maps of every local rank, thousands of times a second)."""
    if hint is Any:
        return scalar_ok
    if hint is int:
        lo, hi = int_range(name, kind)
        return lambda v: type(v) is int and lo <= v <= hi
    if hint is str:
        most = STR_LIMITS.get(name, MAX_STR)
        return lambda v: type(v) is str and len(v) <= most
    if hint is bool or hint is bytes:  # as check_field, without walking the hint per value
        return lambda v: isinstance(v, hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if args in ((int,), (int, int)):  # list[int], dict[int, int]: C-level passes, no per-item call
        ints = _ints_in(*int_range(name, kind))
        if origin is list:
            return lambda v: type(v) is list and ints(v)
        return _int_map(*int_range(name, kind))
    if origin is list:
        item = compile_check(args[0], name, kind)
        return lambda v: type(v) is list and all(map(item, v))
    if origin is dict:
        key, val = compile_check(args[0], name, kind), compile_check(args[1], name, kind)
        return lambda v: type(v) is dict and all(key(k) and val(x) for k, x in v.items())
    return lambda v: check_field(v, hint, name, kind)


_INT = frozenset({int})


def _ints_in(lo: int, hi: int) -> Callable[[Any], bool]:
    """Whether every item of a list or dict view is an int (not a bool) within ``lo..hi``."""

    def check(items: Any) -> bool:
        return not items or (
            set(map(type, items)) == _INT and lo <= min(items) and max(items) <= hi
        )

    return check


def _int_map(lo: int, hi: int) -> Callable[[Any], bool]:
    """Whether a value is a dict whose keys and values are ints (not bools) within ``lo..hi``:
    ``_ints_in`` on both views, in one call (a node agent's heartbeat carries two)."""

    def check(v: Any) -> bool:
        if type(v) is not dict:
            return False
        if not v:
            return True
        values = v.values()
        return (
            set(map(type, v)) == _INT
            and set(map(type, values)) == _INT
            and lo <= min(v)
            and max(v) <= hi
            and lo <= min(values)
            and max(values) <= hi
        )

    return check
