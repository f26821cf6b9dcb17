"""Who may change the manager's model (``JobModel``), read from the code with ``ast``.

The rule (docs/design.md, ``ms_recover/manager/model.py``): the server's handlers record facts
as they arrive (what members reported, faults, notices, the clock); the executor applies
decisions (the actions ``decide`` returned). ``decide`` and the strategies change nothing.

A write is an assignment, augmented assignment or ``del`` whose target is rooted at the model
(``m.x``, ``model.x``, ``self.model.x``, and names bound from them: ``info = m.ranks[r]``,
``for info in m.ranks.values()``, a parameter typed ``RankInfo``, a local helper's result typed
``RankInfo``), or a call of a mutating method on such a value (``m.pending.append``,
``info.ack``, ``m.transition``).
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import pathlib

import pytest

import ms_recover
from ms_recover.manager.model import JobModel

MANAGER = pathlib.Path(ms_recover.__file__).parent / "manager"
FIELDS = {f.name for f in dataclasses.fields(JobModel)}

#: Decisions: only the executor applies them.
DECISIONS = frozenset(
    {
        "state",
        "epoch",
        "round",
        "tries",
        "active",
        "recoveries",
        "last_recovery",
        "exit_code",
        "restarts",
        "flagged",
        "judged_rev",
        "switching",  # hot switches in progress (the sub-health policy's)
        "settled_nodes",  # flagged nodes the sub-health policy has acted on
        "promoted",  # nodes whose place was given to a spare node
    }
)
#: Facts: the handlers record them as they arrive (the executor may change them too).
FACTS = frozenset(
    {
        "ranks",  # liveness, identity, acks, committed steps, digests of each rank
        "agents",  # liveness of each node's agent
        "pending",  # faults detected, waiting for the next decision
        "early_exits",
        "leaving",  # planned stops announced
        "stop_asked",  # the manager's own SIGTERM with no standby to hand over to
        "health",
        "health_rev",
        "led_stops",  # nodes whose STOP went through their heartbeat group's leader
        "heard_at",
        "restore",  # a restarted manager's members re-registering
        "manager",  # this manager's role among the job's managers
        "group_log",
        "diverged_at",  # when each rank's replica digest diverged
        "backups",  # when a switching node's new pod said hello
        "spares",  # spare nodes' agents that said hello
    }
)
NOBODY = frozenset({"config"})
#: The decisions written outside the executor, and why that is a fact, not a decision.
EXCEPTIONS = {
    ("workers.py", "WorkerHandlers.note_rejoin", "epoch"): "a restarted manager adopts the "
    "epoch its members report while it is still forming, before it has decided anything",
    ("budget.py", "record", "restarts"): "the executor's helper (Executor._start_round)",
}
#: Modules of the pure decision layer: they write nothing.
PURE = ("decide.py", "rounds.py", "phases.py", "cadence.py", "commands.py", "ending.py")
PURE_PACKAGES = ("strategies",)

MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "remove"}
    | {"add", "discard", "transition", "ack", "record"}
)
PARTS = {"RankInfo": "ranks", "AgentInfo": "agents", "Round": "round", "Restore": "restore"}
VIEWS = frozenset({"get", "items", "values", "setdefault"})


def _is_model(e: ast.expr, alias: dict[str, str]) -> bool:
    if isinstance(e, ast.Name):
        return e.id in ("m", "model") or alias.get(e.id) == "*"
    return isinstance(e, ast.Attribute) and e.attr == "model"


def _field(e: ast.expr, alias: dict[str, str]) -> str | None:
    """The model field ``e`` is rooted at ("*": the model itself), or None."""
    while True:
        if _is_model(e, alias):
            return "*"
        if isinstance(e, ast.Subscript):
            e = e.value
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
            if e.func.attr not in VIEWS:
                return None
            e = e.func.value
        elif isinstance(e, ast.Attribute):
            if _is_model(e.value, alias):
                return e.attr if e.attr in FIELDS else None
            e = e.value
        elif isinstance(e, ast.Name):
            return alias.get(e.id)
        else:
            return None


def _names(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _names(t)]
    return [target]


def _part(annotation: ast.expr | None) -> str | None:
    text = ast.unparse(annotation) if annotation is not None else ""
    if "JobModel" in text:
        return "*"
    return next((field for name, field in PARTS.items() if name in text), None)


def _aliases(fn: ast.FunctionDef, returns: dict[str, str]) -> dict[str, str]:
    """Names in ``fn`` bound to a part of the model."""
    alias: dict[str, str] = {}
    for arg in fn.args.args + fn.args.kwonlyargs:
        part = _part(arg.annotation)
        if part:
            alias[arg.arg] = part
    for node in ast.walk(fn):
        value, targets = None, []
        if isinstance(node, ast.Assign):
            value, targets = node.value, [n for t in node.targets for n in _names(t)]
        elif isinstance(node, (ast.For, ast.comprehension)):
            value, targets = node.iter, _names(node.target)
        if value is None:
            continue
        field = _field(value, alias)
        call = value.func if isinstance(value, ast.Call) else None
        if field is None and isinstance(call, (ast.Attribute, ast.Name)):
            field = returns.get(call.attr if isinstance(call, ast.Attribute) else call.id)
        for t in targets:
            if isinstance(t, ast.Name) and field:
                alias[t.id] = field
    return alias


def _writes_in(fn: ast.FunctionDef, returns: dict[str, str]) -> set[str]:
    alias = _aliases(fn, returns)
    out: set[str] = set()
    for node in ast.walk(fn):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [n for t in node.targets for n in _names(t)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATORS:
                field = _field(node.func.value, alias)
                if field == "*" and node.func.attr == "transition":
                    out.add("state")
                elif field and field != "*":
                    out.add(field)
        for t in targets:
            field = None if isinstance(t, ast.Name) else _field(t, alias)
            if field and field != "*":
                out.add(field)
    return out


def model_writes() -> dict[tuple[str, str], set[str]]:
    """(file under manager/, function) -> the model fields it changes."""
    found: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for path in sorted(MANAGER.rglob("*.py")):
        if path.name == "model.py":
            continue  # the model's own methods (transition: the table)
        name = path.relative_to(MANAGER).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        returns = {
            fn.name: part
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef) and (part := _part(fn.returns))
        }
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef):
                    writes = _writes_in(child, returns)
                    if writes:
                        found[(name, prefix + child.name)] |= writes
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, f"{prefix}{child.name}."))
    return found


WRITES = model_writes()


def test_every_model_field_is_a_fact_or_a_decision() -> None:
    assert DECISIONS | FACTS | NOBODY == FIELDS
    assert not (DECISIONS & FACTS)


def test_only_the_executor_applies_decisions() -> None:
    wrong = [
        f"{module} {function} writes {field}"
        for (module, function), fields in sorted(WRITES.items())
        for field in sorted(fields)
        if module != "executor.py"
        and field not in FACTS
        and (module, function, field) not in EXCEPTIONS
    ]
    assert wrong == [], "a decision written outside the executor: return an action instead"


def test_nobody_writes_the_config_and_every_exception_is_still_needed() -> None:
    assert not any(fields & NOBODY for fields in WRITES.values())
    for module, function, field in EXCEPTIONS:
        assert field in WRITES.get((module, function), set()), (module, function, field)


@pytest.mark.parametrize("module", PURE)
def test_the_decision_layer_changes_nothing(module: str) -> None:
    assert {k: v for k, v in WRITES.items() if k[0] == module} == {}


def test_the_strategies_change_nothing() -> None:
    assert [k for k in WRITES if k[0].split("/")[0] in PURE_PACKAGES] == []


def test_the_reader_sees_the_writes_it_must() -> None:
    """The scan is not blind: writes of each form are found where they are."""
    assert "state" in WRITES[("executor.py", "Executor._transition")]  # m.transition(...)
    assert "round" in WRITES[("executor.py", "Executor._start_round")]  # m.round = ...
    assert "agents" in WRITES[("agents.py", "AgentSide._agent_beat")]  # parameter alias
    assert "pending" in WRITES[("workers.py", "WorkerHandlers.on_fault")]  # m.pending.append
    assert "ranks" in WRITES[("workers.py", "WorkerHandlers.on_hello")]  # info = m.ranks[r]
    assert "ranks" in WRITES[("workers.py", "WorkerHandlers.on_stopped")]  # helper result
