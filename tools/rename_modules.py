"""Rewrite a tree from the old module layout to the grouped one (issue 27, items 5 and 6).

    python tools/rename_modules.py [--check] [ROOT]

The map below is the whole move: every old module (or package) and its one new name. The script
rewrites, in every text file under ROOT (``.py``, ``.md``, ``.sh``, ``.toml``, ``.in``, ``.cfg``,
``.txt``, ``.yaml``, ``.yml``, ``.json``; ``.git``, virtualenvs and caches skipped):

* ``from PKG import NAME [as X]`` where ``PKG.NAME`` moved: into ``from NEWPKG import NEWNAME as
  NAME`` (the local name stays, so the code below the import is untouched); a statement that also
  imports names that did not move is split;
* dotted names (``ms_recover.comm.hostlane``, ``:mod:`~ms_recover.testing.faults```, strings
  given to ``python -m``);
* file paths (``ms_recover/comm/hostlane.py``, ``ms_recover/testing/``,
  ``scheduler_hooks/ms_recover_hook.sh``).

It is idempotent: a tree already on the new names is left as it is, so it can run over a branch
that merged the move and still has old names in its own changes. Afterwards run
``ruff check --fix --select I`` and ``ruff format`` (the import blocks are re-sorted there).
``--move`` first moves the files still lying at an old path (a file a branch added in a moved
folder) to their new path with ``git mv``. ``--check`` only lists what would change and the
files still at an old path, and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import re
import subprocess
import sys

# old dotted name -> new dotted name. A package entry covers the package's own __init__ and
# anything under it that has no entry of its own.
MODULES: dict[str, str] = {
    # the host backend and its lane: a package instead of a file prefix
    "ms_recover.comm.host": "ms_recover.comm.host.backend",
    "ms_recover.comm.hostauth": "ms_recover.comm.host.auth",
    "ms_recover.comm.hostcall": "ms_recover.comm.host.call",
    "ms_recover.comm.hostdoubling": "ms_recover.comm.host.doubling",
    "ms_recover.comm.hostlink": "ms_recover.comm.host.link",
    "ms_recover.comm.hostring": "ms_recover.comm.host.ring",
    "ms_recover.comm.hoststream": "ms_recover.comm.host.stream",
    "ms_recover.comm.hostwire": "ms_recover.comm.host.wire",
    "ms_recover.comm.hostlane": "ms_recover.comm.host.lane.lanes",
    "ms_recover.comm.lanebuffers": "ms_recover.comm.host.lane.buffers",
    "ms_recover.comm.laneexchange": "ms_recover.comm.host.lane.exchange",
    "ms_recover.comm.laneframe": "ms_recover.comm.host.lane.frame",
    "ms_recover.comm.lanesmall": "ms_recover.comm.host.lane.small",
    # one meaning per name: "phases" are a recovery's; this module moves a round on
    "ms_recover.manager.phases": "ms_recover.manager.progress",
    # MindCluster / MindSpore launcher integrations: one home
    "ms_recover.agent.taskd": "ms_recover.integrations.taskd.agent",
    "ms_recover.scheduler.api": "ms_recover.integrations.taskd.manager_api",
    "ms_recover.agent.msrun": "ms_recover.integrations.msrun.hands",
    "ms_recover.agent.children": "ms_recover.integrations.msrun.children",
    "ms_recover.worker.scheduler": "ms_recover.integrations.msrun.sched_process",
    "ms_recover.scheduler.hooks": "ms_recover.integrations.hook.command",
    "ms_recover.scheduler.autostart": "ms_recover.integrations.hook.autostart",
    "ms_recover.hookpath": "ms_recover.integrations.hook.path",
    "ms_recover.scheduler": "ms_recover.integrations",
    "ms_recover.ttp": "ms_recover.integrations.mindio",
    "ms_recover.ttp.controller": "ms_recover.integrations.mindio.controller",
    "ms_recover.ttp.enums": "ms_recover.integrations.mindio.enums",
    "ms_recover.ttp.framework": "ms_recover.integrations.mindio.framework",
    "ms_recover.ttp.handlers": "ms_recover.integrations.mindio.handlers",
    "ms_recover.ttp.processor": "ms_recover.integrations.mindio.processor",
    "ms_recover.shims": "ms_recover.integrations.shims",
    "ms_recover.shimpath": "ms_recover.integrations.shimpath",
    # what the demo, bench and fault hooks run: the local job harness, not "testing"
    "ms_recover.testing": "ms_recover.localrun",
    "ms_recover.testing.localjob": "ms_recover.localrun.job",
    "ms_recover.testing.pods": "ms_recover.localrun.pods",
    "ms_recover.testing.msrunjob": "ms_recover.localrun.msrunjob",
    "ms_recover.testing.wait": "ms_recover.localrun.wait",
    "ms_recover.testing.faults": "ms_recover.localrun.faults",
    "ms_recover.testing.numpy_trainer": "ms_recover.localrun.numpy_trainer",
    "ms_recover.testing.worlds": "ms_recover.localrun.worlds",
    # what only the repository's tests use: out of the package
    "ms_recover.testing.floats": "tests.kit.floats",
    "ms_recover.testing.mindio_kit": "tests.kit.mindio_kit",
    "ms_recover.testing.mindio_train": "tests.kit.mindio_train",
    "ms_recover.mindspore.programs.fit_train": "tests.kit.fit_train",
}

# Files that are not Python modules, and folders named in docs (old -> new path).
PATHS: dict[str, str] = {
    "scheduler_hooks/ms_recover_hook.sh": "ms_recover/integrations/hook/ms_recover_hook.sh",
    "scheduler_hooks/": "ms_recover/integrations/hook/",
}

SUFFIXES = {".py", ".md", ".sh", ".toml", ".in", ".cfg", ".txt", ".yaml", ".yml", ".json", ".pth"}
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".ruff_cache", "build", "dist"}
SKIP_DIRS |= {".pytest_cache", "node_modules"}
# CHANGELOG.md is history (it names the modules as they were then); the test holds old names
SKIP_FILES = {"CHANGELOG.md", "test_rename_modules.py"}
SELF = pathlib.Path(__file__).resolve()


# the old names above that are packages (folders), not modules
PACKAGES = {"ms_recover.scheduler", "ms_recover.shims", "ms_recover.testing", "ms_recover.ttp"}


def _is_package(old: str) -> bool:
    return old in PACKAGES


def _path_map() -> dict[str, str]:
    """File and folder paths of the modules: ``a/b.py`` for a module, ``a/b/`` for a package."""
    paths = dict(PATHS)
    for old, new in MODULES.items():
        o, n = old.replace(".", "/"), new.replace(".", "/")
        if _is_package(old):
            paths[o + "/"] = n + "/"
        else:
            paths[o + ".py"] = n + ".py"
    return paths


def _alternation(names: list[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


def _dotted_pattern() -> re.Pattern[str]:
    """Each old name, not inside a longer name, and not the start of one of the new names
    (``ms_recover.comm.host`` is an old module and the new package: ``...host.ring`` is new)."""
    parts = []
    for old in sorted(MODULES, key=len, reverse=True):
        nexts = {
            new[len(old) + 1 :].split(".")[0]
            for new in MODULES.values()
            if new.startswith(old + ".")
        }
        # `ms_recover.comm.host.ring` and `from ms_recover.comm.host import ring` are new names
        children = "|".join(sorted(nexts))
        new_child = f"(?:\\.|\\s+import\\s+\\(?\\s*)(?:{children})\\b"
        guard = f"(?!{new_child})" if nexts else ""
        parts.append(re.escape(old) + "(?![\\w])" + guard)
    return re.compile("(?<![\\w.])(?:" + "|".join(parts) + ")")


DOTTED = _dotted_pattern()
PATH_MAP = _path_map()
PATHS_RE = re.compile(
    "(?<![\\w.])(" + _alternation(list(PATH_MAP)) + ")",
)
# one moved module named in a one-name ``from`` import (in a string, a doc or a shell line)
FROM_ONE = re.compile(
    r"\bfrom (ms_recover(?:\.\w+)*) import (\w+)(?= as \w|[ \t]*$|[ \t]*[;\"'`)])", re.M
)


def _new_from(parent: str, name: str, local: str | None) -> str | None:
    """``from NEWPARENT import NEWLEAF [as LOCAL]`` for a moved ``parent.name``, else None."""
    new = MODULES.get(f"{parent}.{name}")
    if new is None:
        return None
    new_parent, _, leaf = new.rpartition(".")
    keep = local or name
    alias = f" as {keep}" if keep != leaf else ""
    return f"from {new_parent} import {leaf}{alias}"


def _rewrite_imports(text: str) -> str:
    """Split and rewrite the ``from X import a, b`` statements that import a moved module."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
            continue
        moved, kept = [], []
        for alias in node.names:
            line = _new_from(node.module, alias.name, alias.asname)
            if line is None:
                kept.append(alias)
            else:
                moved.append(line)
        if not moved:
            continue
        indent = " " * node.col_offset
        out = []
        if kept:
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
            out.append(f"{indent}from {node.module} import {names}")
        out += [indent + m for m in moved]
        end = node.end_lineno or node.lineno
        first = lines[node.lineno - 1]
        if not first[: node.col_offset].strip() == "":  # `x; from a import b`: leave to regex
            continue
        tail = lines[end - 1][(node.end_col_offset or 0) :]
        edits.append((node.lineno - 1, end, "\n".join(out) + tail))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = [new if new.endswith("\n") else new + "\n"]
    return "".join(lines)


def _from_one(match: re.Match[str]) -> str:
    new = _new_from(match.group(1), match.group(2), None)
    return match.group(0) if new is None else new


def rewrite(text: str, python: bool) -> str:
    if python:
        text = _rewrite_imports(text)
    text = FROM_ONE.sub(_from_one, text)
    text = DOTTED.sub(lambda m: MODULES[m.group(0)], text)
    return PATHS_RE.sub(lambda m: PATH_MAP[m.group(1)], text)


def files(root: pathlib.Path) -> list[pathlib.Path]:
    found = []
    for path in root.rglob("*"):
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in path.parts):
            continue
        if path.name in SKIP_FILES or path.resolve() == SELF:
            continue
        if path.is_file() and path.suffix in SUFFIXES:
            found.append(path)
    return sorted(found)


def stale_paths(root: pathlib.Path) -> list[str]:
    """Files that still lie at an old module path (added on a branch after the move)."""
    stale = []
    for old in PATH_MAP:
        p = root / old
        if p.is_file() or (p.is_dir() and any(p.rglob("*.py"))):
            stale.append(old)
    return stale


def move(root: pathlib.Path) -> list[tuple[str, str]]:
    """Move the files still at an old path to their new path (``git mv`` inside a git tree).

    A package's files that have no entry of their own move with the package. A file whose new
    path is taken already is left where it is and reported (merge the two by hand)."""
    pairs: list[tuple[str, str]] = []
    for old, new in sorted(PATH_MAP.items(), key=lambda item: -len(item[0])):
        source = root / old
        if source.is_file():
            pairs.append((old, new))
        elif old.endswith("/") and source.is_dir():
            for path in sorted(source.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    rel = path.relative_to(source).as_posix()
                    pairs.append((old + rel, new + rel))
    done = []
    for old, new in pairs:
        source, target = root / old, root / new
        if not source.is_file():
            continue  # moved already as part of a longer entry
        if target.exists():
            print(f"not moved: {old} (its new path {new} exists; merge them by hand)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if (root / ".git").exists():
            subprocess.run(["git", "-C", str(root), "mv", old, new], check=True)
        else:
            source.rename(target)
        done.append((old, new))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=".", help="the tree to rewrite (default: .)")
    parser.add_argument(
        "--check", action="store_true", help="list what would change; write nothing"
    )
    parser.add_argument(
        "--move", action="store_true", help="first move files still at an old path (git mv)"
    )
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root)
    if args.move and not args.check:
        for old, new in move(root):
            print(f"moved {old} -> {new}")
    changed = []
    for path in files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        new = rewrite(text, path.suffix == ".py")
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for path in changed:
        print(f"{'would rewrite' if args.check else 'rewrote'} {path.relative_to(root)}")
    stale = stale_paths(root)
    for old in stale:
        print(f"still at an old path: {old} (git mv it to {PATH_MAP[old]})")
    return 1 if args.check and (changed or stale) else 0


if __name__ == "__main__":
    sys.exit(main())
