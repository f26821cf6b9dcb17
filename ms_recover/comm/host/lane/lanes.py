"""The host backend's fast lane: one authenticated TCP connection per pair of ranks.

ZeroMQ costs a two-rank allreduce about 0.3 ms of per-message work (I/O threads, a poll, a
header codec, mailboxes) where the bytes themselves take 0.02 ms. A lane is a plain TCP
socket per pair of ranks that the training thread reads and writes itself, without copies:
each rank sends its buffer straight from the caller's array and receives the peer's straight
into the output array (see :mod:`~ms_recover.comm.host.lane.exchange`).

* **Endpoint.** Each rank listens on one more ephemeral port, kept across rebuilds, and
  advertises it after its ZeroMQ endpoint: ``tcp://host:port?lane=PORT``. A member whose
  endpoint has no lane (an older build) is reached over ZeroMQ only.
* **Who dials.** Of two ranks, the lower dials the higher, lazily, at their first lane call
  of an epoch. The higher serves its listener whenever it waits on any lane, so a dialer is
  answered while its peer is busy with a third rank.
* **Authentication, once per connection.** The dialer sends ``HELLO`` (epoch, both ranks, a
  nonce); the acceptor answers with its own nonce and ``HMAC(password, "acceptor" | hello |
  nonce)``; the dialer proves itself with ``HMAC(password, "dialer" | hello | nonce)``. Both
  sides check, so neither talks to an impostor, the password never crosses the wire, and a
  recorded proof is useless against a fresh nonce. A refused connection is closed, counted in
  :attr:`WireStats.refused_connections` and logged, rate limited. Without a password (tests
  and benchmarks on one host) the MAC key is empty: that authenticates nothing.
* **Epochs.** A connection belongs to the epoch of its HELLO: older epochs are refused, newer
  ones are kept for after this rank's rebuild, and a rebuild closes every older connection.
* **Abort.** Every wait polls the ZeroMQ link's wake-up pipe, so :meth:`Link.abort` wakes it
  at once; a peer that closes or resets its connection (it died, or it aborted first) is
  treated as a peer that sends nothing: the call waits for the abort (or its timeout) and
  never reports an error of its own, just as over ZeroMQ.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import hmac
import logging
import os
import select
import socket
import struct
import time
from collections.abc import Callable

from ms_recover.comm.host.wire import WireStats
from ms_recover.errors import CommError
from ms_recover.protocol.codec import DropLog

log = logging.getLogger(__name__)

VERSION = 1
HELLO = struct.Struct("<4sBQII16s")  # magic, version, epoch, dialer rank, acceptor rank, nonce
HELLO_MAGIC = b"msrH"
NONCE_BYTES = 16
MAC_BYTES = 32
CHALLENGE_BYTES = NONCE_BYTES + MAC_BYTES
HANDSHAKE_S = 5.0  # an accepted connection must finish its handshake within this
POLL_SLICE_MS = 50  # every wait re-checks the abort flag at least this often
PendingKey = tuple[int, int]  # (epoch, dialer rank)


def lane_endpoint(endpoint: str, port: int) -> str:
    """``endpoint`` with a lane port appended."""
    return f"{endpoint}?lane={port}"


def split_endpoint(endpoint: str) -> tuple[str, tuple[str, int] | None]:
    """The ZeroMQ endpoint and the lane's ``(host, port)``, or None if it advertises no lane."""
    base, sep, query = endpoint.partition("?lane=")
    if not sep:
        return endpoint, None
    host = base.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if not query.isdigit() or not 0 < int(query) < 65536 or not host:
        raise CommError(
            f"data endpoint {endpoint!r} has a bad lane; expected tcp://HOST:PORT?lane=PORT"
        )
    return base, (host, int(query))


def _mac(password: bytes, role: bytes, hello: bytes, nonce: bytes) -> bytes:
    return hmac.new(password, role + b"\0" + hello + nonce, hashlib.sha256).digest()


@dataclasses.dataclass
class _Pending:
    """An accepted connection whose handshake is not done yet."""

    sock: socket.socket
    deadline: float
    buf: bytearray = dataclasses.field(default_factory=bytearray)
    hello: bytes = b""
    nonce: bytes = b""


class PeerGone(Exception):
    """The peer closed or reset its connection (internal: callers wait for the abort)."""


class Lanes:
    """The lane listener and connections of one rank. Training thread only, except that
    :meth:`close` may follow an abort from any thread."""

    def __init__(
        self,
        rank: int,
        bind_host: str,
        password: bytes | None,
        stats: WireStats,
        check: Callable[[], None],
        wake_fd: int,
        timeout: float | None,
    ) -> None:
        self.rank, self.timeout, self.stats, self.epoch = rank, timeout, stats, 0
        self.preempted_until = 0.0  # till then, large calls send from a thread (laneexchange)
        self._key = password or b""
        self._check, self._wake = check, wake_fd
        self._drops = DropLog(log)
        host = "" if bind_host in ("*", "0.0.0.0") else bind_host
        try:
            self._listener = socket.create_server((host, 0), backlog=128)
        except OSError as exc:
            raise CommError(
                f"rank {rank}: cannot bind the data lane on {bind_host!r}: {exc}"
            ) from exc
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._peers: dict[int, tuple[str, int]] = {}
        self._conns: dict[int, socket.socket] = {}  # this epoch's connections by peer rank
        self._parked: dict[PendingKey, socket.socket] = {}  # authenticated, not yet used
        self._pending: dict[int, _Pending] = {}  # by fd
        self._poller = select.poll()  # the wake-up pipe, the listener and pending handshakes
        self._poller.register(wake_fd, select.POLLIN)
        self._poller.register(self._listener, select.POLLIN)

    # -- lifecycle ---------------------------------------------------------------------------

    def build(self, epoch: int, peers: dict[int, tuple[str, int]]) -> None:
        """Start ``epoch`` with these lane addresses: older connections are closed."""
        for sock in self._conns.values():
            sock.close()
        self._conns = {}
        for key in [k for k in self._parked if k[0] < epoch]:
            self._parked.pop(key).close()
        self.epoch, self._peers = epoch, dict(peers)

    def add(self, peers: dict[int, tuple[str, int]]) -> None:
        """Lane addresses learnt within the epoch (a group created since the build): both
        ranks of a pair must know each other's, or one would use the lane and the other not."""
        for peer, addr in peers.items():
            self._peers.setdefault(peer, addr)

    @property
    def wake_fd(self) -> int:
        return self._wake

    def check_now(self) -> None:
        """Raise Interrupted after an abort (CommError once closed); any thread."""
        self._check()

    def has(self, peer: int) -> bool:
        return peer in self._peers

    def close(self) -> None:
        for sock in [*self._conns.values(), *self._parked.values()]:
            sock.close()
        for pending in self._pending.values():
            pending.sock.close()
        self._conns, self._parked, self._pending = {}, {}, {}
        self._listener.close()

    def drop(self, peer: int) -> None:
        """Forget the connection to ``peer`` (after a protocol error it is out of step)."""
        sock = self._conns.pop(peer, None)
        if sock is not None:
            sock.close()

    # -- connections ---------------------------------------------------------------------------

    def conn(self, peer: int, deadline: float | None) -> socket.socket:
        """This epoch's authenticated connection to ``peer``, dialled or awaited as needed.
        Raises PeerGone if the peer cannot be reached."""
        sock = self._conns.get(peer)
        if sock is not None:
            return sock
        if self.rank < peer:
            sock = self._dial(peer, deadline)
        else:
            key = (self.epoch, peer)
            while key not in self._parked:
                self.wait(None, 0, deadline, f"rank {peer} to connect")
            sock = self._parked.pop(key)
        self._conns[peer] = sock
        return sock

    def _dial(self, peer: int, deadline: float | None) -> socket.socket:
        host, port = self._peers[peer]
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[
                0
            ]
        except OSError as exc:
            raise CommError(
                f"rank {peer}'s data lane {host}:{port} does not resolve: {exc}"
            ) from exc
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if sock.connect_ex(addr) not in (0, errno.EINPROGRESS):
                raise PeerGone
            self.wait(sock, select.POLLOUT, deadline, f"a connection to rank {peer}")
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                raise PeerGone
            nonce = os.urandom(NONCE_BYTES)
            hello = HELLO.pack(HELLO_MAGIC, VERSION, self.epoch, self.rank, peer, nonce)
            self.send_all(sock, hello, deadline, f"a handshake with rank {peer}")
            reply = self.recv_exact(sock, CHALLENGE_BYTES, deadline, f"rank {peer}'s handshake")
            theirs, mac = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
            if not hmac.compare_digest(mac, _mac(self._key, b"acceptor", hello, theirs)):
                raise CommError(
                    f"rank {self.rank}: the data lane at {host}:{port} failed to prove it is "
                    f"rank {peer} of this job (wrong job secret or not a rank); not sending to it"
                )
            self.send_all(sock, _mac(self._key, b"dialer", hello, theirs), deadline, "a proof")
        except BaseException:
            sock.close()
            raise
        return sock

    # -- waiting (serves the listener and pending handshakes meanwhile) ----------------------

    def wait(
        self, sock: socket.socket | None, events: int, deadline: float | None, what: str
    ) -> None:
        """Return once ``sock`` has one of ``events`` (or, with no socket, after any event).
        Raises Interrupted on abort, CommError at the deadline."""
        while True:
            self._check()
            if sock is None:
                ready = self._poller.poll(self._slice_ms(deadline))
            else:
                self._poller.register(sock, events)
                try:
                    ready = self._poller.poll(self._slice_ms(deadline))
                finally:
                    self._poller.unregister(sock)
            mine = False
            for fd, _ in ready:
                if fd == self._listener.fileno():
                    self._accept()
                elif fd in self._pending:
                    self._advance(fd)
                elif sock is not None and fd == sock.fileno():
                    mine = True
            if self._pending:
                self._expire()
            if mine or (sock is None and ready):
                return
            if deadline is not None and time.monotonic() > deadline:
                raise CommError(
                    f"rank {self.rank}: nothing for {self.timeout}s while waiting for {what} "
                    f"(epoch {self.epoch})"
                )

    def wait_for_abort(self, peer: int, deadline: float | None, what: str) -> None:
        """A peer that hung up sends nothing more: wait for the abort (raises Interrupted) or
        for the deadline (raises CommError naming the peer)."""
        while True:
            try:
                self.wait(None, 0, deadline, what)
            except CommError as exc:
                if "nothing for" in str(exc):
                    raise CommError(
                        f"rank {self.rank}: nothing from rank {peer} for {self.timeout}s while "
                        f"waiting for {what} (epoch {self.epoch}; it closed the connection)"
                    ) from None
                raise

    def _slice_ms(self, deadline: float | None) -> int:
        slice_ms = POLL_SLICE_MS
        if deadline is not None:
            slice_ms = max(0, min(slice_ms, int((deadline - time.monotonic()) * 1000) + 1))
        return slice_ms

    def send_all(self, sock: socket.socket, data: bytes, deadline: float | None, what: str) -> None:
        view, sent = memoryview(data), 0
        while sent < len(view):
            try:
                sent += sock.send(view[sent:])
            except BlockingIOError:
                self.wait(sock, select.POLLOUT, deadline, what)
            except OSError as exc:
                raise PeerGone from exc

    def recv_exact(
        self, sock: socket.socket, size: int, deadline: float | None, what: str
    ) -> bytes:
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        while got < size:
            try:
                n = sock.recv_into(view[got:])
            except BlockingIOError:
                self.wait(sock, select.POLLIN, deadline, what)
                continue
            except OSError as exc:
                raise PeerGone from exc
            if n == 0:
                raise PeerGone
            got += n
        return bytes(buf)

    # -- the acceptor's side of the handshake ----------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: try again at the next poll
                log.warning("rank %d: data lane accept failed: %s", self.rank, exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pending[sock.fileno()] = _Pending(sock, time.monotonic() + HANDSHAKE_S)
            self._poller.register(sock, select.POLLIN)

    def _advance(self, fd: int) -> None:
        """Read what arrived on a pending connection; answer HELLO, check the proof."""
        p = self._pending[fd]
        want = (HELLO.size if not p.hello else MAC_BYTES) - len(p.buf)
        try:
            data = p.sock.recv(want)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._refuse(fd, "closed during the handshake")
            return
        p.buf += data
        if not p.hello and len(p.buf) == HELLO.size:
            self._answer(fd, p)
        elif p.hello and len(p.buf) == MAC_BYTES:
            self._admit(fd, p)

    def _answer(self, fd: int, p: _Pending) -> None:
        magic, version, epoch, src, dst, _ = HELLO.unpack(bytes(p.buf))
        if magic != HELLO_MAGIC or version != VERSION or dst != self.rank or src >= self.rank:
            self._refuse(fd, f"a bad hello (from rank {src} to rank {dst}, version {version})")
            return
        if epoch < self.epoch:
            self.stats.stale_dropped += 1
            self._refuse(fd, f"rank {src} dialled for old epoch {epoch}", count=False)
            return
        p.hello, p.buf, p.nonce = bytes(p.buf), bytearray(), os.urandom(NONCE_BYTES)
        try:  # 48 bytes on a fresh connection: the kernel takes them at once
            p.sock.send(p.nonce + _mac(self._key, b"acceptor", p.hello, p.nonce))
        except OSError:
            self._refuse(fd, "closed during the handshake")

    def _admit(self, fd: int, p: _Pending) -> None:
        if not hmac.compare_digest(bytes(p.buf), _mac(self._key, b"dialer", p.hello, p.nonce)):
            self._refuse(fd, "a wrong proof of the job secret")
            return
        del self._pending[fd]
        self._poller.unregister(fd)
        _, _, epoch, src, _, _ = HELLO.unpack(p.hello)
        old = self._parked.pop((epoch, src), None)
        if old is not None:  # the same peer dialled again (it restarted): the newest wins
            old.close()
        self._parked[(epoch, src)] = p.sock

    def _expire(self) -> None:
        now = time.monotonic()
        for fd in [fd for fd, p in self._pending.items() if now > p.deadline]:
            self._refuse(fd, f"no handshake within {HANDSHAKE_S:g}s")

    def _refuse(self, fd: int, reason: str, count: bool = True) -> None:
        p = self._pending.pop(fd)
        self._poller.unregister(fd)
        try:
            host, port = p.sock.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        p.sock.close()
        if count:
            self.stats.refused_connections += 1
            self._drops.drop(f"rank {self.rank} refused a data-lane connection: {reason}", peer)
