"""Old path of :mod:`ms_recover.scheduler.autostart` (see :mod:`ms_recover._moved`)."""

from ms_recover.scheduler.autostart import *  # noqa: F403
