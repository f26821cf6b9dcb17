"""The two-member allreduce of a small buffer over a lane: one send, one read, one add.

A buffer of at most :data:`SMALL_MAX_BYTES` (the demo's 37 KB gradient) is what a training
step reduces every step, and at that size the bytes cost less than the Python around them.
So this path does the least a full-duplex exchange can: one ``sendmsg`` of the header and the
whole buffer (straight from the caller's array), one ``recvmsg_into`` of the peer's header and
values (straight into the result, or in place into the lane's kept receive buffer), the peer's
header checked by comparing it with this member's own (both build the same one for the same
call), and one add, the lower rank's values first
(:func:`~ms_recover.comm.host.lane.frame.add_in_order`): the same bits as the general exchange
(:mod:`~ms_recover.comm.host.lane.exchange`) on both members.
No objects per call beyond the header, no thread, no wait when the peer's bytes are already
there.

Whatever the kernel does not take or deliver at once (a fresh connection's small send buffer,
a peer that is late) is finished by a plain non-blocking loop that sends what is left, reads
what has arrived and polls when neither moved. It cannot deadlock: the whole message has room
where it lands, so each member always reads what the other sends. In place the sum is written
only once the whole input was sent, so the peer always gets the input as it was.
"""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ms_recover.comm.host.lane.buffers import RecvBuffer
from ms_recover.comm.host.lane.frame import (
    FRAME,
    FRAME_MAGIC,
    Label,
    add_in_order,
    describe,
    frame_error,
    header,
    output,
)
from ms_recover.comm.host.lane.lanes import Lanes, PeerGone
from ms_recover.errors import CommError

SMALL_MAX_BYTES = 64 << 10  # calls up to this many bytes take this path


def exchange(
    lanes: Lanes,
    sock: socket.socket,
    peer: int,
    label: Label,
    flat: NDArray[Any],
    mean: bool,
    after_send: Callable[[], None] | None,
    deadline: float | None,
    into: NDArray[Any] | None,
    spare: RecvBuffer | None,
) -> NDArray[Any]:
    """:func:`laneexchange.exchange <ms_recover.comm.host.lane.exchange.exchange>` of a small
    ``flat`` on the connection ``sock``, with the same arguments, result and guarantees.
    Raises PeerGone if the peer hung up, CommError for a frame of another call."""
    out, inplace = output(flat, into)
    if inplace:
        if spare is None:
            raise AssertionError("an in-place lane exchange needs a RecvBuffer")
        theirs = spare.like(flat, flat.size)
    else:
        theirs = out  # the peer's values land in the result, added there
    head = header(label, 0, flat.nbytes)
    hbuf = bytearray(len(head))
    total = len(head) + flat.nbytes
    try:
        sent = _send(sock, [head, flat])
    except PeerGone:  # it hung up: perhaps on a mismatch, whose header may still be here
        _Rest(lanes, sock, peer, label, head, hbuf, flat, theirs, after_send).last_words(0)
        raise
    if after_send is not None:
        after_send()
    got = _read(sock, [hbuf, theirs])
    if sent != total or got != total or hbuf != head:
        io = _Rest(lanes, sock, peer, label, head, hbuf, flat, theirs, after_send)
        io.finish(sent, got, deadline)
    add_in_order(flat, theirs, out, peer < lanes.rank, mean)
    return out


def _send(sock: socket.socket, bufs: list[Any]) -> int:
    """Bytes the kernel took of ``bufs`` (0 if none fit)."""
    try:
        return sock.sendmsg(bufs)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise PeerGone from exc


def _read(sock: socket.socket, bufs: list[Any]) -> int:
    """Bytes read into ``bufs`` (0 if nothing has arrived); a closed or failed socket is the
    peer gone."""
    try:
        n = sock.recvmsg_into(bufs)[0]
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise PeerGone from exc
    if n == 0:
        raise PeerGone
    return n


class _Rest:
    """What one send and one read did not finish: sent and read until both are whole."""

    def __init__(
        self,
        lanes: Lanes,
        sock: socket.socket,
        peer: int,
        label: Label,
        head: bytes,
        hbuf: bytearray,
        flat: NDArray[Any],
        theirs: NDArray[Any],
        after_send: Callable[[], None] | None,
    ) -> None:
        self.lanes, self.sock, self.peer, self.label = lanes, sock, peer, label
        self.head, self.hbuf, self.after_send = head, hbuf, after_send
        self.src, self.dst = flat.view(np.uint8), theirs.view(np.uint8)
        self.total = len(head) + flat.nbytes
        self.sent = 0  # bytes of this member's message the kernel took

    def finish(self, sent: int, got: int, deadline: float | None) -> None:
        """Send from byte ``sent`` and read from byte ``got`` of the message until both are
        whole; the peer's header is checked as soon as enough of it is in.

        A mismatch is raised once this member's own header is out, so that the peer can name
        both calls too. The caller then drops (closes) the lane with the rest of the peer's
        message unread, which resets the connection: the peer's next send fails, but what
        arrived before the reset is still readable, and :meth:`last_words` reads it, so the
        peer reports the mismatch rather than a hang-up."""
        try:
            self._finish(sent, got, deadline)
        except CommError:
            with contextlib.suppress(PeerGone, CommError):  # the mismatch is what to report
                self._send_header(deadline)
            raise

    def _send_header(self, deadline: float | None) -> None:
        while self.sent < len(self.head):
            self.lanes.wait(self.sock, select.POLLOUT, deadline, describe(self.label, self.peer))
            self.sent += _send(self.sock, [memoryview(self.head)[self.sent :]])

    def _finish(self, sent: int, got: int, deadline: float | None) -> None:
        self.sent = sent
        self._check(got)
        moved = True  # the caller just tried both ways: a wait comes first if neither moved
        if sent == self.total and not got:
            moved = False  # the common case: all sent, nothing arrived yet
        while sent < self.total or got < self.total:
            if not moved:
                events = (select.POLLOUT if sent < self.total else 0) | (
                    select.POLLIN if got < self.total else 0
                )
                self.lanes.wait(self.sock, events, deadline, describe(self.label, self.peer))
            try:
                n = (
                    _send(self.sock, self._parts(self.head, self.src, sent))
                    if sent < self.total
                    else 0
                )
            except PeerGone:
                self.last_words(got)
                raise
            if n and self.after_send is not None:
                self.after_send()
            m = _read(self.sock, self._parts(self.hbuf, self.dst, got)) if got < self.total else 0
            sent, got, moved = sent + n, got + m, bool(n or m)
            self.sent = sent
            if m:
                self._check(got)

    def last_words(self, got: int) -> None:
        """The peer hung up: read what it sent before (from byte ``got``), raising CommError
        if its header differs from this member's; returns when nothing more is there."""
        while got < self.total:
            try:
                m = _read(self.sock, self._parts(self.hbuf, self.dst, got))
            except PeerGone:
                return
            if not m:
                return
            got += m
            self._check(got)

    @staticmethod
    def _parts(head: Any, body: NDArray[np.uint8], start: int) -> list[Any]:
        """The message from byte ``start``: what is left of the header, then of the body."""
        if start < len(head):
            return [memoryview(head)[start:], body]
        return [body[start - len(head) :]]

    def _check(self, got: int) -> None:
        """Raise CommError once what arrived of the peer's header differs from this member's
        and the peer's header is in (its fixed part says how long the rest is)."""
        fixed, mine = FRAME.size, len(self.head)
        if got < fixed or (self.hbuf[:fixed] == self.head[:fixed] and got < mine):
            return
        if got >= mine and self.hbuf == self.head:
            return
        magic, glen, mlen, _, _, _ = FRAME.unpack_from(self.hbuf)
        size = min(fixed + glen + mlen, self.total)
        if magic == FRAME_MAGIC and got < size:
            return  # the rest of the peer's header is on its way: name its call whole
        theirs = bytes(self.hbuf) + self.dst[: max(0, size - mine)].tobytes()
        body = self.total - mine
        exc = frame_error(theirs, self.label, self.peer, self.lanes.rank, (0, body, body))
        raise exc or CommError(f"rank {self.peer} sent a malformed lane frame header")
