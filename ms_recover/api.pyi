"""Old path of :mod:`ms_recover.scheduler.api` (see :mod:`ms_recover._moved`)."""

from ms_recover.scheduler.api import *  # noqa: F403
