"""The sockets of one rank's host data plane, and every blocking wait on them.

* One inbound ROUTER, bound once on an ephemeral port and kept across rebuilds, so a surviving
  rank keeps its endpoint.
* One outbound DEALER per member whose endpoint this rank was given (itself included, so
  sending to oneself is not a special case), recreated on every build. A rank is given only the
  endpoints of the peers it sends to (:mod:`~ms_recover.comm.peers`); sending to a member
  without one raises CommError at once. DEALERs carry no fixed routing id: a restarted peer must
  never collide with the id of its dead predecessor; the sender's rank is in the header.
* With a password (see :mod:`~ms_recover.comm.host.auth`), the ROUTER accepts only peers that
  present it, and the DEALERs present it; with ``curve`` the same holds for the job's CURVE
  keys, and every message is encrypted.
* Every socket caps an inbound message part at ``max_message_bytes`` (``ZMQ_MAXMSGSIZE``):
  libzmq drops a peer that announces a larger one before reading it, so no peer, authenticated
  or not, can make a rank allocate more than that per message.
* Every socket has ``linger=0`` and generous high-water marks; only a graceful :meth:`Link.close`
  lets queued outbound data drain for a bounded time (see there).

zmq sockets are not thread-safe, so everything here runs on the training thread except
:meth:`Link.abort`, which only sets an Event and writes a byte to a pipe that every poll watches.
Every wait is therefore woken at once by an abort, and also re-checks it every
``POLL_SLICE_MS`` as a safety net.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from ms_recover.comm.host.auth import DataCurve, Gatekeeper, configure_client
from ms_recover.comm.host.wire import Header, Key, Mailboxes
from ms_recover.errors import CommError, Interrupted

POLL_SLICE_MS = 50
CLOSE_LINGER_MS = 2000
TRACK_SLICE_S = 0.02
HWM = 100_000  # messages per pipe; a chunk is <= chunk_bytes, so this is not a real limit
MAX_MESSAGE_BYTES = 64 << 20  # default cap of one inbound message part: chunks, manifests
DRAIN_BATCH = 256  # inbound messages read per drain before looking at the caller's mailbox
Payload = Any  # bytes, a C-contiguous numpy array, or a received zmq.Frame (forwarded)


class Link:
    """Sockets, wake-up pipe and abort flag of one rank."""

    def __init__(
        self,
        rank: int,
        bind_host: str,
        advertise_host: str | None,
        timeout: float | None,
        sink: Mailboxes,
        io_threads: int = 1,
        password: bytes | None = None,
        curve: DataCurve | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.rank = rank
        self.timeout = timeout
        self.epoch = 0
        self.after_send: Callable[[], None] | None = None  # the backend's FaultHooks point
        self._sink = sink
        self._password = password
        self._curve = curve
        self._max_message = max_message_bytes
        self._ctx = zmq.Context(io_threads=io_threads)
        self._router = self._socket(zmq.ROUTER)
        self._gate: Gatekeeper | None = None
        if password is not None:
            self._gate = Gatekeeper(self._ctx, self._router, password, rank, sink.stats, curve)
        try:
            port = self._router.bind_to_random_port(f"tcp://{bind_host}")
        except zmq.ZMQError as exc:
            if self._gate is not None:
                self._gate.close()
            self._router.close(linger=0)
            self._ctx.term()
            raise CommError(
                f"rank {rank}: cannot bind the data plane on {bind_host!r}: {exc}"
            ) from exc
        self.endpoint = f"tcp://{advertise_host or bind_host}:{port}"
        self._dealers: dict[int, zmq.Socket[bytes]] = {}
        self._members: frozenset[int] = frozenset()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._aborted = threading.Event()
        self._lock = threading.Lock()  # orders abort() against close() on the pipe
        self._closed = False
        #: Neither closed nor aborted: what a collective's fast path reads (one attribute, no
        #: call); changed only under the lock, with the flags it sums up.
        self.usable = True

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.linger = 0
        sock.sndhwm = HWM
        sock.rcvhwm = HWM
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_message)
        return sock

    # -- lifecycle -------------------------------------------------------------------------

    def connect(self, epoch: int, members: dict[int, str]) -> None:
        """Replace every outbound socket (unsent data is dropped) by one per member with an
        endpoint; an empty endpoint marks a member this rank does not send to."""
        self.check_open()
        for sock in self._dealers.values():
            sock.close(linger=0)
        self._dealers = {}
        self._members = frozenset(members)
        self.epoch = epoch
        self.add_peers({**members, self.rank: self.endpoint})

    def add_peers(self, endpoints: dict[int, str]) -> None:
        """Connect to the members of ``endpoints`` this rank has no socket to yet (within an
        epoch a member's endpoint does not change). CommError for a rank that is not a member
        of the epoch or an unusable endpoint."""
        self.check_open()
        strangers = sorted(r for r in endpoints if r not in self._members)
        if strangers:
            raise CommError(
                f"rank {self.rank}: endpoints of ranks {strangers} that are not members of "
                f"epoch {self.epoch} (members: {sorted(self._members)})"
            )
        for rank, endpoint in sorted(endpoints.items()):
            if not endpoint or rank in self._dealers:
                continue
            sock = self._socket(zmq.DEALER)
            if self._password is not None:
                configure_client(sock, self._password, self._curve)
            try:
                sock.connect(endpoint)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise CommError(f"rank {rank} endpoint {endpoint!r} is not usable: {exc}") from exc
            self._dealers[rank] = sock

    def reaches(self, rank: int) -> bool:
        """True if this rank has an endpoint (a socket) for ``rank`` in this epoch."""
        return rank in self._dealers

    def abort(self) -> None:
        """Make every current and future wait raise Interrupted. Safe from any thread."""
        with self._lock:
            self.usable = False
            self._aborted.set()  # set before the wake byte: a woken poll must see the flag
            if not self._closed:
                try:
                    os.write(self._wake_w, b"\0")
                except BlockingIOError:  # pipe full: a wake-up is pending anyway
                    pass

    def clear_abort(self) -> None:
        with self._lock:
            self._aborted.clear()
            self.usable = not self._closed
        self._drain_wake()

    def close(self) -> None:
        """Close every socket, the pipe and the context. Idempotent.

        Unless aborted, outbound data still queued (the last forwards of a collective that
        already returned here, which a slower peer still needs) gets up to CLOSE_LINGER_MS to
        leave; after an abort it is dropped at once.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.usable = False
            os.close(self._wake_r)
            os.close(self._wake_w)
        linger = 0 if self._aborted.is_set() else CLOSE_LINGER_MS
        for sock in self._dealers.values():
            sock.close(linger=linger)
        if self._gate is not None:
            self._gate.close()
        self._router.close(linger=0)
        self._dealers = {}
        self._ctx.term()  # returns once the dealers' queues are sent or their linger is over

    @property
    def wake_fd(self) -> int:
        """Readable after :meth:`abort`: other waits on the training thread poll it too."""
        return self._wake_r

    def check_open(self) -> None:
        if self._closed:
            raise CommError(f"rank {self.rank}: host backend is closed")

    def check(self) -> None:
        """Raise Interrupted after an abort, CommError after close."""
        self.check_open()
        if self._aborted.is_set():
            raise Interrupted(
                f"rank {self.rank} epoch {self.epoch}: communicator aborted, waiting for rebuild"
            )

    # -- data ------------------------------------------------------------------------------

    def send(
        self, dst: int, header: Header, payload: Payload, track: bool = False
    ) -> zmq.MessageTracker | None:
        """Queue one message to ``dst``; blocks (abortably) only while its queue is full.

        With ``track`` the returned tracker tells when zmq no longer reads ``payload``; small
        payloads are always copied, so only large ones are sent zero-copy.
        """
        sock = self._dealers.get(dst)
        if sock is None:
            raise CommError(self.unreachable(dst))
        data = header.encode()
        deadline = self._deadline()
        try:
            while True:
                try:
                    sock.send(data, zmq.SNDMORE | zmq.NOBLOCK)
                    break
                except zmq.Again:
                    self._wait_writable(sock, dst, deadline)
            # Once the first part is queued, zmq takes the rest of the message without blocking.
            tracker = sock.send(payload, copy=False, track=track)
        except zmq.ZMQError as exc:
            raise CommError(f"rank {self.rank}: sending to rank {dst} failed: {exc}") from exc
        if self.after_send is not None:
            self.after_send()
        return tracker if track else None

    def unreachable(self, dst: int) -> str:
        """Why this rank cannot send to ``dst`` (it has no endpoint for it)."""
        if dst not in self._members:
            return (
                f"rank {self.rank}: rank {dst} is not a member of epoch {self.epoch}"
                f" (members: {sorted(self._members)})"
            )
        return (
            f"rank {self.rank}: no data endpoint for rank {dst} in epoch {self.epoch}: a rank "
            "is sent only the endpoints of the peers it sends to (ring neighbours, group "
            f"members, repair pairs; see ms_recover.comm.peers), and rank {dst} is not one"
        )

    def take(self, key: Key, what: str) -> tuple[Header, zmq.Frame]:
        """Next message of mailbox ``key``, pumping the inbound socket until it arrives."""
        deadline = self._deadline()
        while True:
            self.check()  # first: after an abort, even data already here is not consumed
            item = self._sink.pop(key)
            if item is not None:
                return item
            if self._drain():
                continue
            self._poll(self._poller, deadline)
            if deadline is not None and time.monotonic() > deadline:
                raise CommError(
                    f"rank {self.rank}: nothing from rank {key[1]} for "
                    f"{self.timeout}s while waiting for {what} (epoch {key[0]})"
                )

    def wait_sent(self, trackers: list[zmq.MessageTracker], dst: int, what: str) -> None:
        """Return once zmq is done reading every tracked payload (so the caller may reuse it)."""
        deadline = self._deadline()
        for tracker in trackers:
            while not tracker.done:
                self.check()
                try:
                    tracker.wait(TRACK_SLICE_S)
                except zmq.NotDone:
                    if deadline is not None and time.monotonic() > deadline:
                        raise CommError(
                            f"rank {self.rank}: rank {dst} took more than "
                            f"{self.timeout}s to take {what}"
                        ) from None

    # -- internals -------------------------------------------------------------------------

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _drain(self) -> int:
        """Move up to DRAIN_BATCH waiting inbound messages to the mailboxes."""
        count = 0
        while count < DRAIN_BATCH:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._sink.deliver(frames)
            count += 1
        return count

    def _poll(self, poller: zmq.Poller, deadline: float | None) -> dict[Any, int]:
        slice_ms = POLL_SLICE_MS
        if deadline is not None:
            slice_ms = max(0, min(slice_ms, int((deadline - time.monotonic()) * 1000) + 1))
        events = dict(poller.poll(slice_ms))
        if self._wake_r in events:
            self._drain_wake()
        return events

    def _wait_writable(self, sock: zmq.Socket[bytes], dst: int, deadline: float | None) -> None:
        # Keep reading inbound traffic meanwhile: if every rank waited on a full queue without
        # reading, the ring would deadlock.
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLOUT)
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        self.check()
        self._drain()
        self._poll(poller, deadline)
        if deadline is not None and time.monotonic() > deadline:
            raise CommError(
                f"rank {self.rank}: sending to rank {dst} blocked for more than "
                f"{self.timeout}s (its queue stays full)"
            )

    def _drain_wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
