"""Moved to :mod:`ms_recover.observability.metrics`;
this old path is the same module (see :mod:`ms_recover._moved`)."""

from ms_recover._moved import alias
from ms_recover.observability.metrics import *  # noqa: F403 - the names, for type checkers

alias(__name__, "ms_recover.observability.metrics")
