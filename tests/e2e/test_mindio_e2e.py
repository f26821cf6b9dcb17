"""MindSpore's own TFT path (``Model.train`` + ``TrainFaultTolerance`` + ``TftHandle``) on the
ms_recover manager, on CPU with real mccl collectives and the test kit's listed lifts.

Four cluster runs of two ranks: an uninterrupted reference (manager mode), an HCCL fault
repaired by send/recv (stub mode: the manager inside rank 0), a dump (stub mode) and an
unknown error with no strategy left (manager mode).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ms_recover import exitcodes
from ms_recover.worker.repair import sha256_of
from tests.e2e.mindio_cluster import Run, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TFT = "{TTP:1,HCCE:1,TSP:1}"  # TSP: MindSpore pauses in tft_pause_train, where the prelock is
FAULT_STEP = 5
TOTAL_STEPS = 16  # 512 samples / 2 ranks / batch 16


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    ref = run(tmp_path_factory.mktemp("mindio-ref"), tft=TFT, strategies="retry,exit", manager=True)
    assert ref.codes["rank 0"] == ref.codes["rank 1"] == 0, ref.logs()
    assert ref.rank(0)["sha256"] == ref.rank(1)["sha256"]
    assert len(ref.steps(0)) == TOTAL_STEPS
    return ref


def _event(r: Run, name: str) -> dict[str, Any]:
    found = [e for e in r.events if e["event"] == name]
    assert found, f"no {name} event in {[e['event'] for e in r.events]}"
    return found[-1]


def test_mindio_e2e_hccl_fault_repaired_by_mindspore_handlers_bit_identical(
    tmp_path: Path, reference: Run
) -> None:
    r = run(tmp_path, tft=TFT, strategies="retry,exit", fault=f"1:{FAULT_STEP}:hcce")
    assert r.codes["rank 0"] == r.codes["rank 1"] == 0, r.logs()
    survivor, faulty = r.rank(0), r.rank(1)
    # MindSpore's own handlers, in MindIO's order; the faulty rank had left its step already.
    assert survivor["trace"] == ["stop", "clean", "rebuild_group", "repair"]
    assert faulty["trace"] == ["clean", "rebuild_group", "repair"]
    assert survivor["foreign_handlers"] == faulty["foreign_handlers"] == {}
    # Stub mode: MindSpore started the controller (our manager) inside rank 0 only.
    assert survivor["controller_here"] is True and faulty["controller_here"] is False
    assert survivor["repair_step"] == faulty["repair_step"] == FAULT_STEP
    log1 = (tmp_path / "rank-1.log").read_text()
    assert "uce wrapper caught HCCEError" in log1
    assert "SEND_RECV repair type:3, src_rank:[0], dst_rank: [1]" in log1
    assert "Enter _tft_rebuild_groups ok" in log1  # real _finalize_comm/_rebuild_group on mccl
    # Repaired from rank 0 at step 5 although rank 1's weights were zeroed: bit-identical.
    assert survivor["sha256"] == faulty["sha256"] == reference.rank(0)["sha256"]
    rec = _event(r, "recovery")
    assert rec["ok"] is True and rec["strategy"] == "retry" and rec["target_step"] == 4
    assert rec["lost_steps"] == 0
    print(f"MTTR through MindSpore's own path: {rec['mttr_s']:.3f}s phases={rec['phases']}")


def test_mindio_e2e_dump_saved_by_mindspore_renamed_once_loads_bit_identical(
    tmp_path: Path, reference: Run
) -> None:
    import mindspore as ms

    r = run(tmp_path, tft=TFT, strategies="dump,exit", fault=f"1:{FAULT_STEP}:unknown")
    end = _event(r, "job_end")
    assert end["exit_code"] == exitcodes.DUMPED, r.logs()
    assert r.codes["rank 0"] == r.codes["rank 1"] == 1  # MindSpore's exit handler: os._exit(1)
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == [f"ttp_saved_checkpoints-step_{FAULT_STEP}"]
    files = list((ckpt / f"ttp_saved_checkpoints-step_{FAULT_STEP}").rglob("*.ckpt"))
    assert [f.parent.name for f in files] == ["rank_0"]  # one replica saved the only shard
    params = ms.load_checkpoint(str(files[0]))
    weights = {n: params[n].asnumpy() for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    assert sha256_of(weights) == reference.steps(0)[FAULT_STEP]
    assert int(params["step_num"].asnumpy()) == FAULT_STEP
    # The manager's manifest names the same file, linked into its dump directory.
    manifest = json.loads((tmp_path / "dump" / "manifest.json").read_text())
    assert [f["file"] for f in manifest["files"]] == ["rank_0.ckpt"]
    assert manifest["step"] == FAULT_STEP - 1  # ms_recover counts from 0
    assert (tmp_path / "dump" / "rank_0.ckpt").read_bytes() == files[0].read_bytes()


def test_mindio_e2e_unknown_error_no_strategy_left_exits_with_final_event(
    tmp_path: Path,
) -> None:
    r = run(
        tmp_path, tft=TFT, strategies="retry,exit", fault=f"1:{FAULT_STEP}:unknown", manager=True
    )
    end = _event(r, "job_end")
    assert end["exit_code"] == exitcodes.JOB_EXIT, r.logs()
    assert "retry: needs a fault the rank survives" in end["reason"], end
    assert r.codes["rank 0"] == r.codes["rank 1"] == 1
    assert "uce wrapper caught other RuntimeError" in (tmp_path / "rank-1.log").read_text()
    assert not (tmp_path / "rank_0.json").exists()  # training did not go on


def test_mindio_e2e_reference_ran_every_step_through_the_processor(reference: Run) -> None:
    # Manager mode (MINDX_TASK_ID set): MindSpore started no controller in rank 0.
    assert reference.rank(0)["controller_here"] is False
    assert reference.rank(0)["trace"] == [] and reference.rank(0)["foreign_handlers"] == {}
    assert _event(reference, "job_end")["exit_code"] == 0
