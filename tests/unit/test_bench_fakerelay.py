"""The control-plane bench's simulated agents answer a stop-all with the very frame their
general path builds (``RelayCluster._stop`` against ``RelayCluster._down``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ms_recover.bench.fakecluster import FakeSpec, _Member
from ms_recover.bench.fakerelay import RelayCluster
from ms_recover.protocol import messages as M


class _Recorded(RelayCluster):
    """A RelayCluster whose sends are recorded instead of signed and sent."""

    def __init__(self, spec: FakeSpec) -> None:
        super().__init__(spec)
        self.sent: list[tuple[str, int, int | None, M.Message]] = []

    def send(self, m: _Member, msg: M.Message, epoch: int | None = None) -> None:
        m.seq += 1
        self.sent.append((m.sender, m.seq, epoch, msg))


def _cluster() -> _Recorded:
    spec = FakeSpec("tcp://127.0.0.1:9", "job", b"secret", (0, 1), 4, 0.5, 1 << 20, relay=True)
    cluster = _Recorded(spec)
    cluster.codec.nonce = 1234  # both clusters sign as one incarnation
    for r in cluster.ranks.values():
        r.committed = 10 * r.rank
    cluster.ranks[1].alive = False  # a dead rank answers nothing
    cluster.ranks[2].incarnation = 3  # a restarted one under its new local identity
    cluster.by_local[cluster._local(cluster.ranks[2])] = cluster.ranks[2]
    return cluster


@pytest.fixture
def pair() -> Iterator[tuple[_Recorded, _Recorded]]:
    fast, general = _cluster(), _cluster()
    yield fast, general
    fast.close()
    general.close()


def _state(c: _Recorded) -> list[tuple[int, int, int]]:
    return [(m.seq, m.epoch, m.committed) for m in c.members + list(c.ranks.values())]


def test_a_stop_all_is_answered_with_the_general_paths_frame(
    pair: tuple[_Recorded, _Recorded],
) -> None:
    fast, general = pair
    targets = [fast._local(fast.ranks[r]) for r in (0, 1, 2, 3)] + [b"r99.0"]  # one unknown

    def never(*_: Any) -> None:
        raise AssertionError("the stop-all took the per-rank path")

    fast._answer = never  # type: ignore[method-assign]
    fast._on(fast.agents[0], M.RelayDown.KIND, 5, (["stop"], [5], [targets], [{}]))
    general._down(0, (["stop"], [5], [targets], [{}]))

    assert fast.sent == general.sent
    assert _state(fast) == _state(general)
    (sender, _, _, msg), *rest = fast.sent
    assert not rest and sender == "agent:0"
    assert isinstance(msg, M.RelayAcks)
    assert (msg.kind, msg.epoch, msg.ranks, msg.steps) == ("stopped", 5, [0, 2, 3], [0, 20, 30])


def test_other_batches_take_the_per_rank_path(pair: tuple[_Recorded, _Recorded]) -> None:
    fast, _ = pair
    targets = [fast._local(fast.ranks[r]) for r in (0, 3)]
    body = (["stop", "rebuild"], [5, 5], [targets, targets], [{}, {}])
    fast._on(fast.agents[0], M.RelayDown.KIND, 5, body)
    kinds = [msg.kind for _, _, _, msg in fast.sent if isinstance(msg, M.RelayAcks)]
    assert kinds == ["stopped", "rebuilt"]
