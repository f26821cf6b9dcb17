"""Old path of :mod:`ms_recover.protocol.transport` (see :mod:`ms_recover._moved`)."""

from ms_recover.protocol.transport import *  # noqa: F403
