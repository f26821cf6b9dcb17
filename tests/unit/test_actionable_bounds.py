"""Every value the decoder accepts can be acted on (issue 26 #5).

A real :class:`ManagerServer` is fed signed frames through :meth:`ManagerServer.dispatch` (the
decode path of production) with a fake clock; what it sends is captured, encoded with its own
codec and decoded with a member's, as the member would. Scripted members answer every command
(Stopped, Rebuilt, Repaired, the heartbeat that closes a Resume) through the same decode. The
property, over the bounds of every field: a frame is either refused at decode, or everything
the manager derives from it reaches its members and the round it starts closes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.errors import ProtocolError
from ms_recover.manager.decide import decide
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.schema import JobState
from ms_recover.protocol import bounds as B
from ms_recover.protocol import messages as M
from ms_recover.protocol.codec import Codec
from ms_recover.protocol.relay import ack_columns, check_item, relay_acks
from ms_recover.strategy import parse_strategies

pytestmark = pytest.mark.timeout(300)

RANKS = (0, 1)  # one node, two replicas of one shard: every round repairs and resumes
AGENT = b"agent0"


def _ends(lo: int, hi: int) -> list[int]:
    """The values at and just inside both ends of an inclusive range."""
    return sorted({lo, lo + 1, hi - 1, hi})


#: Committed steps to try: both ends of the widest committed_step range any kind accepts.
STEPS = _ends(*B.INT_RANGES["committed_step"])
#: Epochs a re-registering member may report (0 is a fresh job's): both ends of the range.
EPOCHS = _ends(1, B.INT_RANGES["epoch"][1])


class Job:
    """A manager of one node with two ranks, and its scripted members."""

    def __init__(self, strategies: str = "recover-in-place,exit", dump_dir: str = "") -> None:
        self.t = 1000.0
        cfg = JobConfig(
            job_id="bounds",
            node_nums=1,
            proc_per_node=len(RANKS),
            manager_port=0,
            heartbeat_s=0.5,
            rank_silence_s=2.0,
            phase_timeout_s=10.0,
            strategies=parse_strategies(strategies),
            dump_dir=dump_dir,
        )
        self.server = ManagerServer(cfg, clock=lambda: self.t)
        self.model = self.server.model
        self.secret = cfg.effective_secret()
        self.member = Codec(cfg.job_id, self.secret)  # how every member decodes
        self.codecs: dict[bytes, Codec] = {}
        self.seqs: dict[bytes, int] = {}
        self.committed = {r: -1 for r in RANKS}
        self.incarnation = {r: 0 for r in RANKS}
        self.outbox: list[tuple[bytes, M.Message]] = []
        self.undeliverable: list[str] = []  # what a member's decoder refused
        self.refused: list[str] = []  # what the manager's decoder refused
        self.server.send = self._capture  # type: ignore[method-assign]
        self.on_dump: Callable[[int, M.Dump], M.Dumped] = _dumped

    def _capture(self, identities: Any, msg: M.Message) -> None:
        try:
            frames = self.server.codec.encode(msg, self.model.epoch, "manager", 1)
            self.member.decode(frames)
        except ProtocolError as exc:
            self.undeliverable.append(f"{msg!r}: {exc}")
            return
        self.outbox.extend((ident, msg) for ident in identities)

    def send(self, ident: bytes, msg: M.Message, epoch: int | None = None) -> bool:
        """Sign ``msg`` as member ``ident`` and dispatch it; False if the manager refused it
        at decode."""
        codec = self.codecs.setdefault(ident, Codec("bounds", self.secret))
        seq = self.seqs.get(ident, 0)
        self.seqs[ident] = seq + 1
        at = self.model.epoch if epoch is None else epoch
        frames = codec.encode(msg, at, ident.decode(), seq)
        try:
            self.server.codec.decode(frames)
        except ProtocolError as exc:
            self.refused.append(f"{type(msg).__name__}: {exc}")
            return False
        self.server.dispatch([ident, *frames])
        return True

    def hello(self, rank: int, step: int, epoch: int) -> bool:
        ident = f"r{rank}.{self.incarnation[rank]}".encode()
        self.committed[rank] = step
        msg = M.WorkerHello(rank, 0, 700 + rank, self.incarnation[rank], "tcp://h:1", step, 0)
        return self.send(ident, msg, epoch)

    def answer(self) -> None:
        """Every member answers what the manager sent it, as a real one would."""
        outbox, self.outbox = self.outbox, []
        for ident, msg in outbox:
            if ident == AGENT:
                if isinstance(msg, M.StartRanks):
                    for rank in msg.ranks:
                        self.incarnation[rank] += 1
                        self.hello(rank, -1, 0)
                continue
            rank = int(ident.decode()[1:].split(".")[0])
            if isinstance(msg, M.Stop):
                self.send(ident, M.Stopped(rank, self.committed[rank], "d"))
            elif isinstance(msg, M.Rebuild):
                self.send(ident, M.Rebuilt(rank))
            elif isinstance(msg, M.Repair):
                self.committed[rank] = msg.target_step
                self.send(ident, M.Repaired(rank, msg.attempt, True, msg.target_step, -1, ""))
            elif isinstance(msg, M.Dump):
                self.send(ident, self.on_dump(rank, msg))
            elif isinstance(msg, M.Resume):
                self.committed[rank] = msg.step
                self.send(ident, M.WorkerHeartbeat(rank, msg.step))

    def run(self, rounds: int = 12) -> None:
        """Decide and answer until nothing more is sent (or ``rounds`` passes)."""
        for _ in range(rounds):
            self.t += 0.01
            self.server.executor.execute(decide(self.model, self.t))
            if not self.outbox:
                return
            self.answer()


def _dumped(rank: int, msg: M.Dump) -> M.Dumped:
    """What a rank answers to Dump once its file is written."""
    return M.Dumped(rank, True, msg.step, f"rank_{rank}.npz", "npz", "ab" * 32, 100, "")


@pytest.fixture
def job() -> Iterator[Job]:
    job = Job()
    yield job
    job.server.close()


def _closed(job: Job) -> None:
    assert not job.undeliverable, job.undeliverable
    assert job.model.state is JobState.RUNNING, (job.model.state, job.refused)
    assert not job.model.in_recovery


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(st.sampled_from(STEPS), min_size=2, max_size=2))
def test_a_forming_job_resumes_after_any_accepted_committed_step(steps: list[int]) -> None:
    """The issue's case: a signed hello at the largest committed step the bounds accept made
    the manager resume at the step after it, which its own members refuse."""
    job = Job()
    try:
        assert job.send(AGENT, M.AgentHello(0, "127.0.0.1", list(RANKS), 500, True), 0)
        accepted = [job.hello(r, step, 0) for r, step in zip(RANKS, steps, strict=True)]
        job.run()
        if not all(accepted):  # refused at decode: named, and nothing was derived from it
            assert job.refused and all("committed_step" in why for why in job.refused)
            assert not job.undeliverable, job.undeliverable
            return
        _closed(job)
        assert job.model.epoch == 1 and job.committed == dict.fromkeys(RANKS, max(steps) + 1)
    finally:
        job.server.close()


@settings(max_examples=40, deadline=None)
@given(epoch=st.sampled_from(EPOCHS), step=st.sampled_from(STEPS))
def test_a_restarted_manager_recovers_from_any_accepted_epoch(epoch: int, step: int) -> None:
    """A restarted manager adopts the epoch its members re-register at and starts the next
    round at the epoch after it: every accepted epoch leaves room for that round."""
    job = Job()
    try:
        agent_ok = job.send(AGENT, M.AgentHello(0, "127.0.0.1", list(RANKS), 500, True), epoch)
        accepted = [job.hello(r, step, epoch) for r in RANKS]
        job.run()
        if not (agent_ok and all(accepted)):
            assert job.refused and not job.undeliverable, (job.refused, job.undeliverable)
            return
        _closed(job)
        assert job.model.epoch == epoch  # restored as it was, no round
        exited = M.RankExited(0, 1, 701, 137, 9, job.t)
        assert job.send(AGENT, exited)
        job.run()
        _closed(job)
        assert job.model.epoch == epoch + 1 and job.committed == dict.fromkeys(RANKS, step + 1)
    finally:
        job.server.close()


def _defaults(cls: type[M.Message]) -> dict[str, Any]:
    """A plausible value of every field of ``cls`` (rank 0 of node 0 where one is named)."""
    plain: dict[Any, Any] = {int: 0, float: 0.0, str: "", bool: False, bytes: b""}
    out: dict[str, Any] = {}
    for name, hint in M.field_types(cls).items():
        out[name] = plain[hint] if hint in plain else hint.__origin__()  # list(), dict()
        if name.endswith("step"):
            out[name] = 41
    return out


#: (kind, field, value): both ends of every int field and the longest value of every str field
#: of every message a member sends.
UP = [
    (cls, name, value)
    for cls in (
        M.AgentHello,
        M.WorkerHello,
        M.GroupCreated,
        M.Rebuilt,
        M.AgentHeartbeat,
        M.RankExited,
        M.WorkerHeartbeat,
        M.Stopped,
        M.StateDigest,
        M.Repaired,
        M.WorkerFault,
        M.WorkerDone,
        M.Dumped,
    )
    for name, hint in M.field_types(cls).items()
    if hint in (int, str)
    for value in (
        B.int_range(name, cls.KIND) if hint is int else ["\x1b" * B.STR_LIMITS.get(name, B.MAX_STR)]
    )
]


def _id(value: Any) -> str:
    if isinstance(value, str) and len(value) > 64:
        return f"{len(value)}chars"
    return str(getattr(value, "__name__", value))


@pytest.mark.parametrize(("cls", "name", "value"), UP, ids=_id)
def test_every_accepted_field_value_of_a_running_job_can_be_acted_on(
    job: Job, cls: type[M.Message], name: str, value: int | str
) -> None:
    """Both ends of every int field (the longest text of every str field) of every member ->
    manager message, sent to a running job
    at step 41 (then to the round it may start): nothing the manager derives is undeliverable."""
    assert job.send(AGENT, M.AgentHello(0, "127.0.0.1", list(RANKS), 500, True), 0)
    for rank in RANKS:
        job.hello(rank, 41, 0)
    job.run()
    _closed(job)
    fields = _defaults(cls) | {name: value}
    ident = AGENT if cls in (M.AgentHello, M.AgentHeartbeat, M.RankExited) else b"r0.0"
    assert job.send(ident, cls(**fields))
    job.run()
    assert not job.undeliverable, job.undeliverable
    assert job.model.state in (JobState.RUNNING, JobState.FINISHED), job.model.state


def test_relayed_frames_are_held_to_the_same_bounds() -> None:
    """A node agent's relay carries rank frames in batches: the narrower bounds of a hello's
    epoch and of a stop's committed step hold there too (RelayUp items and RelayAcks columns)."""
    top = B.STEP_MAX
    hello = M.WorkerHello(0, 0, 700, 0, "tcp://h:1", 41, 0).to_wire()
    item = (b"r0", "rank:0", 5, 0, top, "worker_hello", hello)
    assert "epoch" in str(check_item("bounds", item))
    ok = check_item("bounds", (*item[:4], top - 1, *item[5:]))
    assert not isinstance(ok, str) and ok.epoch == top - 1
    acks = relay_acks(0, "stopped", 1, [(b"r0", "rank:0", 5, 0)], [M.Stopped(0, top, "d")])
    assert "committed_step" in str(ack_columns(acks))
    beats = relay_acks(0, "worker_hb", 1, [(b"r0", "rank:0", 5, 0)], [M.WorkerHeartbeat(0, top)])
    assert ack_columns(beats) is None  # the heartbeat that closes a Resume at STEP_MAX


#: Dump answers the decoder accepts that no manifest can hold.
UNRECORDABLE: dict[str, Callable[[int, M.Dump], M.Dumped]] = {
    "a path, not a name": lambda r, m: dataclasses.replace(_dumped(r, m), file="../../etc/x"),
    "a name too long": lambda r, m: dataclasses.replace(_dumped(r, m), file="x" * 4000),
    "an unknown format": lambda r, m: dataclasses.replace(_dumped(r, m), format="pickle"),
    "a bad digest": lambda r, m: dataclasses.replace(_dumped(r, m), sha256="\x1b" * 64),
    "another step": lambda r, m: dataclasses.replace(_dumped(r, m), step=B.STEP_MAX),
}


@pytest.mark.parametrize("case", sorted(UNRECORDABLE))
def test_a_dump_answer_no_manifest_can_hold_is_a_failed_dump(tmp_path: Any, case: str) -> None:
    """A signed Dumped with ok=True that the decoder accepts but no manifest can hold made the
    executor raise at every tick, until the manager stopped: now it is a failed dump."""
    job = Job("dump,exit", str(tmp_path))
    job.on_dump = UNRECORDABLE[case]
    try:
        assert job.send(AGENT, M.AgentHello(0, "127.0.0.1", list(RANKS), 500, True), 0)
        for rank in RANKS:
            job.hello(rank, 41, 0)
        job.run()
        _closed(job)
        assert job.send(AGENT, M.RankExited(0, 1, 701, 137, 9, job.t))
        job.run()
        assert job.model.state in (JobState.EXITING, JobState.FINISHED), job.model.state
        assert job.model.exit_code == exitcodes.JOB_EXIT
        end = job.server.events.recent("job_end")
        assert end and "dump failed" in str(end[-1]), end
        assert not os.path.exists(tmp_path / "manifest.json")
    finally:
        job.server.close()


def test_a_good_dump_answer_is_recorded(tmp_path: Any) -> None:
    job = Job("dump,exit", str(tmp_path))
    try:
        assert job.send(AGENT, M.AgentHello(0, "127.0.0.1", list(RANKS), 500, True), 0)
        for rank in RANKS:
            job.hello(rank, 41, 0)
        job.run()
        assert job.send(AGENT, M.RankExited(0, 1, 701, 137, 9, job.t))
        job.run()
        assert job.model.exit_code == exitcodes.DUMPED
        assert os.path.exists(tmp_path / "manifest.json")
    finally:
        job.server.close()
