"""The bounded YAML reader of check-job: memory, depth, tags, odd files (issue 9 #9)."""

from __future__ import annotations

import os
import pathlib
import threading
import tracemalloc

import pytest

from ms_recover.jobcheck import yamlread
from ms_recover.jobcheck.yamlread import ReadError


def _bomb(levels: int) -> str:
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + f"\nkind: AscendJob\nmetadata: {{labels: {{x: *l{levels - 1}}}}}\n"


def test_billion_laughs_is_refused_with_bounded_memory() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ReadError, match="expands to more than 100000 nodes"):
            list(yamlread.documents(_bomb(9)))  # 10**9 nodes if expanded
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20


def test_small_aliases_are_still_fine() -> None:
    text = "base: &b {a: 1}\nkind: AscendJob\nspec: {x: *b, y: *b}\n"
    [(index, doc)] = list(yamlread.documents(text))
    assert index == 1
    assert doc["spec"] == {"x": {"a": 1}, "y": {"a": 1}}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: !!float abc\n", "line 1, column 4: 'abc' is not a valid !!float value"),
        ("a: !!int 0x\n", "'0x' is not a valid !!int value"),
        ("a: !!timestamp 2020-13-45\n", "is not a valid !!timestamp value"),
        ("a: !!python/object:os.system x\n", "is not valid YAML"),
        ("a: &a [*a]\n", "a recursive alias"),
        ("a: " + "[" * 70 + "]" * 70 + "\n", "nests deeper than 64 levels"),
        ("a: 1\na: 2\n", "duplicate key 'a'"),
    ],
)
def test_bad_documents_are_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(ReadError) as info:
        list(yamlread.documents(text))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_documents_before_a_bad_one_are_kept() -> None:
    got = []
    with pytest.raises(ReadError, match="line 5, column 4"):
        for item in yamlread.documents("a: 1\n---\nb: 2\n---\nc: !!int x\n"):
            got.append(item)
    assert got == [(1, {"a": 1}), (2, {"b": 2})]


def test_file_size_is_capped(tmp_path: pathlib.Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * yamlread.MAX_BYTES + "\n")
    with pytest.raises(ReadError, match="is larger than 1 MiB"):
        yamlread.read_text(str(big))


def test_devices_fifos_and_directories_are_never_read(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result: list[str] = []

    def read() -> None:  # a blocking open would hang here; the thread shows it
        try:
            yamlread.read_text(str(fifo))
        except ReadError as exc:
            result.append(str(exc))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert result == ["is not a regular file (a device, FIFO or socket is never read)"]
    with pytest.raises(ReadError, match="is not a regular file"):
        yamlread.read_text("/dev/zero")
    with pytest.raises(ReadError, match="is a directory"):
        yamlread.read_text(str(tmp_path))
    with pytest.raises(ReadError, match="no such file"):
        yamlread.read_text(str(tmp_path / "missing"))
