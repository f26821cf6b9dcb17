"""The host data plane calls its fault hooks after every chunk, and only when they are armed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ms_recover.comm.host.backend import HostBackend
from ms_recover.faulthooks import FaultHooks

pytestmark = pytest.mark.timeout(60)


class ChunkCounter(FaultHooks):
    def __init__(self, armed: bool) -> None:
        self.armed = armed
        self.chunks = 0

    def after_chunk_sent(self) -> None:
        self.chunks += 1


@pytest.mark.parametrize("armed", [True, False])
@pytest.mark.parametrize("lanes", [False, True], ids=["zeromq", "lane"])
def test_chunk_hook_fires_per_chunk_only_when_armed(armed: bool, lanes: bool) -> None:
    # Over ZeroMQ the hook fires per chunk; a lane sends the whole buffer at once and fires it
    # after each send that put bytes on the wire (so "die at the first chunk" still dies there).
    backends = [HostBackend(r, 2, chunk_bytes=256, timeout=20.0, lanes=lanes) for r in range(2)]
    hooks = [ChunkCounter(armed) for _ in backends]
    try:
        members = {b.rank: b.endpoint for b in backends}
        for b, h in zip(backends, hooks, strict=True):
            b.init(1, members)
            b.faults = h
        x = np.arange(1024, dtype=np.float32)  # 4 KiB: many 256-byte chunks per rank
        out: list[np.ndarray] = [x, x]
        threads = [
            threading.Thread(target=lambda b=b: out.__setitem__(b.rank, b.allreduce(x, "sum")))
            for b in backends
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert all(np.array_equal(o, 2 * x) for o in out)
        # reduce-scatter and all-gather: 2 KiB each way, at most 256 bytes a chunk
        assert [h.chunks >= (1 if lanes else 8) for h in hooks] == [armed, armed]
        assert armed or [h.chunks for h in hooks] == [0, 0]
    finally:
        for b in backends:
            b.close()
