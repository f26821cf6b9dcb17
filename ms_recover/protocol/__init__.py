"""Wire protocol: one frozen dataclass per message, and a msgpack + HMAC codec."""

from ms_recover.protocol.codec import Codec, Envelope
from ms_recover.protocol.messages import KINDS, Message

__all__ = ["Codec", "Envelope", "KINDS", "Message"]
