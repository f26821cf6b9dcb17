"""Communicators: the CommBackend interface, the group log, and the host / Ascend backends."""

from ms_recover.comm.base import CommBackend, ReduceOp
from ms_recover.comm.grouplog import GroupLog

__all__ = ["CommBackend", "GroupLog", "ReduceOp"]
