"""Old path of :mod:`ms_recover.observability.report` (see :mod:`ms_recover._moved`)."""

from ms_recover.observability.report import *  # noqa: F403
