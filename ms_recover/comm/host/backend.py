"""HostBackend: the CPU data plane, ZeroMQ peer sockets and a ring allreduce over numpy buffers.

Algorithms (``n`` members of a group, ring order = the group's rank order):

* **allreduce**: a ring reduce-scatter then all-gather (:mod:`.ring`), every member ending
  with the same bits, reproducibly. Two members take a latency path instead: one exchange of
  the whole buffer, each adding the lower rank's values first (same bits on both). It runs
  over the pair's lane (a plain TCP connection authenticated once, see :mod:`.lane.lanes` and
  :mod:`.lane.exchange`; up to 64 KiB one send, one read and one add, :mod:`.lane.small`) whenever
  both advertise one, which they do unless the data plane uses CURVE; otherwise over ZeroMQ,
  up to ``EXCHANGE_MAX_BYTES``. More than two members take recursive doubling
  (:mod:`.doubling`) up to ``DOUBLING_MAX_BYTES``.
* **broadcast**: a pipelined chain from the root along the ring.
* **barrier**: dissemination, ``ceil(log2 n)`` rounds of empty messages.
* **send/recv**: a manifest plus a chunked byte stream (see :mod:`.stream`).

A rank holds endpoints only for the peers it sends to (:mod:`~ms_recover.comm.peers`: ring
successor, barrier and recursive-doubling partners of each group it is in, repair pairs, added
by :meth:`HostBackend.add_peers`). A collective on a group where one of those is missing
raises CommError before it sends anything, on the rank that misses it.

Zero-copy sends must not see their buffer change before zmq has read it. Sends from buffers
that go back to the caller (the caller's arrays, the segment a rank finishes reducing) are
tracked and waited for before returning; all-gather forwards re-send the received zmq frame.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import zmq
from numpy.typing import NDArray

from ms_recover.comm.base import CommBackend, ReduceOp, check_out, same_buffer
from ms_recover.comm.grouplog import WORLD, GroupLog
from ms_recover.comm.host import doubling as hostdoubling
from ms_recover.comm.host import ring as hostring
from ms_recover.comm.host import stream as hoststream
from ms_recover.comm.host.auth import DataCurve
from ms_recover.comm.host.call import (
    REDUCIBLE_KINDS,
    Call,
    check_reducible,
    contiguous,
    reduce_op,
    signature,
    take,
    values,
)
from ms_recover.comm.host.lane import exchange as laneexchange
from ms_recover.comm.host.lane.buffers import RecvBuffer, Results, lane_target
from ms_recover.comm.host.lane.lanes import Lanes, lane_endpoint, split_endpoint
from ms_recover.comm.host.link import MAX_MESSAGE_BYTES, Link
from ms_recover.comm.host.wire import P2P, Header, Mailboxes, WireStats
from ms_recover.comm.peers import group_targets
from ms_recover.errors import CommError, ConfigError

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 1 << 20
# Two-member allreduces up to this size take the one-exchange path (see hostring.exchange).
EXCHANGE_MAX_BYTES = 1 << 20
DOUBLING_MAX_BYTES = hostdoubling.DOUBLING_MAX_BYTES


class HostBackend(CommBackend):
    """Host (CPU) communicator of one rank. All calls but :meth:`abort` belong to one thread."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        bind_host: str = "127.0.0.1",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        timeout: float | None = None,
        advertise_host: str | None = None,
        io_threads: int = 2,
        password: bytes | None = None,
        curve: DataCurve | None = None,
        lanes: bool = True,
    ) -> None:
        """Bind the inbound socket now, so :attr:`endpoint` is known before :meth:`init`.

        ``chunk_bytes`` bounds each message; ranks may use different values.
        ``timeout`` (seconds) bounds each wait for a peer; None waits until :meth:`abort`.
        ``advertise_host`` is the address peers dial when ``bind_host`` is a wildcard.
        ``io_threads``: ZeroMQ I/O threads (native, not Python); 2 lets both directions run at once.
        ``password`` (:func:`~ms_recover.comm.host.auth.data_plane_password`): only peers that
        present it may connect, and this rank presents it (a lane proves it by challenge and
        response). ``ms_recover.init`` always sets it;
        None (no authentication) is for benchmarks and tests on one host. ``curve`` (with a
        password) authenticates with the job's CURVE keys instead and encrypts every message.
        An inbound message part is capped at the larger of ``chunk_bytes`` + 4 KiB and
        :data:`~ms_recover.comm.host.link.MAX_MESSAGE_BYTES`: peers must not use larger chunks.
        ``lanes=False`` keeps two-rank allreduces on ZeroMQ too (no lane is advertised; CURVE
        implies it).
        """
        super().__init__(rank, world_size)
        if chunk_bytes < 64:
            raise ConfigError(f"chunk_bytes must be >= 64, got {chunk_bytes}")
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds or None, got {timeout}")
        if io_threads < 1:
            raise ConfigError(f"io_threads must be >= 1, got {io_threads}")
        self.chunk_bytes = chunk_bytes
        # Must be the same on every member: it picks the algorithm both sides follow.
        self.exchange_max_bytes = EXCHANGE_MAX_BYTES
        # Groups of more than two: allreduces up to this size take recursive doubling. Must be
        # the same on every member too.
        self.doubling_max_bytes = DOUBLING_MAX_BYTES
        self._boxes = Mailboxes()
        cap = max(MAX_MESSAGE_BYTES, chunk_bytes + 4096)
        self._link = Link(
            rank, bind_host, advertise_host, timeout, self._boxes, io_threads, password, curve, cap
        )
        self._link.after_send = self._after_send
        self._lanes: Lanes | None = None  # CURVE encrypts ZeroMQ only: no lane then
        if curve is None and lanes:
            try:
                self._lanes = Lanes(
                    rank,
                    bind_host,
                    password,
                    self._boxes.stats,
                    self._link.check,
                    self._link.wake_fd,
                    timeout,
                )
            except CommError:
                self._link.close()
                raise
        self._groups: dict[str, tuple[int, ...]] = {}
        self._seq: dict[str, int] = {}
        self._blind: dict[str, list[int]] = {}  # group -> peers it sends to with no endpoint
        self._built = False
        self._lane_spare = RecvBuffer()  # the lane's receive ring (in place, large calls)
        self._lane_results = Results()  # the lane's results of calls without out=

    def _after_send(self) -> None:
        if self.faults.armed:
            self.faults.after_chunk_sent()

    @property
    def endpoint(self) -> str:
        if self._lanes is None:
            return self._link.endpoint
        return lane_endpoint(self._link.endpoint, self._lanes.port)

    @property
    def stats(self) -> WireStats:
        """Counters of delivered, stale and malformed inbound frames."""
        return self._boxes.stats

    # -- lifecycle -------------------------------------------------------------------------

    def init(self, epoch: int, members: dict[int, str]) -> None:
        if self._built:
            raise CommError(
                f"rank {self.rank}: init() called twice (built at epoch "
                f"{self.epoch}); use rebuild()"
            )
        self._build(epoch, members, GroupLog())

    def rebuild(self, epoch: int, members: dict[int, str], group_log: GroupLog) -> None:
        if self._built and epoch <= self.epoch:
            raise CommError(
                f"rank {self.rank}: rebuild epoch {epoch} is not newer than the "
                f"current epoch {self.epoch}"
            )
        self._build(epoch, members, group_log)

    def _build(self, epoch: int, members: dict[int, str], group_log: GroupLog) -> None:
        if self.rank not in members:
            raise CommError(f"rank {self.rank} is not among the members {sorted(members)}")
        # Clear the abort first: an abort() racing with this rebuild must stay in force.
        self._link.clear_abort()
        split = {r: split_endpoint(e) for r, e in members.items() if r != self.rank}
        self._link.connect(
            epoch, {self.rank: self._link.endpoint} | {r: e for r, (e, _) in split.items()}
        )
        if self._lanes is not None:
            self._lanes.build(epoch, {r: a for r, (_, a) in split.items() if a is not None})
        self.epoch = epoch
        self._boxes.advance(epoch)
        self._groups = {WORLD: tuple(sorted(members))}
        self._seq = {WORLD: 0}
        self._blind = {}
        self._look(WORLD)
        self.group_log = GroupLog()
        self._built = True
        for name, ranks in group_log:
            self._make_group(name, ranks)
            self.group_log.add(name, ranks)
        log.info(
            "host backend built epoch=%d rank=%d world=%s groups=%s endpoint=%s",
            epoch,
            self.rank,
            list(self._groups[WORLD]),
            self.group_log.names(),
            self.endpoint,
        )

    def _make_group(self, name: str, ranks: tuple[int, ...]) -> None:
        if not self._built:
            raise CommError(f"rank {self.rank}: create group {name!r} after init(), not before")
        missing = [r for r in ranks if r not in self._groups[WORLD]]
        if missing:
            raise CommError(
                f"group {name!r}: ranks {missing} are not in the world {list(self._groups[WORLD])}"
            )
        if not name:
            raise CommError(f"a group name must not be empty (ranks {list(ranks)})")
        self._groups[name] = ranks
        self._seq[name] = 0
        self._look(name)

    def _look(self, name: str) -> None:
        """Note which peers this rank sends to in group ``name`` it has no endpoint for."""
        ranks = self._groups[name]
        if self.rank not in ranks:
            self._blind.pop(name, None)
            return
        targets = group_targets(ranks, ranks.index(self.rank))
        self._blind[name] = sorted(r for r in targets if not self._link.reaches(r))

    def add_peers(self, endpoints: dict[int, str]) -> None:
        """Connect to more members of this epoch (a repair pair, a group created since the
        build). CommError for a rank that is not a member."""
        split = {r: split_endpoint(e) for r, e in endpoints.items()}
        self._link.add_peers({r: e for r, (e, _) in split.items()})
        if self._lanes is not None:
            self._lanes.add(
                {r: a for r, (_, a) in split.items() if a is not None and r != self.rank}
            )
        for name in self._groups:
            self._look(name)

    def abort(self) -> None:
        self._link.abort()

    def close(self) -> None:
        self._lane_spare.release()
        self._lane_results.release()
        if self._lanes is not None:
            self._lanes.close()
        self._link.close()

    # -- collectives -----------------------------------------------------------------------

    def _enter(self, group: str, kind: str, meta: str, root: int | None = None) -> Call:
        """Check the rank may call ``kind`` on ``group`` and number the call.

        Every check comes before the numbering: a call refused here leaves the group's op
        sequence as it was, in step with the other members.
        """
        self._link.check()
        if not self._built:
            raise CommError(f"rank {self.rank}: {kind} called before init()")
        ranks = self._groups.get(group)
        if ranks is None:
            raise CommError(f"{kind} on unknown group {group!r}; known: {', '.join(self._groups)}")
        if self.rank not in ranks:
            raise CommError(
                f"rank {self.rank} called {kind} on group {group!r} (ranks "
                f"{list(ranks)}) but is not a member"
            )
        if root is not None and root not in ranks:
            raise CommError(f"{kind} root {root} is not in group {group!r} (ranks {list(ranks)})")
        blind = self._blind.get(group)
        if blind:
            raise CommError(f"{kind} on group {group!r}: {self._link.unreachable(blind[0])}")
        seq = self._seq[group]
        self._seq[group] = seq + 1
        return Call(self.epoch, self.rank, group, ranks, seq, kind, meta)

    def allreduce(
        self,
        array: NDArray[Any],
        op: ReduceOp | str = ReduceOp.SUM,
        group: str = WORLD,
        out: NDArray[Any] | None = None,
    ) -> NDArray[Any]:
        """Sum (or mean) over the group; identical bits on every member; input untouched
        unless it is ``out``. One member with ``out`` the input: nothing to copy or write."""
        if (
            out is array
            and type(array) is np.ndarray
            and self._groups.get(group) == (self.rank,)
            and self._link.usable
            and isinstance(op, str)
            and array.dtype.kind in REDUCIBLE_KINDS.get(op, "")
            and array.flags.carray  # writeable: an ``out`` that could not take a result is refused
        ):
            # In place in a group of just this rank (GraphStep's buckets at one rank, every
            # step): the checks _enter makes, inline, then the call is numbered and there is
            # nothing to copy, send or write. Each Python call costs a few us inside a
            # graph's callback (caches cold after the graph's kernels), so this path makes
            # none; anything unusual (an abort, a bad op or dtype) takes the general path,
            # which raises.
            self._seq[group] += 1
            return array
        which = reduce_op(op)
        # In place (GraphStep's buckets, every step): the array is its own out= and needs one
        # flags check. Each numpy call costs several times more inside a graph's callback
        # than here, so this path makes as few as it can.
        inplace = out is array and type(array) is np.ndarray and array.flags.carray
        src = array if inplace else contiguous(array)
        check_reducible(src.dtype, which)
        if out is not None and not inplace:
            check_out(np.asarray(array), out)
        # A group of one sends no frame: the signature peers compare is not needed there.
        alone = len(self._groups.get(group, ())) == 1
        call = self._enter(group, "allreduce", "" if alone else signature(src))
        if call.n == 1 and inplace:
            return array  # it is out: nothing to copy
        flat = src.reshape(-1)
        if call.n == 1 or flat.size == 0:
            if out is None:
                return flat.copy().reshape(src.shape)
            if not same_buffer(out, np.asarray(array)):
                np.copyto(out, src)
            return out
        mean = which is ReduceOp.MEAN
        if call.n == 2 and self._lanes is not None and self._lanes.has(call.peer(1)):
            deadline = None if self._link.timeout is None else time.monotonic() + self._link.timeout
            label = (call.group, call.seq, call.meta)
            into = lane_target(flat, out, array)
            fresh = self._lane_results.new_like(flat) if out is None else None
            result = laneexchange.exchange(
                self._lanes,
                call.peer(1),
                label,
                flat,
                mean,
                self._after_send,
                deadline,
                fresh if into is None else into,
                self._lane_spare,
            )
            if out is not None and into is not None:
                return out  # the lane wrote the result into it
        elif call.n == 2 and flat.nbytes <= self.exchange_max_bytes:
            result = hostring.exchange(self._link, call, flat, mean, self.chunk_bytes)
        elif call.n > 2 and flat.nbytes <= self.doubling_max_bytes:
            result = hostdoubling.allreduce(self._link, call, flat, mean, self.chunk_bytes)
        else:
            result = hostring.ring(self._link, call, flat, mean, self.chunk_bytes)
        if out is None:
            return result.reshape(src.shape)
        # Every path returns only once no send still reads ``flat`` (the lane joins its sender,
        # trackers are waited for, or see hostring.ring), so overwriting the input here is safe.
        np.copyto(out, result.reshape(src.shape))
        return out

    def broadcast(self, array: NDArray[Any], root: int, group: str = WORLD) -> NDArray[Any]:
        """Root's array on every member (a new array everywhere, the root's input untouched)."""
        src = contiguous(array)
        call = self._enter(group, "broadcast", signature(src), root)
        flat = src.reshape(-1)
        chain = call.ranks[call.ranks.index(root) :] + call.ranks[: call.ranks.index(root)]
        pos = chain.index(self.rank)
        nxt = chain[pos + 1] if pos + 1 < len(chain) else None
        step = max(1, self.chunk_bytes // flat.itemsize)
        if pos == 0:
            if nxt is not None:
                trackers = [
                    self._link.send(nxt, call.header(a), flat[a : a + step], track=True)
                    for a in range(0, flat.size, step)
                ]
                self._link.wait_sent([t for t in trackers if t is not None], nxt, str(call))
            return flat.copy().reshape(src.shape)
        out = np.empty_like(flat)
        got = 0
        while got < flat.size:
            frame = take(self._link, call, chain[pos - 1], got)
            vals = values(call, frame, flat.dtype, got, flat.size)
            out[got : got + vals.size] = vals
            if nxt is not None:
                self._link.send(nxt, call.header(got), frame)
            got += vals.size
        return out.reshape(src.shape)

    def barrier(self, group: str = WORLD) -> None:
        call = self._enter(group, "barrier", "")
        distance, round_ = 1, 0
        while distance < call.n:
            self._link.send(call.peer(distance), call.header(round_), b"")
            take(self._link, call, call.peer(-distance), round_)
            distance, round_ = distance * 2, round_ + 1

    # -- point to point --------------------------------------------------------------------

    def _p2p_check(self, peer: int, tag: str, what: str) -> None:
        self._link.check()
        if not self._built:
            raise CommError(f"rank {self.rank}: {what} called before init()")
        if peer not in self._groups[WORLD] or not isinstance(tag, str):
            raise CommError(
                f"{what}: peer {peer!r} must be one of {list(self._groups[WORLD])}"
                f" and tag a str, got {tag!r}"
            )

    def send(self, arrays: dict[str, NDArray[Any]], dst: int, tag: str = "") -> None:
        """Send named arrays; returns once zmq no longer reads them (they may then change)."""
        self._p2p_check(dst, tag, "send")
        manifest, views = hoststream.flatten(arrays)
        self._link.send(dst, self._p2p_header(tag, 0, "manifest"), manifest)
        trackers: list[zmq.MessageTracker] = []
        for offset, payload, borrowed in hoststream.chunks(views, self.chunk_bytes):
            tracker = self._link.send(
                dst, self._p2p_header(tag, offset, "data"), payload, track=borrowed
            )
            if tracker is not None:
                trackers.append(tracker)
        self._link.wait_sent(trackers, dst, f"send with tag {tag!r}")

    def recv(self, src: int, tag: str = "") -> dict[str, NDArray[Any]]:
        """The named arrays ``src`` sent with ``tag`` (same names, dtypes, shapes, order)."""
        self._p2p_check(src, tag, "recv")
        key = (self.epoch, src, P2P, tag)
        what = f"recv with tag {tag!r} from rank {src}"
        header, frame = self._link.take(key, what)
        if header.meta != "manifest":
            raise CommError(f"{what}: expected a manifest, got {header.meta!r} at {header.offset}")
        arrays, scatter = hoststream.allocate(frame.buffer)
        while scatter.received < scatter.total:
            header, frame = self._link.take(key, what)
            if header.meta != "data" or header.offset != scatter.received:
                raise CommError(
                    f"{what}: expected data at offset {scatter.received}, got "
                    f"{header.meta!r} at {header.offset}"
                )
            scatter.write(frame.buffer)
        return arrays

    def _p2p_header(self, tag: str, offset: int, meta: str) -> Header:
        return Header(self.epoch, self.rank, P2P, tag, "p2p", offset, meta)
