"""The host backend: the CPU data plane over ZeroMQ peer sockets and per-pair TCP lanes.

:mod:`.backend` holds :class:`~ms_recover.comm.host.backend.HostBackend`; the other modules are
its parts (authentication, calls, the ring and recursive doubling, links, streams, the wire), and
:mod:`.lane` is the fast two-rank path over one authenticated TCP connection per pair.
"""
