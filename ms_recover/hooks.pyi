"""Old path of :mod:`ms_recover.scheduler.hooks` (see :mod:`ms_recover._moved`)."""

from ms_recover.scheduler.hooks import *  # noqa: F403
