"""Untrusted text made safe to print on a terminal.

Fault messages, event details, endpoints and job ids come from ranks, agents and event logs:
any process that can write a log line or sign a frame chose them. Printed as they are, an
escape sequence in one can move the cursor, rewrite earlier lines, retitle the window or hide
the rest of the output, and a newline can forge a line of its own.

:func:`safe` keeps printable text as it is and makes every other character visible as a
Python-style escape: ``\\x1b`` for ESC, ``\\n`` for a newline, ``\\u202e`` for a bidirectional
override, and a backslash doubled, so that what is printed always reads back to the original.
The result is one line with no control character, whatever the input.
"""

from __future__ import annotations

import unicodedata
from typing import Any

#: The escapes of the commonest control characters, as Python writes them.
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
#: Unicode categories never printed as they are: controls (C0, DEL, C1), format characters
#: (bidirectional overrides, zero-width joiners), surrogates, private use and unassigned, and
#: the line and paragraph separators.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _plain(char: str) -> bool:
    return char != "\\" and (" " <= char < "\x7f" or unicodedata.category(char) not in _HIDDEN)


def safe(value: Any) -> str:
    """``value`` as text (``str()`` of a non-string) with every control, format or separator
    character and every backslash escaped: one printable line (``'a\\x1b[2Jb'`` prints as
    ``a\\x1b[2Jb``)."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable() and "\\" not in text:
        return text  # the common case, at C speed
    return "".join(char if _plain(char) else _escape(char) for char in text)
