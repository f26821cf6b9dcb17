"""Old path of :mod:`ms_recover.observability.metrics` (see :mod:`ms_recover._moved`)."""

from ms_recover.observability.metrics import *  # noqa: F403
