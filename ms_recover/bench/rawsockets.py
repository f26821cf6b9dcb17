"""The raw socket baselines of ``bench allreduce``: plain TCP between the rank processes.

No ZeroMQ, no numpy, no framing: what a user moving the same bytes by hand would write. Each
rank has one connection to its ring successor (and accepts one from its predecessor).
"""

from __future__ import annotations

import select
import socket
import threading

from ms_recover.errors import MsRecoverError


class RawRing:
    """Plain TCP from each rank to its ring successor: the raw baselines, nothing else."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self.right: socket.socket | None = None
        self.left: socket.socket | None = None
        self._buf = bytearray()

    def connect(self, ports: dict[int, int]) -> None:
        right = (self.rank + 1) % self.world
        self.right = socket.create_connection(("127.0.0.1", ports[right]))
        self.left, _ = self._server.accept()
        for sock in (self.right, self.left):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        for sock in (self.right, self.left, self._server):
            if sock is not None:
                sock.close()

    def _buffers(self, nbytes: int) -> tuple[memoryview, memoryview]:
        if len(self._buf) < 2 * nbytes:
            self._buf = bytearray(2 * nbytes)
        view = memoryview(self._buf)
        return view[:nbytes], view[nbytes : 2 * nbytes]

    def exchange(self, nbytes: int, threaded: bool) -> None:
        """Send ``nbytes`` to the successor while receiving as many from the predecessor."""
        assert self.right is not None and self.left is not None
        src, dst = self._buffers(nbytes)
        if threaded:
            sender = threading.Thread(target=self.right.sendall, args=(src,))
            sender.start()
            _recv_exact(self.left, dst)
            sender.join()
        else:
            _polled_exchange(self.right, self.left, src, dst)

    def copy(self, nbytes: int) -> None:
        """Rank 0 sends ``nbytes`` to rank 1, which answers one byte once it has them all."""
        assert self.right is not None and self.left is not None
        src, dst = self._buffers(nbytes)
        if self.rank == 0:
            self.right.sendall(src)
            _recv_exact(self.right, dst[:1])
        elif self.rank == 1:
            _recv_exact(self.left, dst)
            self.left.sendall(b"k")


def _recv_exact(sock: socket.socket, dst: memoryview) -> None:
    got = 0
    while got < len(dst):
        n = sock.recv_into(dst[got:])
        if n == 0:
            raise MsRecoverError("bench: a raw socket peer hung up")
        got += n


def _polled_exchange(
    out: socket.socket, into: socket.socket, src: memoryview, dst: memoryview
) -> None:
    """One thread, non-blocking sockets: send what the kernel takes, read what has arrived."""
    out.setblocking(False)
    into.setblocking(False)
    sent = got = 0
    try:
        while sent < len(src) or got < len(dst):
            moved = False
            if sent < len(src):
                try:
                    sent += out.send(src[sent:])
                    moved = True
                except BlockingIOError:
                    pass
            if got < len(dst):
                try:
                    n = into.recv_into(dst[got:])
                except BlockingIOError:
                    n = -1
                if n == 0:
                    raise MsRecoverError("bench: a raw socket peer hung up")
                if n > 0:
                    got, moved = got + n, True
            if not moved:
                select.select(
                    [into] if got < len(dst) else [], [out] if sent < len(src) else [], []
                )
    finally:
        out.setblocking(True)
        into.setblocking(True)
