"""Untrusted text is printed safely (issue 26 #7): ``report`` and ``status`` escape what ranks,
agents and event logs chose, so no escape sequence reaches the terminal and no line is forged."""

from __future__ import annotations

import ast
import json
import pathlib
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_recover import cli
from ms_recover.observability.safetext import safe
from ms_recover.observability.status import render
from tests.eventlines import line

HOSTILE = "boom\x1b[2J\x1b]0;owned\x07\r\nrank 9 ok\u202eevil\x9b31m\\x1b"
HIDDEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _unescape(text: str) -> str:
    """What Python reads back from ``text`` as the body of a string literal."""
    return str(ast.literal_eval('"' + text.replace('"', '\\"') + '"'))


def test_escape_sequences_and_newlines_are_made_visible() -> None:
    shown = safe(HOSTILE)
    assert shown == ("boom\\x1b[2J\\x1b]0;owned\\x07\\r\\nrank 9 ok\\u202eevil\\x9b31m\\\\x1b")
    assert safe("plain text, ünïcode, 中文") == "plain text, ünïcode, 中文"
    assert safe(42) == "42" and safe(None) == "None"


@settings(max_examples=300, deadline=None)
@given(st.text() | st.text(alphabet=st.characters(max_codepoint=0x2100)))
def test_any_text_prints_as_one_line_that_reads_back(text: str) -> None:
    shown = safe(text)
    assert not any(unicodedata.category(c) in HIDDEN for c in shown), shown
    assert len(shown.splitlines()) <= 1
    assert _unescape(shown) == text


def test_report_escapes_what_the_event_log_holds(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    # Well-formed lines carry hostile text in their string fields; a malformed line's own text
    # (its event name, a key) reaches the terminal only through the skipped-line warning.
    events = [
        line(1.0, "job_start", 0),
        line(2.0, "fault", 1, kind="worker_error", rank=1, detail=HOSTILE, host=HOSTILE),
        line(3.0, "job_end", 1, reason="x\ny\x1b[H", exit_code=0),
        {"ts": 4.0, "event": "job\x1b[Hend", "epoch": 1, "reason\x07": "x\ny"},
    ]
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert cli.main(["report", str(log)]) == 0
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert not any(unicodedata.category(c) == "Cc" for c in printed.replace("\n", ""))
    assert "\u202e" not in printed
    timeline = captured.out.split("\n\n")[0].splitlines()
    assert len(timeline) == 3, timeline  # one line per well-formed event: nothing forged
    assert "detail=boom\\x1b[2J" in timeline[1] and "host=boom\\x1b[2J" in timeline[1]
    assert "reason=x\\ny\\x1b[H" in timeline[2]
    assert "skipped 1 malformed line" in captured.err and "x1b[Hend" in captured.err


def test_status_escapes_what_members_reported() -> None:
    status = {
        "job_id": "j\x1b[2J",
        "state": "running",
        "epoch": 1,
        "world_size": 1,
        "strategies": "recover",
        "recoveries": 0,
        "agents": [
            {"node_rank": 0, "alive": True, "pid": 5, "pod_ip": HOSTILE, "is_scheduler": True}
        ],
        "ranks": [
            {
                "rank": 0,
                "node_rank": 0,
                "done": False,
                "alive": True,
                "step": 4,
                "silent_s": 0.1,
                "pid": 6,
                "incarnation": 0,
            }
        ],
        "last_faults": [
            {"kind": "rank_exit", "rank": 0, "node_rank": 0, "host": HOSTILE, "detail": HOSTILE}
        ],
        "flagged": [{"rank": 0, "node": 0, "host": HOSTILE, "step": 4, "reason": HOSTILE}],
        "last_recovery": {
            "strategy": "recover\x1b]0;t\x07",
            "ok": True,
            "mttr_s": 1.0,
            "lost_steps": 0,
            "phases": {"stop\x1b[1A": 0.5},
        },
    }
    text = render(status, ranks=True)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert len(text.splitlines()) == 8
    assert "ip=boom\\x1b[2J" in text and "on boom\\x1b[2J" in text
    assert "recover\\x1b]0;t\\x07" in text and "stop\\x1b[1A" in text
