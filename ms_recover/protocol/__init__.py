"""Wire protocol: one frozen dataclass per message, and a msgpack + HMAC codec.

The message definitions are pure; only the codec imports msgpack, and it loads on first use of
``Codec`` or ``Envelope`` here (PEP 562), so the manager's pure layers can import the messages
without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ms_recover.protocol.messages import KINDS, Message

if TYPE_CHECKING:
    from ms_recover.protocol.codec import Codec, Envelope

__all__ = ["Codec", "Envelope", "KINDS", "Message"]


def __getattr__(name: str) -> Any:
    if name not in ("Codec", "Envelope"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("ms_recover.protocol.codec"), name)
    globals()[name] = value
    return value
