"""The exception tree of ms_recover.

Every error raised on purpose by the library derives from :class:`MsRecoverError`, and every
message names the values involved and, where it applies, the valid alternatives.
"""

from __future__ import annotations


class MsRecoverError(Exception):
    """Base of every error ms_recover raises on purpose."""


class ConfigError(MsRecoverError, ValueError):
    """A setting (argument, environment variable, YAML field) is unknown or invalid."""


class ProtocolError(MsRecoverError):
    """A network frame is malformed, unauthenticated, foreign, stale or too large."""


class CommError(MsRecoverError):
    """A data-plane operation failed (peer gone, bad frame, mismatched call)."""


class Interrupted(CommError):
    """A blocked collective was aborted because the job is entering recovery.

    It is not a failure of the calling rank: the step loop catches it, waits for the
    manager's instructions, and redoes the interrupted step after recovery.
    """


class RepairError(MsRecoverError):
    """State repair failed: checksum mismatch, missing or mismatched tensor, or source lost."""


class RecoveryError(MsRecoverError):
    """Recovery could not complete and the job must end (the manager said EXIT)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
