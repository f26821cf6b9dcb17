"""The two-member allreduce over a lane: one full-duplex exchange, added as it arrives.

Each member sends its whole buffer to the other, straight from the caller's array, and adds
the other's as it arrives, in spans of :data:`ADD_SPAN_BYTES`, always the lower rank's values
first. So both members hold the same bits, NaN payloads included, and a rerun gives the same
bits. MEAN halves each span's sum once, on both members alike: the same bits as dividing the
whole sum by two afterwards.

Where the peer's values land: a call of at most :data:`RING_BYTES` receives them straight into
the output (the caller's ``out``, or a new array) and adds in place there. A larger one
receives them into a ring of about :data:`RING_BYTES` kept across calls
(:mod:`~ms_recover.comm.host.lane.buffers`; small enough to stay in cache) and adds ring and input
into the output: the kernel's copy then writes warm memory, and the output is written once.
In place (``out`` the input itself, as a training step reduces its gradient buffer) the ring
is used at any size, and a span is summed into the input only once this member has sent it
(the kernel has copied it), so the peer always gets the input as it was.

One thread does both directions with non-blocking sockets, in lockstep with its adds: it
sends at most :data:`SEND_AHEAD_BYTES` (and at least two spans) past what it has summed, reads
what has arrived, adds what is whole, and polls only when none of that made progress. The
bytes it sends were just read (or are about to be added) and the bytes it adds just arrived,
so both are still in cache: on two cores the exchange is CPU-bound, and that is what brings it
near a raw socket exchange. No deadlock: a member held back by its lead waits for the peer's
bytes, and the peer, whose lead is at least a span, always has a span to send (see
:meth:`_Exchange.loop`). A buffer small enough for the kernel's socket buffers (the 37 KB of a
demo gradient) costs one send, one poll and one read.

The lockstep holds only while both ranks get their cores. On a loaded host (other processes
on the same cores) a rank that waits for a descheduled peer cannot send past its lead, and
a rank with one thread gets one share of the cores. So a call of :data:`THREAD_MIN_BYTES` or
more watches its thread: once it has waited for a core (runnable while another thread or
process held it: the kernel's ``/proc/thread-self/schedstat``) more than
:data:`PREEMPTED_MS` and more than :data:`PREEMPTED_SHARE` of the call so far, a helper
thread sends the rest of the buffer while the caller's thread receives and adds (as a
threaded raw exchange would), and the rank's large calls of the next
:data:`PREEMPTED_HOLD_S` start that way. (16 and 64 MiB on two cores, interleaved in one run:
quiet, the lockstep reached 76-89 % of a raw exchange, the sender thread 62-74 %; with two
busy processes beside the ranks, the lockstep 50-76 %, the sender thread 76-114 %, the
watching call 78-95 %.) Without schedstat a call stays in lockstep. The helper is joined
before the call returns and stops within :data:`SENDER_SLICE_MS` of an abort. In place, a
full ring then waits for the helper's sends. The bytes that cross each way are exactly the
buffer's (plus a header of about 40 bytes per :data:`FRAME_MAX_BYTES`).

On the wire a message is frames ``[FRAME header, group, meta, payload]`` (see
:mod:`~ms_recover.comm.host.lane.frame`). A frame of another call (a different group, sequence or
signature) fails the call with CommError naming both calls, rather than deadlocking.

A call of at most :data:`~ms_recover.comm.host.lane.small.SMALL_MAX_BYTES` takes the latency path
of :mod:`~ms_recover.comm.host.lane.small` instead: the same frames, the same bits.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from numpy.typing import NDArray

from ms_recover.comm.host.lane import small as lanesmall
from ms_recover.comm.host.lane.buffers import RecvBuffer
from ms_recover.comm.host.lane.frame import (
    FRAME,
    add_in_order,
    describe,
    frame_error,
    header,
    output,
)
from ms_recover.comm.host.lane.lanes import Lanes, PeerGone
from ms_recover.errors import CommError

FRAME_MAX_BYTES = 64 << 20  # a message is cut into frames of at most this many bytes
ADD_SPAN_BYTES = 256 << 10  # add what has arrived in spans of this (and what is left at the end)
IOV_MAX = 64  # buffers handed to one sendmsg
RECV_MAX = 1 << 20  # read at most this much at once (the ring bounds it too)
SEND_AHEAD_BYTES = 512 << 10  # one thread sends at most this (at least 2 spans) past its adds
THREAD_MIN_BYTES = 4 << 20  # from this size a call may hand its sends to a helper thread
# ... once its thread waited this long for a core, and this share of the call so far (a
# quiet two-core host: up to 3.3 ms of 4.4-13 ms calls, a woken rank queued behind its waker):
PREEMPTED_MS = 5.0
PREEMPTED_SHARE = 0.25
SCHEDSTAT = "/proc/thread-self/schedstat"  # on-core ns, run-queue ns, time slices
PREEMPTED_HOLD_S = 5.0  # a preempted call's rank starts its large calls threaded this long
WATCH_TURNS = 16  # a call looks at schedstat (7 us) every this many turns (a wait is one)
RING_BYTES = 1 << 20  # larger calls and in place: the peer's values wait in a ring of about this
SENDER_SLICE_MS = 50


def exchange(
    lanes: Lanes,
    peer: int,
    label: tuple[str, int, str],
    flat: NDArray[Any],
    mean: bool,
    after_send: Callable[[], None] | None,
    deadline: float | None,
    into: NDArray[Any] | None = None,
    spare: RecvBuffer | None = None,
) -> NDArray[Any]:
    """The sum (or mean) of ``flat`` and ``peer``'s, identical on both; ``label`` is the
    call's (group, seq, signature). Raises Interrupted on abort, CommError otherwise.

    ``into``: a writeable 1-D array of ``flat``'s dtype and size that receives the result and
    is returned: memory that does not overlap ``flat``, or (with ``spare``) ``flat``'s own.
    None: a new array. ``spare``: the ring the peer's values land in, in place or above
    :data:`RING_BYTES` (without it they land in the result). A call that raises may have
    written part of ``into`` (in place: of ``flat``): its contents are then undefined."""
    try:
        sock = lanes.conn(peer, deadline)
        if flat.nbytes <= lanesmall.SMALL_MAX_BYTES:
            return lanesmall.exchange(
                lanes, sock, peer, label, flat, mean, after_send, deadline, into, spare
            )
        run = _Exchange(lanes, sock, peer, label, flat, after_send, mean)
        run.target(into, spare)
        out = run.loop(deadline, describe(label, peer))
    except PeerGone:
        lanes.drop(peer)
        lanes.wait_for_abort(peer, deadline, describe(label, peer))
        raise AssertionError("unreachable: wait_for_abort always raises") from None
    except CommError:
        lanes.drop(peer)  # its stream is out of step now
        raise
    return out


def run_queue_s() -> float | None:
    """Seconds this thread has spent runnable but waiting for a core (the kernel's schedstat:
    preempted, or woken with every core busy); None where the kernel does not say."""
    try:
        fd = os.open(SCHEDSTAT, os.O_RDONLY)
        try:
            return int(os.read(fd, 128).split()[1]) / 1e9
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return None


class _Preemption:
    """How long a call's thread has waited for a core since the call began. Neither its own
    waits on the socket nor the kernel's interrupt work count, only other threads and
    processes holding the cores (a quiet two-core host: mostly under 1 ms per 16 MiB call;
    two busy processes beside the two ranks: 4-16 ms, 30-50 % of each call)."""

    def __init__(self) -> None:
        self.start, self.queued = time.monotonic(), run_queue_s()

    def lost(self) -> bool:
        """Whether that is over PREEMPTED_MS and over PREEMPTED_SHARE of the call so far."""
        now = run_queue_s()
        if self.queued is None or now is None:
            return False  # no schedstat: the lockstep throughout
        waited, wall = now - self.queued, time.monotonic() - self.start
        return waited > PREEMPTED_MS / 1000 and waited > wall * PREEMPTED_SHARE


class _Exchange:
    """The send and receive state of one exchange."""

    def __init__(
        self,
        lanes: Lanes,
        sock: socket.socket,
        peer: int,
        label: tuple[str, int, str],
        flat: NDArray[Any],
        after_send: Callable[[], None] | None,
        mean: bool,
    ) -> None:
        self.lanes, self.sock, self.peer, self.after_send = lanes, sock, peer, after_send
        self.group, self.seq, self.meta = label
        self.flat, self.mean = flat, mean
        self.low_first = peer < lanes.rank
        self.total = flat.nbytes
        self.tail = self.group.encode() + self.meta.encode()
        # What is still to send, each with the payload offset its last byte ends at (-1: a
        # header); ``sent`` payload bytes have been taken by the kernel (the helper thread
        # writes it, this one reads it: an int, so no lock is needed under the GIL).
        self.outbox = self._frames(flat.data.cast("B"))
        self.sent = 0
        self.head = bytearray(FRAME.size + len(self.tail))
        self.head_got = 0  # bytes of the current frame's header read so far (0: none yet)
        self.frame_end = 0  # end offset of the payload being read (0: reading a header)
        self.got = 0  # payload bytes received
        self.added = 0  # elements summed so far
        self.span = max(1, ADD_SPAN_BYTES // flat.itemsize)
        # The one thread's lead past its adds; a buffer within it goes out whole at once.
        self.lead = max(SEND_AHEAD_BYTES, 2 * self.span * flat.itemsize)
        self.paced = self.total > self.lead
        self.sending = False  # a helper thread owns the outbox (see _threaded)
        self.progress = threading.Condition()  # notified as the helper sends (in place)
        self.errors: list[BaseException] = []  # the helper's

    def target(self, into: NDArray[Any] | None, spare: RecvBuffer | None) -> None:
        """Where the result goes (``out``) and where the peer's bytes land (``recv``)."""
        self.out, self.inplace = output(self.flat, into)
        if self.inplace and spare is None:
            raise AssertionError("an in-place lane exchange needs a RecvBuffer")
        span_bytes = self.span * self.flat.itemsize  # the ring holds whole spans
        ring = self.span * max(1, RING_BYTES // span_bytes)
        if spare is not None and (self.inplace or self.flat.size > ring):
            self.recv = spare.like(self.flat, ring)
        else:
            self.recv = self.out  # the peer's values land in the result, added there
        self.dst = self.recv.data.cast("B")
        self.ring, self.ring_bytes = self.recv.size, self.recv.nbytes

    def _frames(self, src: memoryview) -> list[tuple[memoryview, int]]:
        bufs: list[tuple[memoryview, int]] = []
        for start in range(0, self.total, FRAME_MAX_BYTES):
            size = min(FRAME_MAX_BYTES, self.total - start)
            head = header((self.group, self.seq, self.meta), start, size)
            bufs += [(memoryview(head), -1), (src[start : start + size], start + size)]
        return bufs

    def loop(self, deadline: float | None, what: str) -> NDArray[Any]:
        """Send, receive and add until all is summed. A send held back by the lead waits for
        an add, an add for bytes to arrive; it never waits for nothing: if this member cannot
        add, it has less than a span it has not summed, so the peer has sent less than a span
        past this member's adds, less than its lead past its own: it can send, and does.

        A call of THREAD_MIN_BYTES or more whose thread is preempted (see the module) goes on
        with a helper thread sending, from the start while the rank's hold lasts."""
        watch = None
        if self.total >= THREAD_MIN_BYTES:
            if time.monotonic() < self.lanes.preempted_until:
                return self._threaded(deadline, what)
            watch = _Preemption()
        turns = 0
        while self.outbox or self.got < self.total:
            if watch is not None and turns % WATCH_TURNS == 0 and watch.lost():
                self.lanes.preempted_until = time.monotonic() + PREEMPTED_HOLD_S
                return self._threaded(deadline, what)
            turns += 1
            moved = self._send()
            if self.got < self.total:
                moved = self._recv() or moved
            if self.inplace:  # a send may have made spans summable (others add as they land)
                added = self.added
                self._add(self.got // self.flat.itemsize)
                moved = moved or self.added != added
            if moved:
                continue
            events = (select.POLLOUT if self.outbox and not self._ahead() else 0) | (
                select.POLLIN if self.got < self.total and self._room() else 0
            )
            self.lanes.wait(self.sock, events, deadline, what)
        self._add(self.flat.size)  # in place: the spans that waited for the send
        return self.out

    def _threaded(self, deadline: float | None, what: str) -> NDArray[Any]:
        """Large buffers: a helper thread sends (the GIL is released in the kernel copy)
        while this thread receives and adds, as a threaded raw exchange would. The helper
        only sends; it stops at once on abort and is always joined before this returns."""
        self.lanes.stats.lane_threaded += 1
        self.sending = True
        helper = threading.Thread(target=self._send_all, daemon=True)
        helper.start()
        try:
            while self.got < self.total:
                if self._recv():
                    continue
                if self._room():
                    self.lanes.wait(self.sock, select.POLLIN, deadline, what)
                else:
                    self._wait_sent(deadline, what)
            while helper.is_alive():
                helper.join(SENDER_SLICE_MS / 1000)
                self.lanes.check_now()
                if deadline is not None and time.monotonic() > deadline:
                    raise CommError(
                        f"rank {self.lanes.rank}: rank {self.peer} took more "
                        f"than {self.lanes.timeout}s to take {what}"
                    )
        finally:
            self.sending = False  # the helper sees it within SENDER_SLICE_MS
            helper.join()
        if self.errors:
            raise self.errors[0]
        self._add(self.flat.size)  # in place: the spans that waited for the send
        return self.out

    def _wait_sent(self, deadline: float | None, what: str) -> None:
        """In place, the ring is full of values this rank has not sent yet: wait (at most a
        slice, then check abort and deadline) for the helper to send more."""
        seen = self.sent
        with self.progress:
            self.progress.wait_for(
                lambda: self.sent != seen or bool(self.errors), SENDER_SLICE_MS / 1000
            )
        if self.errors:
            raise self.errors[0]
        self.lanes.check_now()
        if deadline is not None and time.monotonic() > deadline:
            raise CommError(
                f"rank {self.lanes.rank}: rank {self.peer} took more "
                f"than {self.lanes.timeout}s to take {what}"
            )

    def _send_all(self) -> None:
        try:
            while self.outbox and self.sending:
                if not self._send():
                    poller = select.poll()
                    poller.register(self.sock, select.POLLOUT)
                    poller.register(self.lanes.wake_fd, select.POLLIN)
                    poller.poll(SENDER_SLICE_MS)
                    self.lanes.check_now()
        except BaseException as exc:  # handed to the receiving thread
            self.errors.append(exc)
        finally:
            with self.progress:
                self.progress.notify()

    def _ahead(self) -> bool:
        """Whether the one thread has sent as far past its adds as it may."""
        return self.paced and not self.sending and self.sent >= self._send_limit()

    def _send_limit(self) -> int:
        """The payload offset the one thread may send up to: its lead past what it summed."""
        return min(self.total, self.added * self.flat.itemsize + self.lead)

    def _sendable(self) -> list[memoryview]:
        """The outbox's next buffers for one sendmsg: the helper's all; the one thread's up
        to its send limit (a header goes with the payload after it)."""
        if self.sending or not self.paced:
            return [buf for buf, _ in self.outbox[:IOV_MAX]]
        limit, bufs = self._send_limit(), []
        for buf, end in self.outbox[:IOV_MAX]:
            if end < 0:
                bufs.append(buf)
                continue
            start = end - len(buf)
            if start >= limit:
                break
            bufs.append(buf[: limit - start])
            if end > limit:
                break
        return bufs

    def _send(self) -> bool:
        if not self.outbox or self._ahead():
            return False
        try:
            sent = self.sock.sendmsg(self._sendable())
        except BlockingIOError:
            return False
        except OSError as exc:
            raise PeerGone from exc
        while sent:
            first, end = self.outbox[0]
            if sent < len(first):
                self.outbox[0] = (first[sent:], end)
                if end >= 0:
                    self.sent = end - (len(first) - sent)
                break
            sent -= len(first)
            self.outbox.pop(0)
            if end >= 0:
                self.sent = end
        if self.inplace and self.sending:
            with self.progress:
                self.progress.notify()
        if self.after_send is not None:
            self.after_send()
        return True

    def _recv(self) -> bool:
        if self.got >= self.total:
            return False
        if self.frame_end == 0:
            return self._recv_head()
        room = self._space()
        if not room:
            return False
        pos = self.got % self.ring_bytes
        n = self._read(
            self.sock.recv_into, self.dst[pos : pos + min(self.frame_end - self.got, room)]
        )
        if n is None:
            return False
        self._landed(n)
        return True

    def _read(self, recv: Callable[[Any], int], into: Any) -> int | None:
        """``recv(into)``: None if nothing has arrived; a closed or failed socket is the peer
        gone."""
        try:
            n = recv(into)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise PeerGone from exc
        if n == 0:
            raise PeerGone
        return n

    def _landed(self, n: int) -> None:
        """``n`` more payload bytes are in; sum what is whole (ends the frame at its end)."""
        self.got += n
        if self.got == self.frame_end:
            self.frame_end = 0
        self._add(self.got // self.flat.itemsize)

    def _recv_head(self) -> bool:
        """Read a frame header; at its start, together with the payload it announces (one
        read for both, as both are usually here). A header of another call fails the call
        before any of its payload is used (what landed in ``out`` is then never returned)."""
        first = min(FRAME_MAX_BYTES, self.total - self.got, self._space())
        if self.head_got == 0:
            pos = self.got % self.ring_bytes
            buffers = [self.head, self.dst[pos : pos + first]]
            n = self._read(lambda b: self.sock.recvmsg_into(b)[0], buffers)
        else:
            n = self._read(self.sock.recv_into, memoryview(self.head)[self.head_got :])
        if n is None:
            return False
        extra = max(0, self.head_got + n - len(self.head))  # payload bytes read with it
        self.head_got += n - extra
        if self.head_got < FRAME.size:
            return True
        _, glen, mlen, _, _, _ = FRAME.unpack_from(self.head)
        size = FRAME.size + glen + mlen
        if size != len(self.head) or self.head_got == size:
            self.frame_end = self._frame_end(size)  # raises unless a frame of this call
            self.head_got = 0
            self._landed(extra)
        return True

    def _room(self) -> int:
        """Bytes the next read may write (at most RECV_MAX): up to the ring's end, and never
        over values not summed yet."""
        free = self.added * self.flat.itemsize + self.ring_bytes - self.got
        return min(RECV_MAX, self.ring_bytes - self.got % self.ring_bytes, free)

    def _space(self) -> int:
        """:meth:`_room`, after summing what was sent since (in place, a full ring waits for
        this rank's sends)."""
        room = self._room()
        if not room:
            self._add(self.got // self.flat.itemsize)
            room = self._room()
        return room

    def _frame_end(self, size: int) -> int:
        """Check a complete frame header against this call; the end of its payload."""
        nbytes = min(FRAME_MAX_BYTES, self.total - self.got)
        label = (self.group, self.seq, self.meta)
        want = (self.got, nbytes, self.total)
        exc = frame_error(self.head, label, self.peer, self.lanes.rank, want)
        if exc is not None:
            raise exc
        return self.got + nbytes

    def _add(self, arrived: int) -> None:
        """Sum the elements that arrived since the last add (in place: and that were sent),
        if enough or all are ready, a span at a time."""
        ready = min(arrived, self.got // self.flat.itemsize)
        if self.inplace:
            ready = min(ready, self.sent // self.flat.itemsize)
        if ready < self.flat.size:  # whole spans only: no span then crosses the ring's end
            ready = self.added + (ready - self.added) // self.span * self.span
        while self.added < ready:
            a = self.added
            b = min(ready, a + self.span)
            r = a % self.ring
            mine, theirs, out = self.flat[a:b], self.recv[r : r + b - a], self.out[a:b]
            add_in_order(mine, theirs, out, self.low_first, self.mean)
            self.added = b
