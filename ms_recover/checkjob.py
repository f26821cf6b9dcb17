"""Moved to :mod:`ms_recover.jobcheck.check`; this old import path re-exports it."""

from ms_recover.jobcheck.check import KIND as KIND
from ms_recover.jobcheck.check import META_FIELDS as META_FIELDS
from ms_recover.jobcheck.check import FileReport as FileReport
from ms_recover.jobcheck.check import Finding as Finding
from ms_recover.jobcheck.check import Issue as Issue
from ms_recover.jobcheck.check import check_file as check_file
from ms_recover.jobcheck.check import check_job as check_job
from ms_recover.jobcheck.check import check_text as check_text
from ms_recover.jobcheck.check import configure as configure
from ms_recover.jobcheck.check import run as run
