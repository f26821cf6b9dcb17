"""Old path of :mod:`ms_recover.observability.timeline` (see :mod:`ms_recover._moved`)."""

from ms_recover.observability.timeline import *  # noqa: F403
