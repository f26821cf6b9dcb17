"""A bounded, strict YAML reader for manifests.

What it guarantees, whatever the input:

- memory is bounded: a file larger than :data:`MAX_BYTES` is refused before it is parsed, a
  document whose aliases would expand to more than :data:`MAX_NODES` nodes (a "billion
  laughs" bomb) or that nests deeper than :data:`MAX_DEPTH` levels is refused before it is
  constructed, and recursive aliases are refused;
- only regular files are read (a FIFO, ``/dev/zero`` or a directory is refused, never read);
- every failure, including an explicit tag with a bad value (``!!float abc``), is a
  :class:`ReadError` with a one-line message; nothing else escapes;
- duplicate mapping keys are errors, as in Kubernetes' YAML decoder; only the safe tags exist.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Iterator
from typing import Any

import yaml

from ms_recover.errors import MsRecoverError
from ms_recover.inputs import open_regular

#: etcd stores at most 1.5 MiB per object; an AscendJob is a few KiB. 1 MiB of YAML composes
#: into ~160 MB of nodes at worst, so this is also the reader's memory bound.
MAX_BYTES = 1 << 20
#: Nodes per document after alias expansion; an AscendJob has a few hundred.
MAX_NODES = 100_000
#: Nesting levels per document; Kubernetes objects nest about 15 deep.
MAX_DEPTH = 64


class ReadError(MsRecoverError):
    """The input cannot be read or parsed; ``str()`` is a one-line reason."""


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A safe loader that rejects duplicate mapping keys, as Kubernetes' YAML decoder does."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_text(name: str) -> str:
    """The UTF-8 text of file ``name`` (``-``: stdin), at most :data:`MAX_BYTES` bytes."""
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_BYTES + 1)
        else:
            data = _read_regular(name)
    except OSError as exc:
        raise ReadError(_os_reason(exc)) from exc
    if len(data) > MAX_BYTES:
        raise ReadError(f"is larger than {MAX_BYTES >> 20} MiB; a manifest is a few KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReadError(f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _read_regular(name: str) -> bytes:
    with open_regular(name) as fh:
        return fh.read(MAX_BYTES + 1)


def _os_reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, not a YAML file"
    if exc.errno == errno.EINVAL and exc.strerror and exc.strerror.startswith("is not"):
        return exc.strerror
    return f"cannot be read: {exc.strerror or exc}"


def documents(text: str) -> Iterator[tuple[int, Any]]:
    """(1-based number, value) of each non-empty document; raise ReadError at the first bad one.

    Documents before the bad one are still yielded, so a caller can report them.
    """
    loader = _StrictLoader(text)
    index = 0
    try:
        while loader.check_node():
            index += 1
            node = loader.get_node()
            _check_size(node)
            value = _construct(loader, node, index)
            if value is not None:
                yield index, value
    except yaml.YAMLError as exc:
        raise ReadError(f"is not valid YAML: {_yaml_error(exc)}") from exc
    finally:
        loader.dispose()


# The safe constructors raise these, not a YAMLError, for an explicit tag with a bad value
# (!!float abc, !!timestamp abc, !!int abc).
_CONSTRUCT_ERRORS = (ValueError, TypeError, AttributeError, OverflowError, RecursionError)


def _construct(loader: Any, root: yaml.Node, index: int) -> Any:
    try:
        return loader.construct_document(root)
    except _CONSTRUCT_ERRORS as exc:
        for node in _scalars(root):
            # A failed construction leaves the constructor's bookkeeping half-done.
            loader.constructed_objects, loader.recursive_objects = {}, {}
            loader.state_generators = []
            try:
                loader.construct_object(node, deep=True)
            except _CONSTRUCT_ERRORS:
                tag = node.tag.replace("tag:yaml.org,2002:", "!!")
                raise ReadError(
                    f"is not valid YAML: {_where(node)}: {node.value!r} is not a valid {tag} value"
                ) from exc
        raise ReadError(f"is not valid YAML: document {index}: {exc}") from exc


def _scalars(root: yaml.Node) -> Iterator[yaml.ScalarNode]:
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            yield node
        stack.extend(reversed(_children(node)))


def _check_size(root: yaml.Node) -> None:
    """Refuse a document whose expansion is too large, too deep or recursive.

    Iterative depth-first, each node expanded once (memoised by identity): the check is linear
    in the composed graph, which MAX_BYTES bounds, and cannot itself recurse too deep.
    """
    size: dict[int, int] = {}  # id(node) -> nodes after expansion
    height: dict[int, int] = {}  # id(node) -> nesting levels below and including it
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finishing = stack.pop()
        key, kids = id(node), _children(node)
        if finishing:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            height[key] = 1 + max((height[id(k)] for k in kids), default=0)
            if size[key] > MAX_NODES:
                raise ReadError(
                    f"is refused: a document expands to more than {MAX_NODES} nodes "
                    f"(aliases of aliases: a 'billion laughs' bomb?) at {_where(node)}"
                )
            if height[key] > MAX_DEPTH:
                raise ReadError(f"is refused: nests deeper than {MAX_DEPTH} levels")
            continue
        if key in size:
            continue
        on_path.add(key)
        stack.append((node, True))
        for kid in kids:
            if id(kid) in on_path:
                raise ReadError(f"is refused: a recursive alias at {_where(kid)}")
            if id(kid) not in size:
                stack.append((kid, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _where(node: yaml.Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return (where + (f"{problem} ({context})" if context else str(problem))).replace("\n", " ")
