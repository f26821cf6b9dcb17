"""Old path of :mod:`ms_recover.observability.events` (see :mod:`ms_recover._moved`)."""

from ms_recover.observability.events import *  # noqa: F403
