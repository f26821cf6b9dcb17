"""The mindio_ttp shim against what the installed MindSpore wheel calls.

MindSpore's call sites are parsed with ``ast`` (not imported), so a MindSpore release that
calls another name, passes other arguments or registers a handler of another arity fails
here, naming the file and line.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from ms_recover.integrations.mindio.handlers import HANDLER_ARITY
from ms_recover.integrations.shims import path as shim_path

SHIMS = shim_path()
sys.path.insert(0, SHIMS)
from mindio_ttp import controller_ttp, framework_ttp  # noqa: E402

sys.path.remove(SHIMS)

CALLERS = ("utils/utils.py", "train/callback/_train_fault_tolerance.py", "train/model.py")


def _mindspore_dir() -> Path:
    spec = importlib.util.find_spec("mindspore")
    if spec is None or spec.origin is None:
        pytest.fail("mindspore is not installed (the [mindspore] extra)")
    return Path(spec.origin).parent


def _calls() -> list[tuple[str, int, str, int, list[str]]]:
    """(file, line, name, positional count, keywords) of every ``<x>.tft_*(...)`` call."""
    found = []
    for rel in CALLERS:
        tree = ast.parse((_mindspore_dir() / rel).read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith("tft_")
                and not node.func.attr.startswith("tft_notify")
            ):
                kws = [k.arg for k in node.keywords if k.arg]
                found.append((rel, node.lineno, node.func.attr, len(node.args), kws))
    return found


def test_mindio_every_call_of_the_wheel_binds_to_the_shim() -> None:
    calls = _calls()
    names = {c[2] for c in calls}
    # The wheel's known entry points are all among them (the parse found the real sites).
    assert {"tft_init_processor", "tft_wait_next_action", "tft_end_updating_os"} <= names
    for rel, line, name, npos, kws in calls:
        fn = getattr(framework_ttp, name, None)
        assert callable(fn), f"{rel}:{line} calls {name}, missing from the shim"
        try:
            inspect.signature(fn).bind(*([None] * npos), **{k: None for k in kws})
        except TypeError as exc:
            pytest.fail(f"{rel}:{line} calls {name} with {npos} args {kws}: {exc}")


def test_mindio_controller_names_imported_by_the_wheel_exist() -> None:
    tree = ast.parse((_mindspore_dir() / "utils/utils.py").read_text())
    imported = {
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "mindio_ttp.controller_ttp"
        for a in n.names
    }
    assert "tft_register_mindx_callback" in imported
    for name in imported:
        assert callable(getattr(controller_ttp, name, None)), name


def _handler_defs() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((_mindspore_dir() / CALLERS[1]).read_text())
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_mindio_registered_handlers_have_mindio_arity() -> None:
    tree = ast.parse((_mindspore_dir() / CALLERS[1]).read_text())
    defs = _handler_defs()
    seen = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("tft_register_")
        ):
            kind = node.func.attr[len("tft_register_") : -len("_handler")]
            arg = node.args[0]
            assert len(node.args) == 2, f"line {node.lineno}: (func, ctx) expected"
            if isinstance(arg, ast.Name) and arg.id in defs:
                seen[kind] = len(defs[arg.id].args.args)
    assert set(seen) == set(HANDLER_ARITY) - {"stream_sync"}
    for kind, arity in seen.items():
        assert arity == HANDLER_ARITY[kind], f"{kind}: MindSpore takes {arity}"


def test_mindio_enum_values_are_mindio_s() -> None:
    rs = framework_ttp.ReportState
    assert [m.name for m in rs] == [
        "RS_NORMAL", "RS_RETRY", "RS_UCE", "RS_UCE_CORRUPTED", "RS_HCCL_FAILED",
        "RS_INIT_FINISH", "RS_PREREPAIR_FINISH", "RS_STEP_FINISH", "RS_UNKNOWN",
    ]  # fmt: skip
    assert [m.value for m in rs] == list(range(9))
    rt = {m.name: m.value for m in framework_ttp.RepairType}
    assert rt == {
        "RT_SEND": 0, "RT_UCE_HIGHLEVEL": 1, "RT_UCE_LOWLEVEL": 2, "RT_RECV_REPAIR": 3,
        "RT_ROLLBACK": 4, "RT_LOAD_CKPT": 5, "RT_LOAD_REBUILD": 6,
    }  # fmt: skip
    assert {m.name: m.value for m in framework_ttp.Action} == {"RETRY": 0, "EXIT": 1}
    assert framework_ttp.REPAIR_TYPES == ("retry", "recover", "dump", "unknow")


def test_mindio_other_names_fail_clearly() -> None:
    with pytest.raises(NotImplementedError, match="not provided by ms_recover"):
        framework_ttp.tft_start_updating_os(3)
    with pytest.raises(AttributeError, match="not provided by ms_recover"):
        framework_ttp.tft_something_else  # noqa: B018
    with pytest.raises(Exception, match="tft_init_processor"):
        framework_ttp.tft_wait_next_action()  # before init: a clear order error


def test_mindio_handler_of_another_signature_is_refused() -> None:
    from ms_recover.config import JobConfig
    from ms_recover.integrations.mindio.handlers import TtpError
    from ms_recover.integrations.mindio.processor import Processor

    proc = Processor(0, 2, JobConfig(node_nums=1, proc_per_node=2))
    proc.register("stop", lambda args, ctx: None, None)
    with pytest.raises(TtpError, match="repair handler .* takes 5 positional parameters"):
        proc.register("repair", lambda a, b, c, d, e: None, None)
    with pytest.raises(TtpError, match="unknown handler 'nope'"):
        proc.register("nope", lambda: None, None)


def test_mindio_other_mindspore_release_is_named_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import types

    monkeypatch.setitem(sys.modules, "mindspore", types.SimpleNamespace(__version__="2.11.0"))
    monkeypatch.setattr(framework_ttp._impl.STATE, "pending", None)  # restored afterwards
    framework_ttp.tft_init_processor(0, 2, False, False, "", enable_arf=False)
    assert "follows MindSpore 2.10's calls; this is MindSpore 2.11.0" in caplog.text


def test_mindio_bad_port_is_a_one_line_error() -> None:
    from ms_recover.integrations.mindio.controller import ttp_config
    from ms_recover.integrations.mindio.handlers import TtpError

    with pytest.raises(TtpError, match=r"MS_TFT_PORT=70000: need a TCP port 1..65535"):
        ttp_config("127.0.0.1", 70000, 2)
