"""Old path of :mod:`ms_recover.observability.status` (see :mod:`ms_recover._moved`)."""

from ms_recover.observability.status import *  # noqa: F403
