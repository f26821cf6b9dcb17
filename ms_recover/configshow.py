"""Print the effective job configuration and where each value came from.

Every field of the job configuration, as the manager and the agent would build it here, with its
source: a flag of this command, an ms_recover variable (``MS_RECOVER_*``), a variable the Ascend
Operator / MindCluster sets (``MINDX_TASK_ID``, ``MS_SCHED_HOST``, ``MS_WORKER_NUM``, ...), or
the default. The secret is never printed: only whether one is set and from where.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from ms_recover.config import ENV_KEYS, JobConfig, env_fields
from ms_recover.errors import ConfigError
from ms_recover.strategy import format_strategies

#: Flags of this command -> the field each sets (the same flags as ``ms-recover manager``).
FLAGS = {"host": "manager_host", "port": "manager_port", "job_id": "job_id"}
OURS = "MS_RECOVER_"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="manager host (env MS_SCHED_HOST)")
    p.add_argument("--port", type=int, help="manager port (env MS_RECOVER_PORT)")
    p.add_argument("--job-id", help="job id (env MINDX_TASK_ID)")
    p.add_argument("--json", action="store_true", help="print {field: {value, source}} as JSON")


def sources(environ: Mapping[str, str], flags: Mapping[str, Any]) -> dict[str, str]:
    """Field -> where its value came from. A variable is a field's source when the field
    changes without it (found by reading the environment once per variable set)."""
    found = env_fields(environ)
    by_field: dict[str, list[str]] = {}
    unclear: list[str] = []
    for key in sorted(k for k in ENV_KEYS if k in environ):
        try:
            without = env_fields({k: v for k, v in environ.items() if k != key})
        except ConfigError:  # the others alone are inconsistent: it counts where unexplained
            unclear.append(key)
            continue
        for name, value in found.items():
            if without.get(name) != value:
                by_field.setdefault(name, []).append(key)
    out = {}
    for f in dataclasses.fields(JobConfig):
        if f.name in flags:
            out[f.name] = "flag --" + next(k for k, v in FLAGS.items() if v == f.name).replace(
                "_", "-"
            )
        elif f.name in found:
            out[f.name] = _describe(by_field.get(f.name) or unclear)
        else:
            out[f.name] = "default"
    return out


def _describe(keys: list[str]) -> str:
    ours = [k for k in keys if k.startswith(OURS)]
    theirs = [k for k in keys if not k.startswith(OURS)]
    parts = [f"env {', '.join(ours)}"] if ours else []
    parts += [f"MindCluster {', '.join(theirs)}"] if theirs else []
    return "; ".join(parts) or "environment"


def _shown(name: str, value: Any) -> Any:
    if name == "secret":
        return f"(set, {len(value)} bytes)" if value else "(none)"
    if name == "strategies":
        return format_strategies(value)
    return value


def run(args: argparse.Namespace) -> int:
    flags = {FLAGS[k]: getattr(args, k) for k in FLAGS if getattr(args, k) is not None}
    config = JobConfig.from_env(**flags)
    where = sources(os.environ, flags)
    values = {f.name: _shown(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)}
    if args.json:
        print(json.dumps({n: {"value": v, "source": where[n]} for n, v in values.items()}))
        return 0
    width = max(map(len, values))
    for name, value in values.items():
        print(f"{name:<{width}}  {value!s:<30}  {where[name]}")
    return 0
