"""Moved to :mod:`ms_recover.worker.record`; this old path re-exports it."""

from ms_recover.worker.record import write_rank_record

__all__ = ["write_rank_record"]
