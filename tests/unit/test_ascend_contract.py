"""Contract tests of AscendBackend against a fake of MindSpore's HCCL fault-tolerance bindings.

There is no Ascend hardware here. These tests pin what the backend calls, in which order and
with which arguments, and that the fake (and AscendBindings) have exactly the names and
signatures of the real bindings in the installed MindSpore wheel.
"""

from __future__ import annotations

import importlib
import inspect
import re
import threading
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from ms_recover.comm.ascend import HCCL_WORLD, AscendBackend, AscendBindings
from ms_recover.comm.base import CommBackend, ReduceOp
from ms_recover.comm.grouplog import GroupLog
from ms_recover.errors import CommError, Interrupted, RepairError

DEVICE = 3
MEMBERS = {r: f"tcp://10.0.0.{r}:7000" for r in range(4)}


class FakeBindings:
    """Records every call; same method names and signatures as AscendBindings."""

    def __init__(self, group_sizes: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.group_sizes = {HCCL_WORLD: 4, **(group_sizes or {})}
        self.stopped = threading.Event()
        self.block_collectives = False
        self.fail_with: Exception | None = None
        self.send_recv_rc = 0

    def check_available(self) -> None:
        pass

    def _stop_device(self, device_id: int, /) -> None:
        self.calls.append(("_stop_device", (device_id,)))
        self.stopped.set()

    def _finalize_comm(self) -> None:
        self.calls.append(("_finalize_comm", ()))

    def _rebuild_group(self) -> None:
        self.calls.append(("_rebuild_group", ()))

    def set_is_arf(self, flag: bool, /) -> None:
        self.calls.append(("set_is_arf", (flag,)))

    def _pre_launch_send_recv(self, device_id: int, /) -> None:
        self.calls.append(("_pre_launch_send_recv", (device_id,)))

    def send_recv(self, params: list[Any], src_rank: int, dst_rank: int) -> int:
        self._collective("send_recv", (params, src_rank, dst_rank))
        return self.send_recv_rc

    def init(self, backend_name: str | None = None) -> None:
        self.calls.append(("init", (backend_name,)))

    def create_group(self, group: str, rank_ids: list[int], options: Any = None) -> None:
        self.calls.append(("create_group", (group, rank_ids)))

    def release(self) -> None:
        self.calls.append(("release", ()))

    def all_reduce(
        self, tensor: Any, op: str = "sum", group: str | None = None, async_op: bool = False
    ) -> Any:
        self._collective("all_reduce", (op, group))
        tensor *= self.group_sizes[group or HCCL_WORLD]  # every member contributed the same
        return None

    def broadcast(
        self, tensor: Any, src: int, group: str | None = None, async_op: bool = False
    ) -> Any:
        self._collective("broadcast", (src, group))
        tensor += src
        return None

    def barrier(
        self, group: str | None = None, async_op: bool = False, device_ids: Any = None
    ) -> Any:
        self._collective("barrier", (group,))
        return None

    def get_device_id(self) -> int:
        self.calls.append(("get_device_id", ()))
        return DEVICE

    def to_tensor(self, array: NDArray[Any]) -> Any:
        return np.array(array, copy=True)

    def to_numpy(self, tensor: Any) -> NDArray[Any]:
        return np.array(tensor, copy=True)

    def _collective(self, name: str, args: tuple[Any, ...]) -> None:
        self.calls.append((name, args))
        if self.block_collectives:
            assert self.stopped.wait(10), "test never aborted the blocked collective"
            raise RuntimeError("Launch kernel failed: ForceStopError occurs when execute.")
        if self.fail_with is not None:
            raise self.fail_with

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class RecordingHost(CommBackend):
    """A host-path stand-in that records what the Ascend backend forwards to it."""

    def __init__(self) -> None:
        super().__init__(0, 4)
        self.events: list[str] = []
        self.sent: list[tuple[dict[str, np.ndarray], int, str]] = []

    @property
    def endpoint(self) -> str:
        return "tcp://10.0.0.0:7000"

    def init(self, epoch: int, members: dict[int, str]) -> None:
        self.events.append(f"init {epoch}")

    def _make_group(self, name: str, ranks: tuple[int, ...]) -> None:
        self.events.append(f"group {name}")

    def allreduce(self, array: np.ndarray, op: ReduceOp | str = "sum", group: str = "world"):  # type: ignore[no-untyped-def]
        raise AssertionError("collectives must not use the host path")

    def broadcast(self, array: np.ndarray, root: int, group: str = "world") -> np.ndarray:
        raise AssertionError("collectives must not use the host path")

    def barrier(self, group: str = "world") -> None:
        raise AssertionError("collectives must not use the host path")

    def send(self, arrays: dict[str, np.ndarray], dst: int, tag: str = "") -> None:
        self.sent.append((arrays, dst, tag))

    def recv(self, src: int, tag: str = "") -> dict[str, np.ndarray]:
        return {"w": np.full(2, src, np.float32)}

    def abort(self) -> None:
        self.events.append("abort")

    def rebuild(self, epoch: int, members: dict[int, str], group_log: GroupLog) -> None:
        self.events.append(f"rebuild {epoch} {group_log.names()}")

    def add_peers(self, endpoints: dict[int, str]) -> None:
        self.events.append(f"peers {sorted(endpoints)}")

    def close(self) -> None:
        self.events.append("close")


def make(
    rank: int = 0, host: CommBackend | None = None, **sizes: int
) -> tuple[AscendBackend, FakeBindings]:
    fake = FakeBindings(sizes)
    backend = AscendBackend(rank, 4, DEVICE, bindings=fake, host_path=host)  # type: ignore[arg-type]
    return backend, fake


def started(rank: int = 0, **sizes: int) -> tuple[AscendBackend, FakeBindings]:
    backend, fake = make(rank, **sizes)
    backend.init(0, MEMBERS)
    backend.create_group("dp", [0, 1])
    backend.create_group("pp", [0, 2])
    fake.calls.clear()
    return backend, fake


LOG = GroupLog([("dp", (0, 1)), ("dp2", (2, 3)), ("pp", (1, 3))])


# --- names and signatures ---------------------------------------------------------------------
BINDING_NAMES = [*AscendBindings.PYBIND_SIGNATURES, *AscendBindings.PYTHON_FUNCTIONS]


def test_fake_has_exactly_the_signatures_of_ascend_bindings() -> None:
    helpers = ["check_available", "get_device_id", "to_tensor", "to_numpy"]
    public = {
        n
        for n in vars(AscendBindings)
        if not n.startswith("__") and callable(getattr(AscendBindings, n)) and n != "_fn"
    }
    assert public == {*BINDING_NAMES, *helpers}
    for name in [*BINDING_NAMES, *helpers]:
        assert inspect.signature(getattr(FakeBindings, name)) == inspect.signature(
            getattr(AscendBindings, name)
        ), name


def _parse_pybind(doc_line: str) -> tuple[list[tuple[str, str]], str]:
    """``name(a: int, b: bool) -> int`` -> ([("a", "int"), ("b", "bool")], "int")."""
    match = re.fullmatch(r"\w+\((.*)\) -> ([\w\[\]]+)", doc_line)
    assert match, doc_line
    params = [p.split(": ") for p in match.group(1).split(", ") if p]
    return [(n, t) for n, t in params], match.group(2)


@pytest.mark.parametrize("cls", [AscendBindings, FakeBindings])
def test_bindings_match_the_installed_mindspore_wheel(cls: type) -> None:
    """Pybind bindings: the pinned ``__doc__`` signature; Python ones: inspect.signature."""
    pytest.importorskip("mindspore")
    c_expression = importlib.import_module("mindspore._c_expression")
    for name, expected in AscendBindings.PYBIND_SIGNATURES.items():
        assert getattr(c_expression, name).__doc__.strip().splitlines()[0] == expected
        sig = inspect.signature(getattr(cls, name))
        ours = list(sig.parameters.values())[1:]
        doc, returns = _parse_pybind(expected)
        assert len(ours) == len(doc), name
        assert sig.return_annotation == returns, name
        for param, (doc_name, doc_type) in zip(ours, doc, strict=True):
            assert param.annotation == doc_type.replace("object", "Any"), name
            if re.fullmatch(r"arg\d+", doc_name):  # pybind's default name: positional only
                assert param.kind is inspect.Parameter.POSITIONAL_ONLY, name
            else:
                assert param.name == doc_name, name
    for name, module in AscendBindings.PYTHON_FUNCTIONS.items():
        real_sig = inspect.signature(getattr(importlib.import_module(module), name))
        ours_sig = inspect.signature(getattr(cls, name))
        real = [(p.name, p.kind, p.default) for p in real_sig.parameters.values()]
        ours = [(p.name, p.kind, p.default) for p in list(ours_sig.parameters.values())[1:]]
        assert ours == real, f"{module}.{name}"


def test_constructing_without_ascend_raises_a_clear_comm_error() -> None:
    # Here either mindspore is missing or its Ascend plugin is not loaded: both say so.
    with pytest.raises(CommError, match="Ascend|not available"):
        AscendBackend(0, 2, 0)


# --- groups and collectives -------------------------------------------------------------------
def test_init_and_create_group_call_mindspore_on_members_only() -> None:
    backend, fake = make(rank=0)
    created: list[tuple[str, tuple[int, ...]]] = []
    backend.on_group_created = lambda name, ranks: created.append((name, ranks))
    backend.init(0, MEMBERS)
    backend.create_group("dp", [0, 1])
    backend.create_group("other", [2, 3])
    backend.create_group("dp", [0, 1])  # already logged: no second call
    assert fake.calls == [("init", ("hccl",)), ("create_group", ("dp", [0, 1]))]
    assert backend.group_log.names() == ["dp", "other"]
    assert created == [("dp", (0, 1)), ("other", (2, 3))]


def test_allreduce_sums_or_averages_on_the_hccl_group() -> None:
    backend, fake = started(dp=2)
    ones = np.ones(3, np.float32)
    np.testing.assert_array_equal(backend.allreduce(ones, ReduceOp.MEAN), ones)
    np.testing.assert_array_equal(backend.allreduce(ones, "sum", group="dp"), 2 * ones)
    np.testing.assert_array_equal(backend.allreduce(ones, "mean", group="dp"), ones)
    assert backend.broadcast(np.zeros(2), root=1, group="dp").tolist() == [1.0, 1.0]
    backend.barrier()
    assert fake.calls == [
        ("all_reduce", ("sum", HCCL_WORLD)),
        ("all_reduce", ("sum", "dp")),
        ("all_reduce", ("sum", "dp")),
        ("broadcast", (1, "dp")),
        ("barrier", (HCCL_WORLD,)),
    ]
    with pytest.raises(CommError, match="unknown group 'nope'"):
        backend.allreduce(ones, group="nope")


def test_allreduce_out_gets_the_result_and_a_wrong_out_is_refused_before_hccl() -> None:
    backend, fake = started(dp=2)
    x = np.ones(3, np.float32)
    assert backend.allreduce(x, "sum", group="dp", out=x) is x
    np.testing.assert_array_equal(x, [2.0, 2.0, 2.0])
    out = np.zeros(3, np.float32)
    assert backend.allreduce(x, "mean", group="dp", out=out) is out
    np.testing.assert_array_equal(out, x)
    calls = len(fake.calls)
    with pytest.raises(CommError, match=r"float32 ndarray of shape \(3,\).*shape \(4,\)"):
        backend.allreduce(x, out=np.zeros(4, np.float32))
    assert len(fake.calls) == calls


def test_a_failure_without_abort_is_a_comm_error_and_force_stop_is_interrupted() -> None:
    backend, fake = started()
    fake.fail_with = RuntimeError("HCCL timeout")
    with pytest.raises(CommError, match="HCCL timeout") as info:
        backend.allreduce(np.ones(2))
    assert not isinstance(info.value, Interrupted)
    fake.fail_with = RuntimeError("ForceStopError occurs when execute.")
    with pytest.raises(Interrupted):
        backend.barrier()


# --- abort, rebuild, repair -------------------------------------------------------------------
def test_abort_stops_the_device_once_and_interrupts_until_rebuild() -> None:
    backend, fake = started()
    fake.block_collectives = True
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            backend.allreduce(np.ones(4, np.float32))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)

    worker = threading.Thread(target=blocked)
    worker.start()
    backend.abort()
    worker.join(10)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], Interrupted)
    backend.abort()  # idempotent within an epoch
    assert fake.calls.count(("_stop_device", (DEVICE,))) == 1

    fake.block_collectives = False
    fake.calls.clear()
    for call in (
        lambda: backend.allreduce(np.ones(2)),
        lambda: backend.broadcast(np.ones(2), 0),
        lambda: backend.barrier("dp"),
        lambda: backend.repair_params(["p"], 0, 1),
        lambda: backend.create_group("late", [0, 3]),
    ):
        with pytest.raises(Interrupted, match="epoch 0"):
            call()
    assert fake.calls == []  # nothing reached MindSpore while aborted

    backend.rebuild(1, MEMBERS, GroupLog([("dp", (0, 1)), ("pp", (0, 2))]))
    np.testing.assert_array_equal(backend.allreduce(np.ones(2), "mean"), np.ones(2))


def test_device_id_defaults_to_mindspore_context_read_when_first_needed() -> None:
    fake = FakeBindings()
    backend = AscendBackend(0, 4, bindings=fake)  # type: ignore[arg-type]
    backend.init(0, MEMBERS)
    assert fake.names() == ["init"]
    backend.abort()
    assert fake.calls[1:] == [("get_device_id", ()), ("_stop_device", (DEVICE,))]


def test_survivor_rebuild_follows_mindio_order() -> None:
    backend, fake = started(rank=1)
    backend.abort()
    fake.calls.clear()
    log = GroupLog([("dp", (0, 1)), ("pp", (0, 2))])
    backend.rebuild(1, MEMBERS, log)
    assert fake.calls == [
        ("_finalize_comm", ()),
        ("_rebuild_group", ()),  # recreates "dp" under the same name inside MindSpore
        ("set_is_arf", (True,)),
        ("_pre_launch_send_recv", (DEVICE,)),
    ]
    assert backend.epoch == 1 and backend.group_log == log
    fake.calls.clear()
    backend.on_step_end()
    backend.on_step_end()
    assert fake.calls == [("set_is_arf", (False,))]


def test_restarted_rank_replays_the_group_log_in_order_with_the_same_names() -> None:
    backend, fake = make(rank=3, pp=2)
    backend.rebuild(2, MEMBERS, LOG)
    assert fake.calls == [
        ("init", ("hccl",)),
        ("create_group", ("dp2", [2, 3])),
        ("create_group", ("pp", [1, 3])),
        ("set_is_arf", (True,)),
        ("_pre_launch_send_recv", (DEVICE,)),
    ]
    assert backend.group_log == LOG and backend.epoch == 2
    ones = np.ones(2, np.float32)
    np.testing.assert_array_equal(backend.allreduce(ones, "mean", group="pp"), ones)
    assert fake.calls[-1] == ("all_reduce", ("sum", "pp"))


def test_rebuild_rejects_an_epoch_that_is_not_newer() -> None:
    backend, _ = started()
    backend.rebuild(3, MEMBERS, LOG)
    with pytest.raises(CommError, match="epoch 3 is not newer than epoch 3"):
        backend.rebuild(3, MEMBERS, LOG)


def test_repair_params_uses_send_recv_and_checks_its_return_code() -> None:
    backend, fake = started(rank=1)
    params = [object(), object()]
    backend.repair_params(params, 0, 1)
    assert fake.calls == [("send_recv", (params, 0, 1))]
    fake.send_recv_rc = 7
    with pytest.raises(RepairError, match="from rank 0 to rank 1 returned 7"):
        backend.repair_params(params, 0, 1)


def test_named_state_goes_over_the_host_path() -> None:
    backend, _ = started()
    with pytest.raises(CommError, match="needs a host_path"):
        backend.send({"w": np.zeros(2)}, 1)
    host = RecordingHost()
    backend, fake = make(rank=0, host=host)
    backend.init(0, MEMBERS)
    assert backend.endpoint == host.endpoint
    backend.add_peers({1: "tcp://10.0.0.1:7000"})  # a repair pair's endpoint, for the host path
    backend.send({"w": np.zeros(2)}, 1, tag="repair")
    assert host.sent[0][1:] == (1, "repair")
    assert backend.recv(2, tag="repair")["w"].tolist() == [2.0, 2.0]
    backend.abort()
    with pytest.raises(Interrupted):
        backend.recv(2)
    backend.rebuild(1, MEMBERS, LOG)
    backend.close()
    backend.close()
    assert host.events == [
        "init 0",
        "peers [1]",
        "abort",
        "rebuild 1 ['dp', 'dp2', 'pp']",
        "close",
    ]
    assert fake.names().count("release") == 1
