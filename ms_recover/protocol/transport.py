"""ZeroMQ plumbing shared by the manager, the agent, the worker and the status client.

A :class:`DealerChannel` is one authenticated DEALER connection to the manager. It never raises
on a bad incoming frame: the frame is dropped and logged (rate limited), and so is a replayed
one (:class:`~ms_recover.protocol.replay.ReplayGuard`).

Two socket-level protections (docs/design.md §5):

* **Size cap at the socket.** Every control-plane socket sets ``ZMQ_MAXMSGSIZE`` to the frame
  limit plus :data:`SLACK`: libzmq reads a frame's length before its body and drops the
  connection of a peer announcing a larger one, so an oversize frame costs no memory, whoever
  sends it (authenticated or not). The codec checks the body size again.
* **CURVE.** With a job secret, the control plane is encrypted and only peers that know the
  manager's public key can complete a handshake. Both keys of the manager are derived from the
  secret (:func:`curve_keys`), so nothing else needs distributing; clients use a fresh key pair
  per socket. Without a secret there is nothing to derive keys from: the plane stays NULL.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import struct

import zmq
from zmq.utils import z85

from ms_recover.config import JobConfig
from ms_recover.errors import ProtocolError
from ms_recover.protocol.codec import Codec, DropLog, Envelope
from ms_recover.protocol.messages import Message
from ms_recover.protocol.replay import ReplayGuard

log = logging.getLogger(__name__)

SLACK = 64 << 10  # bytes over the body limit: the frame's magic, kind and tag, msgpack framing


_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)
# pyzmq's Python-level Socket.send/recv wrap the backend's with per-call options handling
# (routing ids, groups, copy thresholds) that a plain bytes frame never needs: calling the
# backend's directly halves the cost of a frame, which a manager pays thousands of times a second.
_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv


def send_frames(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """``sock.send_multipart(frames, zmq.NOBLOCK)`` without pyzmq's per-frame flag arithmetic on
    enums and option handling: about 4 us for a five-frame message instead of 8-20 us, which adds
    up in a manager broadcast to thousands of ranks. Raises ``zmq.Again`` only before the first
    frame is queued."""
    for frame in frames[:-1]:
        _send(sock, frame, _MORE)
    _send(sock, frames[-1], _LAST)


def recv_frames(sock: zmq.Socket[bytes]) -> list[bytes]:
    """``sock.recv_multipart(zmq.NOBLOCK)``, the same way round: raises ``zmq.Again`` when
    nothing is queued; a multipart message is delivered whole or not at all. Each part's
    "more" flag is read from the part itself (a ``zmq.Frame``), not by a ``getsockopt`` per
    part, whose option argument pyzmq converts to an enum on every call: a two-part message
    costs ~5 us instead of ~11."""
    frame = _recv(sock, _LAST, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(sock, _LAST, False)
        frames.append(frame.bytes)
    return frames


def make_socket(
    ctx: zmq.Context[zmq.Socket[bytes]], kind: int, max_frame_bytes: int = 0
) -> zmq.Socket[bytes]:
    """A socket with ``linger=0`` and, if given, the inbound frame cap ``max_frame_bytes``."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if max_frame_bytes > 0:
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes + SLACK)
    return sock


def curve_keys(secret: bytes, job_id: str, label: str) -> tuple[bytes, bytes]:
    """A CURVE key pair (public, secret; Z85) derived from the job secret for ``label``.

    Every process of the job computes the same pair; without the secret it cannot be computed.
    Any 32 bytes are a valid Curve25519 secret key (libzmq clamps them).
    """
    if not secret:
        raise ValueError("CURVE keys need a non-empty job secret")
    info = b"ms-recover curve\0" + label.encode() + b"\0" + job_id.encode()
    secret_key = z85.encode(hmac.new(secret, info, hashlib.sha256).digest())
    return zmq.curve_public(secret_key), secret_key


def curve_server(sock: zmq.Socket[bytes], keys: tuple[bytes, bytes]) -> None:
    """Make ``sock`` a CURVE server with ``keys`` (before ``bind``)."""
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = keys


def curve_client(
    sock: zmq.Socket[bytes], server_public: bytes, keys: tuple[bytes, bytes] | None = None
) -> None:
    """Make ``sock`` a CURVE client of ``server_public`` (before ``connect``); ``keys`` default
    to a fresh pair."""
    public, secret = keys or zmq.curve_keypair()
    sock.curve_serverkey = server_public
    sock.curve_publickey, sock.curve_secretkey = public, secret


def relay_router(
    ctx: zmq.Context[zmq.Socket[bytes]], config: JobConfig, host: str
) -> tuple[zmq.Socket[bytes], str]:
    """A ROUTER that members of ``config``'s job reach as they reach the manager (the frame
    cap, CURVE with the manager's keys when the job has a secret), bound to an ephemeral port
    of ``host``; the socket and its endpoint (an agent's relay, a heartbeat group's leader)."""
    sock = make_socket(ctx, zmq.ROUTER, config.max_frame_bytes)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    where = f"tcp://[{host}]" if ":" in host else f"tcp://{host}"
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
    if config.control_curve:
        curve_server(sock, control_server_keys(config.secret, config.job_id))
    port = sock.bind_to_random_port(where)
    return sock, f"{where}:{port}"


def control_server_keys(secret: bytes, job_id: str) -> tuple[bytes, bytes]:
    """The manager's CURVE key pair."""
    return curve_keys(secret, job_id, "control")


class DealerChannel:
    """A DEALER socket to the manager with framing, sequence numbers and drop logging."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        codec: Codec,
        sender: str,
        identity: bytes,
        server_key: bytes | None = None,
        sockopts: dict[int, int] | None = None,
    ) -> None:
        """``server_key``: the manager's CURVE public key (Z85), or None for a NULL socket;
        ``sockopts``: ZeroMQ options set on every socket before it connects."""
        self.sockopts = dict(sockopts or {})
        self._ctx = ctx
        self.endpoint = endpoint
        self.codec = codec
        self.sender = sender
        self.identity = identity
        self.server_key = server_key
        self._seq = itertools.count()
        self.drops = DropLog(log)
        self.replay = ReplayGuard(max_senders=16)
        self.sock = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        sock = make_socket(self._ctx, zmq.DEALER, self.codec.max_bytes)
        if self.server_key is not None:
            curve_client(sock, self.server_key)
        sock.setsockopt(zmq.ROUTING_ID, self.identity)
        for opt, value in self.sockopts.items():
            sock.setsockopt(opt, value)
        sock.connect(self.endpoint)
        return sock

    def reconnect(self, identity: bytes | None = None) -> None:
        """Recreate the socket (a fresh DEALER, as in the Paranoid Pirate pattern), with a new
        ``identity`` if given: a ROUTER drops a connection whose identity is still in use by
        a connection it has not yet seen close."""
        self.sock.close(0)
        self.identity = identity or self.identity
        self.sock = self._connect()

    def send(self, msg: Message, epoch: int) -> None:
        try:
            frames = self.codec.encode(msg, epoch, self.sender, next(self._seq))
            send_frames(self.sock, frames)
        except ProtocolError as exc:
            log.error("not sent to %s: %s", self.endpoint, exc)
        except zmq.Again:
            log.warning("send queue to %s full; dropped %s", self.endpoint, msg.KIND.decode())

    def recv(self, timeout_ms: int) -> Envelope | None:
        """One valid envelope, or None after ``timeout_ms`` (bad frames are dropped)."""
        if not self.sock.poll(timeout_ms):
            return None
        return self.recv_ready()

    def recv_ready(self) -> Envelope | None:
        try:
            frames = self.sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        try:
            env = self.codec.decode(frames)
        except ProtocolError as exc:
            self.drops.drop(str(exc), self.endpoint)
            return None
        replayed = self.replay.check(env.sender, env.nonce, env.seq)
        if replayed:
            self.drops.drop(replayed, self.endpoint)
            return None
        return env

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; ``linger_ms`` lets frames already queued leave first."""
        self.sock.close(linger_ms)


def manager_channel(
    ctx: zmq.Context[zmq.Socket[bytes]],
    config: JobConfig,
    sender: str,
    identity: bytes,
    endpoint: str = "",
    sockopts: dict[int, int] | None = None,
) -> DealerChannel:
    """A member's channel to the manager of ``config``'s job: its codec (a new incarnation
    nonce), the frame cap, and CURVE when the job has a secret. ``endpoint``: where to
    connect instead of the manager (a node agent's relay, which serves the same protocol)."""
    codec = Codec(config.job_id, config.effective_secret(), config.max_frame_bytes)
    key = control_server_keys(config.secret, config.job_id)[0] if config.control_curve else None
    where = endpoint or config.manager_endpoint
    return DealerChannel(ctx, where, codec, sender, identity, key, sockopts)


def monitor_event(sock: zmq.Socket[bytes], flags: int = 0) -> int:
    """The event id of the next message on a socket monitor's PAIR socket (16-bit id, 32-bit
    value, then the endpoint). pyzmq's ``recv_monitor_message`` does the same but imports
    asyncio with it: 40 ms of every agent's and rank's start."""
    head = sock.recv_multipart(flags)[0]
    if len(head) != 6:
        raise ProtocolError(f"a socket monitor message of {len(head)} bytes (want 6)")
    return int(struct.unpack("=Hi", head)[0])
