"""The ``ms-recover`` command line.

Each subcommand lives in its own module exposing ``configure(parser)`` and ``run(args) -> int``.
Bad flags or environment values exit 2 with a one-line reason, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import NoReturn

from ms_recover import __version__
from ms_recover.errors import MsRecoverError
from ms_recover.observability import logfmt

# (name, module, one-line help). Modules are imported lazily and must stay light at import.
COMMANDS: list[tuple[str, str, str]] = [
    ("manager", "ms_recover.manager.main", "run the job's recovery manager in the foreground"),
    ("agent", "ms_recover.agent.main", "launch and watch this node's rank processes"),
    (
        "demo",
        "ms_recover.demo",
        "run a local MindSpore job, kill a rank, recover, show the timeline",
    ),
    ("status", "ms_recover.observability.status", "ask a running manager for the job's state"),
    ("check-job", "ms_recover.jobcheck.check", "validate AscendJob YAML files before submission"),
    (
        "report",
        "ms_recover.observability.report",
        "print a recovery timeline from a manager event log",
    ),
    ("bench", "ms_recover.bench.main", "measure recovery, detection, overhead and bandwidth"),
    (
        "hook",
        "ms_recover.integrations.hook.command",
        "start, stop or check the manager on the scheduler pod",
    ),
    (
        "shim-path",
        "ms_recover.integrations.shimpath",
        "print the directory of the opt-in taskd/mindio_ttp shims",
    ),
    (
        "hook-path",
        "ms_recover.integrations.hook.path",
        "print the path of the scheduler hook script",
    ),
    ("config", "ms_recover.configshow", "print the effective configuration and its sources"),
]


class _Parser(argparse.ArgumentParser):
    """A usage error is one line naming the command and its --help, and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, just that subcommand's module is imported and
    configured (the others are listed by name and help), so one command starts fast."""
    parser = _Parser(
        prog="ms-recover",
        description="Process-level fault recovery for MindSpore training jobs.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"ms-recover {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    for name, module_name, help_text in COMMANDS:
        if only is not None and name != only:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_name)
        child = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.configure(child)
        child.set_defaults(_run=module.run)
    return parser


def _chosen(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), if it is one."""
    words = [a for a in argv if not a.startswith("-")]
    names = {name for name, _, _ in COMMANDS}
    return words[0] if words and words[0] in names else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_chosen(argv)).parse_args(argv)
    try:
        log_format = logfmt.format_from_env(os.environ)
    except MsRecoverError as exc:
        print(f"ms-recover {args.subcommand}: error: {exc}", file=sys.stderr)
        return 2
    logfmt.setup(logging.DEBUG if args.verbose else logging.INFO, log_format)
    try:
        return int(args._run(args))
    except MsRecoverError as exc:
        print(f"ms-recover {args.subcommand}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
