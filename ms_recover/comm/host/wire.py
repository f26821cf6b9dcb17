"""Data-plane framing and demultiplexing for the host backend.

A data message is three ZeroMQ frames as the inbound ROUTER sees them:
``[routing id, header, payload]``. The header is a small msgpack list (never pickle)::

    [VERSION, epoch, src, group, tag, kind, offset, meta]

* ``group``/``tag`` name the channel: a collective on ``group`` with op sequence number ``tag``
  (int), or point-to-point traffic (``group == P2P``) with the user's ``tag`` (str).
* ``offset`` is where the payload starts (elements for collectives, bytes for p2p).
* ``meta`` is the call signature (e.g. ``<f4:1000``) so mismatched calls fail loudly.

The payload stays a zero-copy :class:`zmq.Frame`. :class:`Mailboxes` sorts incoming messages
into FIFO queues per (epoch, src, group, tag): frames from older epochs are dropped and
counted, frames from newer epochs are kept, because a peer may rebuild before this rank does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from typing import Any

import msgpack
import zmq

from ms_recover.errors import ProtocolError
from ms_recover.protocol.bounds import depth_ok, show

log = logging.getLogger(__name__)

VERSION = 1
P2P = ""  # group of point-to-point traffic; real group names are never empty
KINDS = frozenset({"allreduce", "broadcast", "barrier", "p2p"})
MAX_HEADER_BYTES = 4096

Key = tuple[int, int, str, int | str]  # (epoch, src, group, tag)


@dataclasses.dataclass(frozen=True, slots=True)
class Header:
    """The routing header of one data frame."""

    epoch: int
    src: int
    group: str
    tag: int | str
    kind: str
    offset: int
    meta: str

    def encode(self) -> bytes:
        fields = [
            VERSION,
            self.epoch,
            self.src,
            self.group,
            self.tag,
            self.kind,
            self.offset,
            self.meta,
        ]
        return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]

    @property
    def key(self) -> Key:
        return (self.epoch, self.src, self.group, self.tag)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Header:
        """Parse and type-check a header; raises ProtocolError on anything else."""
        if len(data) > MAX_HEADER_BYTES:
            raise ProtocolError(f"header of {len(data)} bytes exceeds {MAX_HEADER_BYTES}")
        try:
            fields = msgpack.unpackb(data, raw=False, use_list=True)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise ProtocolError(f"malformed header: {exc}") from exc
        if not depth_ok(fields, 1):  # a header is flat; repr() of a deep value would recurse
            raise ProtocolError("header must be a flat list of 8 fields, got a nested value")
        if not isinstance(fields, list) or len(fields) != 8:
            raise ProtocolError(f"header must be a list of 8 fields, got {show(fields)}")
        version, epoch, src, group, tag, kind, offset, meta = fields
        if version != VERSION or not _is_int(version):
            raise ProtocolError(f"header version {show(version)} is not {VERSION}")
        if not (_is_int(epoch) and _is_int(src) and _is_int(offset)) or min(epoch, offset) < 0:
            raise ProtocolError("header epoch/src/offset must be ints, epoch/offset >= 0")
        if not (isinstance(group, str) and isinstance(meta, str)):
            raise ProtocolError("header group/meta must be strings")
        if not (_is_int(tag) or isinstance(tag, str)) or kind not in KINDS:
            raise ProtocolError(f"bad header tag {show(tag)} or kind {show(kind)}")
        return cls(epoch, src, group, tag, kind, offset, meta)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass
class WireStats:
    """Counters of what the demultiplexer did with inbound frames."""

    delivered: int = 0
    stale_dropped: int = 0  # epoch older than ours: a leftover of an aborted epoch
    malformed_dropped: int = 0  # not a data frame at all
    future_buffered: int = 0  # epoch newer than ours: kept for after our rebuild
    refused_connections: int = 0  # peers without the job's credentials (see hostauth)
    lane_threaded: int = 0  # lane calls that sent from a helper thread (preempted; laneexchange)


class Mailboxes:
    """Per-(epoch, src, group, tag) FIFO queues of (header, payload frame)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.stats = WireStats()
        self._boxes: dict[Key, deque[tuple[Header, zmq.Frame]]] = {}
        self._last_warning = ""

    def deliver(self, frames: list[zmq.Frame]) -> None:
        """File one inbound message; never raises on bad input (it is counted and logged)."""
        if len(frames) != 3:
            self._malformed(f"expected 3 frames [id, header, payload], got {len(frames)}")
            return
        try:
            header = Header.decode(frames[1].buffer)
        except ProtocolError as exc:
            self._malformed(str(exc))
            return
        if header.epoch < self.epoch:
            self.stats.stale_dropped += 1
            return
        if header.epoch > self.epoch:
            self.stats.future_buffered += 1
        self.stats.delivered += 1
        box = self._boxes.get(header.key)
        if box is None:
            box = self._boxes[header.key] = deque()
        box.append((header, frames[2]))

    def pop(self, key: Key) -> tuple[Header, zmq.Frame] | None:
        box = self._boxes.get(key)
        if not box:
            return None
        item = box.popleft()
        if not box:
            del self._boxes[key]
        return item

    def advance(self, epoch: int) -> None:
        """Move to ``epoch``: drop everything older, keep what peers already sent for it."""
        self.epoch = epoch
        for key in [k for k in self._boxes if k[0] < epoch]:
            self.stats.stale_dropped += len(self._boxes.pop(key))

    def pending(self) -> int:
        return sum(len(box) for box in self._boxes.values())

    def _malformed(self, reason: str) -> None:
        self.stats.malformed_dropped += 1
        if reason != self._last_warning:  # one line per distinct reason in a row, not a flood
            self._last_warning = reason
            log.warning(
                "host backend dropped a malformed data frame: %s (%d so far)",
                reason,
                self.stats.malformed_dropped,
            )
