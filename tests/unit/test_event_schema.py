"""The event schema: every kind round-trips through a line, bad lines are refused in one line,
and every record the code defines is registered."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import types
import typing
from typing import Any

import pytest

import ms_recover
from ms_recover.observability import schema
from ms_recover.observability.events import read_lines
from ms_recover.observability.schema import (
    RECORDS,
    SCHEMA_VERSION,
    EventLine,
    FaultRecord,
    MemberRecord,
    Record,
    SchemaError,
    decode,
    dumps,
    encode,
    parse_line,
)

PACKAGE = pathlib.Path(ms_recover.__file__).parent

#: A value of each type a field can have (not a zero: a field dropped on the way shows).
SAMPLES: dict[Any, Any] = {
    int: 7,
    float: 2.5,
    str: "rank 3 died",
    bool: True,
    list[int]: [1, 3],
    list[str]: ["a", "b"],
    dict[str, float]: {"stop": 0.25},
    dict[str, int]: {"0": 12},
    dict[str, str]: {"0": "ab12"},
}


def _sample(cls: type[Record], optional: bool) -> Record:
    """A record of ``cls`` with a sample in every field (optional ones left None unless
    ``optional``)."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is types.UnionType:
            arm = next(a for a in typing.get_args(hint) if a is not type(None))
            required = f.default is dataclasses.MISSING
            values[f.name] = SAMPLES[arm] if optional or required else None
        else:
            values[f.name] = SAMPLES[hint]
    return cls(**values)


def _record_classes() -> dict[str, str]:
    """Every class in the package that derives from a record class (by the names of its bases),
    and the file that defines it: found with ``ast``, nothing imported."""
    bases = {"Record", *(cls.__name__ for cls in RECORDS.values())}
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            names = {
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            }
            if names & bases:
                found[node.name] = path.relative_to(PACKAGE).as_posix()
    return found


@pytest.mark.parametrize("kind", sorted(RECORDS))
@pytest.mark.parametrize("optional", [False, True])
def test_every_kind_round_trips_through_a_line(kind: str, optional: bool) -> None:
    record = _sample(RECORDS[kind], optional)
    line = EventLine(1700000000.5, record, "job-a", SCHEMA_VERSION, 4, "running")
    text = dumps(encode(line))
    assert "\n" not in text
    assert parse_line(text) == line
    obj = json.loads(text)
    assert obj["event"] == kind and obj["job_id"] == "job-a" and obj["schema"] == SCHEMA_VERSION
    assert set(obj) == {*schema.ENVELOPE, *record.fields()}


def test_the_envelope_leaves_out_what_it_does_not_have() -> None:
    line = EventLine(3.0, schema.ManagerRestoreRecord())
    assert encode(line) == {"ts": 3.0, "event": "manager_restore", "job_id": "", "schema": 1}
    assert decode(encode(line)) == line


def test_a_line_written_before_the_schema_field_reads_as_layout_one() -> None:
    fault = FaultRecord("hang", 1, 0, "no commit", 3.0, 41)
    old = {"ts": 5, "event": "fault", **fault.fields()}
    assert decode(old) == EventLine(5.0, fault, "", 1)


def test_keys_this_reader_does_not_know_are_dropped() -> None:
    member = MemberRecord("agent", 12, False, node_rank=1, pod_ip="10.0.0.2")
    line = {**encode(EventLine(1.0, member)), "added_later": [1, 2]}
    assert decode(line).record == member


def test_every_record_class_is_in_the_schema_and_registered_under_its_event() -> None:
    defined = _record_classes()
    assert set(defined.values()) == {"observability/schema.py"}
    assert set(defined) == {cls.__name__ for cls in RECORDS.values()}
    assert all(RECORDS[cls.EVENT] is cls and cls.EVENT for cls in RECORDS.values())


GOOD = encode(EventLine(1.0, FaultRecord("rank_exit", 1, 0, "rank 1 died", 0.1, 9), "j", 1, 2))


def _with(**changes: Any) -> str:
    line = {**GOOD, **changes}
    return json.dumps({k: v for k, v in line.items() if v is not ...})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"ts": 1', "not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
        ("[" * 100_000, "not usable JSON (RecursionError)"),
        ('{"ts": 1, "x": 1' + "9" * 5000 + "}", "not usable JSON"),
        (_with(event=...), "no string 'event' field"),
        (_with(event=3), "no string 'event' field"),
        (_with(event="faults"), "unknown event 'faults' (known: config_warning, decision,"),
        (_with(ts=...), "'ts' is None, not a number of seconds"),
        (_with(ts="yesterday"), "'ts' is 'yesterday', not a number of seconds"),
        (_with(ts=True), "'ts' is True"),
        (_with(ts=-1.0), "'ts' is -1.0"),
        ('{"ts": NaN, "event": "manager_restore"}', "'ts' is nan"),
        (_with(schema=SCHEMA_VERSION + 1), f"schema {SCHEMA_VERSION + 1} is not one of 1..1"),
        (_with(schema="1"), "schema '1' is not one of"),
        (_with(job_id=5), "fault: 'job_id' is 5, not str"),
        (_with(epoch="2"), "fault: 'epoch' is '2', not int | None"),
        (_with(detail=...), "fault: no 'detail' field"),
        (_with(rank=True), "fault: 'rank' is True, not int"),
        (_with(rank=1.5), "fault: 'rank' is 1.5, not int"),
        (_with(detect_s="0.1"), "fault: 'detect_s' is '0.1', not float"),
        (_with(detect_s=1e400), "fault: 'detect_s' is inf, not float"),
        (_with(pid="12"), "fault: 'pid' is '12', not int | None"),
        (_with(detail=["a"]), "fault: 'detail' is ['a'], not str"),
        (_with(event="recovery"), "recovery: no 'ok' field"),
        (_with(event="world", active=[1, "2"]), "world: 'active' is [1, '2'], not list[int]"),
        (_with(event="job_start", phases={"stop": "1"}), "'phases' is {'stop': '1'}, not dict"),
        (_with(event="job_end", exit_code=0, reason="x" * 500), ""),  # long text is fine
    ],
)
def test_a_bad_line_is_refused_with_a_one_line_reason(text: str, problem: str) -> None:
    if not problem:
        assert parse_line(text).event == "job_end"
        return
    with pytest.raises(SchemaError) as caught:
        parse_line(text)
    message = str(caught.value)
    assert problem in message
    assert "\n" not in message and len(message) < 400


def test_a_reader_counts_bad_lines_and_names_the_first_never_raising() -> None:
    hostile = json.dumps({**GOOD, "event": "\x1b[2J\u202eforged"})
    lines = [dumps(GOOD), "", "not json", hostile, "\xff\xfe", dumps(GOOD)]
    events, bad, first = read_lines(lines)
    assert len(events) == 2 and bad == 3
    assert first.startswith("line 3: not JSON")
    _, _, hostile_first = read_lines([hostile])
    assert "\x1b" not in hostile_first and "\u202e" not in hostile_first  # repr escapes them


def test_a_value_repr_cannot_show_is_named_by_its_type() -> None:
    line = {**GOOD, "detail": 10**5000}  # repr() refuses more than 4300 digits
    with pytest.raises(SchemaError, match=r"fault: 'detail' is a int, not str"):
        decode(line)
    deep: list[Any] = []
    for _ in range(900):
        deep = [deep]
    with pytest.raises(SchemaError, match=r"fault: 'detail' is \[\[\["):
        parse_line(json.dumps({**GOOD, "detail": deep}))
