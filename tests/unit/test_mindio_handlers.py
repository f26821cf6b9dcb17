"""Contract tests for what needs Ascend: MindSpore's own handlers and TFT loop, driven by our
processor's arguments, with a recording fake in place of each Ascend-only binding.

* ``send_recv`` repair pairs: the ``repair_info`` our processor builds makes MindSpore's
  ``_tft_repair_callback`` call ``send_recv`` with exactly the planner's (src, dst) pairs;
* UCE classification: MindSpore's ``_handle_exception_info`` reports ``RS_UCE`` through the
  shim, which tells the manager the rank's state is untrustworthy (``device_memory``);
* ``retry``: MindSpore's ``_tft_clean_callback`` resumes the HCCL communicators when the
  processor's repair type is ``retry``, and does not when it is ``recover`` (ours).

The fakes' names and signatures are those of the installed wheel (checked first).
"""

from __future__ import annotations

import inspect
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from ms_recover.config import JobConfig
from ms_recover.integrations.mindio.enums import Action, RepairType, ReportState
from ms_recover.integrations.mindio.processor import Processor
from ms_recover.integrations.shims import path as shim_path
from ms_recover.protocol import messages as M

tft_mod = pytest.importorskip("mindspore.train.callback._train_fault_tolerance")
model_mod = pytest.importorskip("mindspore.train.model")

sys.path.insert(0, shim_path())
from mindio_ttp import framework_ttp  # noqa: E402

sys.path.remove(shim_path())


class FakeLink:
    def __init__(self) -> None:
        self.sent: list[M.Message] = []
        self.committed = -1

    def send(self, msg: M.Message, epoch: int | None = None) -> None:
        self.sent.append(msg)


def _processor(rank: int = 0) -> Processor:
    proc = Processor(rank, 3, JobConfig(node_nums=1, proc_per_node=3), action_timeout_s=5)
    proc.link = FakeLink()  # type: ignore[assignment]
    proc._formed = True
    return proc


def test_mindio_fakes_match_the_wheel_bindings() -> None:
    for name in ("send_recv", "_stop_device", "clean_tdt_channel", "reset_params"):
        assert callable(getattr(tft_mod, name)), name
    assert hasattr(tft_mod.CollectiveManager.get_instance(), "resume_hccl_comm")
    assert list(inspect.signature(tft_mod._tft_repair_callback).parameters) == [
        "step", "need_rebuild", "error_ranks", "repair_info", "args", "cb_ctx",
    ]  # fmt: skip
    assert list(inspect.signature(model_mod._handle_exception_info).parameters) == [
        "obj", "uce_env", "tft", "e",
    ]  # fmt: skip


def test_mindio_send_recv_pairs_reach_mindspore_repair_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pairs: list[tuple[int, int, int]] = []

    def fake_send_recv(params: list[Any], src: int, dst: int) -> int:
        pairs.append((len(params), src, dst))
        return 0

    monkeypatch.setattr(tft_mod, "send_recv", fake_send_recv)
    ctx = SimpleNamespace(tft=framework_ttp, device_id=0)
    args = SimpleNamespace(train_network=SimpleNamespace(get_parameters=lambda: iter("ab")))
    sender, receiver = _processor(0), _processor(2)
    for proc in (sender, receiver):
        proc.step_args = args
        proc.register("repair", tft_mod._tft_repair_callback, ctx)
    assert sender._on_repair(M.Repair(6, 0, [1, 2], -1)).ok
    assert receiver._on_repair(M.Repair(6, 0, [], 0)).ok
    assert pairs == [(2, 0, 1), (2, 0, 2), (2, 0, 2)]
    assert receiver.committed == 6


def test_mindio_uce_error_is_classified_by_mindspore_and_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc = _processor(1)
    monkeypatch.setattr(framework_ttp._impl.STATE, "processor", proc)
    obj = SimpleNamespace(is_uce_rank=False)
    model_mod._handle_exception_info(obj, True, framework_ttp, RuntimeError("UCEError: HBM"))
    assert obj.is_uce_rank is True
    fault = proc.link.sent[-1]  # type: ignore[union-attr]
    assert isinstance(fault, M.WorkerFault) and fault.kind == "device_memory"
    proc._release(Action.EXIT)  # RS_UNKNOWN holds the thread until the manager decided
    with pytest.raises(RuntimeError, match="boom"):
        model_mod._handle_exception_info(obj, True, framework_ttp, RuntimeError("boom"))
    assert proc.link.sent[-1].kind == "fatal"  # type: ignore[union-attr]


@pytest.mark.parametrize(("repair_type", "resumed"), [("retry", True), ("recover", False)])
def test_mindio_clean_resumes_hccl_only_for_retry(
    monkeypatch: pytest.MonkeyPatch, repair_type: str, resumed: bool
) -> None:
    calls: list[str] = []
    manager = SimpleNamespace(resume_hccl_comm=lambda: calls.append("resume"))
    monkeypatch.setattr(tft_mod, "CollectiveManager", SimpleNamespace(get_instance=lambda: manager))
    monkeypatch.setattr(tft_mod, "clean_tdt_channel", lambda: calls.append("tdt"))
    proc = _processor(0)
    proc.repair_type = repair_type
    monkeypatch.setattr(framework_ttp._impl.STATE, "processor", proc)
    ctx = SimpleNamespace(tft=framework_ttp, device_id=0)
    assert tft_mod._tft_clean_callback(False, None, ctx) == 0
    assert calls == (["tdt", "resume"] if resumed else ["tdt"])


def test_mindio_stop_reason_names_the_repair_type() -> None:
    proc = _processor(0)
    proc._report = ReportState.RS_HCCL_FAILED  # out of its step already: no stop handler
    for reason, want in [
        ("retry: rebuild in place and redo the step", "recover"),
        ("dump: save the last committed state", "dump"),
        ("exit: last resort", "unknow"),
    ]:
        proc._on_stop(M.Stop(reason))
        assert proc.repair_type == want
    assert RepairType.RT_SEND.value == 0
