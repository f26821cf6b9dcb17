"""Moved to :mod:`ms_recover.jobcheck.schema`; this old import path re-exports it."""

from ms_recover.jobcheck.schema import CRD_RESOURCE as CRD_RESOURCE
from ms_recover.jobcheck.schema import CrdInfo as CrdInfo
from ms_recover.jobcheck.schema import Path as Path
from ms_recover.jobcheck.schema import Schema as Schema
from ms_recover.jobcheck.schema import SchemaIssue as SchemaIssue
from ms_recover.jobcheck.schema import format_path as format_path
from ms_recover.jobcheck.schema import load_crd as load_crd
from ms_recover.jobcheck.schema import validate as validate
