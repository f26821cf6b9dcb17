"""Who may connect to a rank's host data plane: ZeroMQ PLAIN credentials checked over ZAP.

Every rank of a job derives the same password from the job secret (``MS_RECOVER_SECRET``, see
:meth:`~ms_recover.config.JobConfig.effective_secret`) and the job id, with HMAC-SHA256. A rank's
inbound ROUTER is a PLAIN server; its outbound DEALERs present the password. A
:class:`Gatekeeper` thread answers libzmq's ZAP requests for the rank's context, so a connection
is refused during the handshake, before any of its frames reaches the mailboxes, unless it
presents the password: a peer of another job, a stray client, a port scanner. Refusals are
counted in :class:`~ms_recover.comm.host.wire.WireStats` and logged, rate limited.

Two ways a connection is refused, both seen here:

* wrong user or password: the ZAP reply is 400 (the peer's address is logged);
* no credentials at all (a NULL-mechanism client, e.g. a bare ZeroMQ socket): libzmq fails the
  handshake itself; the ROUTER's monitor socket reports it.

PLAIN sends the password in clear over the wire; it authenticates peers, it does not hide the
data (use a private pod network). The password is derived per job, so it reveals nothing about
the secret, and the control plane's HMAC is unaffected. The cost is one handshake per
connection, none per frame.

**Without a job secret the password protects nothing**: it is then derived from the job id
(:meth:`~ms_recover.config.JobConfig.effective_secret`), which anyone can compute, so it only
keeps two jobs from connecting to each other by mistake.

**CURVE** (``MS_RECOVER_DATA_CURVE=1``, needs a secret): instead of PLAIN, every ROUTER is a
CURVE server and every DEALER a CURVE client, with both key pairs derived from the secret
(:class:`DataCurve`); the Gatekeeper admits only the job's client key. Traffic is then
encrypted and authenticated per message, at a cost (``ms-recover bench allreduce`` shows it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import threading

import zmq
from zmq.utils import z85

from ms_recover.comm.host.wire import WireStats
from ms_recover.protocol.codec import DropLog
from ms_recover.protocol.transport import (
    curve_client,
    curve_keys,
    curve_server,
    monitor_event,
)

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27)
USER = b"ms-recover"
POLL_MS = 100
_REFUSED_BY_ZMQ = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def data_plane_password(secret: bytes, job_id: str) -> bytes:
    """The PLAIN password every rank of ``job_id`` presents to its peers."""
    if not secret:
        raise ValueError("the data-plane password needs a non-empty job secret")
    mac = hmac.new(secret, b"ms-recover data plane\0" + job_id.encode(), hashlib.sha256)
    return mac.hexdigest().encode()


@dataclasses.dataclass(frozen=True)
class DataCurve:
    """The data plane's CURVE keys (Z85): one server pair for every rank's ROUTER, one client
    pair for every DEALER. Both derive from the job secret, so only the job's ranks hold them."""

    server: tuple[bytes, bytes]
    client: tuple[bytes, bytes]

    @classmethod
    def derive(cls, secret: bytes, job_id: str) -> DataCurve:
        return cls(
            curve_keys(secret, job_id, "data-server"), curve_keys(secret, job_id, "data-client")
        )

    @property
    def client_public_raw(self) -> bytes:
        """The client public key as ZAP reports it (32 raw bytes)."""
        return z85.decode(self.client[0])


def configure_client(
    sock: zmq.Socket[bytes], password: bytes, curve: DataCurve | None = None
) -> None:
    """Make an outbound socket present the job's credentials (before ``connect``)."""
    if curve is not None:
        curve_client(sock, curve.server[0], curve.client)
        return
    sock.plain_username = USER
    sock.plain_password = password


class Gatekeeper:
    """The ZAP handler of one rank's ZeroMQ context, and the log of refused connections.

    Build it before ``router`` binds (libzmq consults ZAP only if a handler is bound); it makes
    the ROUTER a PLAIN server, or with ``curve`` a CURVE server that admits only the job's
    client key. :meth:`close` it before the context is terminated.
    """

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        router: zmq.Socket[bytes],
        password: bytes,
        rank: int,
        stats: WireStats,
        curve: DataCurve | None = None,
    ) -> None:
        self.password, self.rank, self.stats, self.curve = password, rank, stats, curve
        self._drops = DropLog(log)
        self._zap: zmq.Socket[bytes] = ctx.socket(zmq.REP)
        self._zap.linger = 0
        self._zap.bind(ZAP_ENDPOINT)
        if curve is not None:
            curve_server(router, curve.server)
        else:
            router.plain_server = True
        self._router = router
        self._monitor = router.get_monitor_socket(_REFUSED_BY_ZMQ)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"ms-recover-gate-{rank}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and close its sockets. Call once, before closing the ROUTER."""
        self._stop.set()
        self._thread.join()
        self._router.disable_monitor()
        self._monitor.close(linger=0)
        self._zap.close(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(POLL_MS))
                if self._zap in ready:
                    self._answer(self._zap.recv_multipart())
                if self._monitor in ready:
                    event = monitor_event(self._monitor)
                    self._refused(
                        "?",
                        f"handshake failed ({_event_name(event)}): "
                        "the peer presented no data-plane credentials",
                    )
            except zmq.ZMQError as exc:  # the context is going away
                if not self._stop.is_set():
                    log.error("rank %d: data-plane gatekeeper stopped: %s", self.rank, exc)
                return

    def _answer(self, request: list[bytes]) -> None:
        """Reply to one ZAP request (RFC 27): 200 for the job's credentials, else 400."""
        if len(request) < 6:  # version, request id, domain, address, identity, mechanism
            log.error("rank %d: malformed ZAP request of %d frames", self.rank, len(request))
            request_id = request[1] if len(request) > 1 else b""
            self._zap.send_multipart([b"1.0", request_id, b"500", b"", b"", b""])
            return
        request_id, address, mechanism, creds = request[1], request[3], request[5], request[6:]
        ok = self._admits(mechanism, creds)
        status = (b"200", b"OK") if ok else (b"400", b"wrong data-plane credentials")
        self._zap.send_multipart([b"1.0", request_id, *status, b"", b""])
        if not ok:
            what = "a wrong password" if creds[:1] == [USER] else "unknown credentials"
            peer = address.decode(errors="replace")
            self._refused(peer, f"{mechanism.decode(errors='replace')} with {what}")

    def _admits(self, mechanism: bytes, creds: list[bytes]) -> bool:
        if self.curve is not None:
            return (
                mechanism == b"CURVE"
                and len(creds) == 1
                and hmac.compare_digest(creds[0], self.curve.client_public_raw)
            )
        return (
            mechanism == b"PLAIN"
            and len(creds) == 2
            and creds[0] == USER
            and hmac.compare_digest(creds[1], self.password)
        )

    def _refused(self, peer: str, reason: str) -> None:
        self.stats.refused_connections += 1
        self._drops.drop(f"rank {self.rank} refused a data-plane connection: {reason}", peer)


def _event_name(event: int) -> str:
    for name in ("HANDSHAKE_FAILED_PROTOCOL", "HANDSHAKE_FAILED_NO_DETAIL"):
        if event == getattr(zmq, f"EVENT_{name}"):
            return name.lower()
    return str(event)
