"""Checks of user input: job ids, hosts, ranges, environment text, input files, CLI values.

Pure (no zmq, no MindSpore). Every check raises :class:`ConfigError` with a one-line message
that names the value and the valid form; the ``*_arg`` helpers are ``argparse`` types and raise
``argparse.ArgumentTypeError`` instead, which argparse turns into a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from typing import Any, BinaryIO

from ms_recover.errors import ConfigError, MsRecoverError
from ms_recover.protocol.bounds import depth_ok

#: Kubernetes object names (RFC 1123 subdomains) and UIDs share this form; MINDX_TASK_ID is one.
JOB_ID_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
JOB_ID_MAX = 253
JOB_ID_FORM = (
    f"1..{JOB_ID_MAX} characters of lowercase letters, digits, '-' and '.', starting and "
    "ending with a letter or digit (a Kubernetes name or UID)"
)
_HOST_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")

#: Sizes a real job can have, with headroom (issue: at least 8,192 nodes and 65,536 ranks);
#: beyond them the manager would only allocate until it runs out of memory.
MAX_NODES = 16_384
MAX_PROCS_PER_NODE = 128
MAX_WORLD = 131_072
#: The agent and the manager poll every 20 ms; a heartbeat must be well above that, or every
#: member looks lost at start.
MIN_HEARTBEAT_S = 0.05
#: Every timeout fits in a 32-bit millisecond count (ZeroMQ's poll takes an int).
MAX_SECONDS = 7 * 24 * 3600.0
MAX_LIVENESS = 100
MAX_TRIES = 1_000_000  # a count, not an allocation; benches use 'never give up'
MAX_FRAME_BYTES = (1 << 10, 1 << 30)


def check_job_id(value: object) -> str:
    """``value`` if it is a valid job id; it is used in paths, so no '/', no '..', no spaces."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"job id {value!r} is not valid; valid: {JOB_ID_FORM}")
    if len(value) > JOB_ID_MAX or not JOB_ID_RE.match(value):
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise ConfigError(f"job id {shown!r} is not valid; valid: {JOB_ID_FORM}")
    return value


def check_host(name: str, value: object) -> str:
    """``value`` if it is an IP address, a DNS name, an interface name or ``*``.

    Only the form is checked (no DNS lookup: a Kubernetes service may resolve only later).
    """
    valid = "an IPv4/IPv6 address, a DNS name, an interface name or *"
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} {value!r} is not a host; valid: {valid}")
    if value == "*" or _is_ip(value.removeprefix("[").removesuffix("]")):
        return value
    labels = value.removesuffix(".").split(".")
    if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise ConfigError(f"{name} {value!r} is not a host; valid: {valid}")
    return value


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_int_range(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in {low}..{high}, got {value!r}")
    return value


def check_seconds(name: str, value: object, low: float = 0.0, high: float = MAX_SECONDS) -> float:
    """``value`` if it is a finite number of seconds with ``low < value <= high``."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or not math.isfinite(number) or not low < number <= high:
        raise ConfigError(
            f"{name} must be a number of seconds above {low:g} and at most {high:g}, got {value!r}"
        )
    return float(number)


def check_env_text(environ: Mapping[str, str], keys: Iterable[str]) -> None:
    """Raise if any of ``keys`` holds bytes that are not UTF-8 (Python keeps them as
    surrogates, which fail later, far from the cause)."""
    for key in keys:
        value = environ.get(key)
        if value is None:
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raw = value.encode("utf-8", "surrogateescape")
            raise ConfigError(f"environment variable {key} is not valid UTF-8: {raw!r}") from None


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file, else OSError.

    A FIFO is not waited on and a device (``/dev/zero``) is never read: reading either could
    block or never end.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if not stat.S_ISREG(mode):
            reason = "is not a regular file (a device, FIFO or socket is never read)"
            raise OSError(errno.EINVAL, reason, path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def os_reason(exc: OSError) -> str:
    """The one-line reason of a failed open or read (``no such file``, ``is a directory``...)."""
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    return str(exc.strerror or exc)


def read_bounded(
    path: str, limit: int, what: str, error: type[MsRecoverError] = ConfigError
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; else ``error``
    naming ``what``, the path and the problem in one line (a FIFO, a device or a directory is
    refused at once, never read or waited on; a larger file is refused before it is read)."""
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(limit + 1) if size <= limit else b""
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {os_reason(exc)}") from exc
    if size > limit or len(data) > limit:
        raise error(f"{what} {path} is {max(size, len(data))} bytes; at most {limit} are read")
    return data


def load_json(
    path: str, limit: int, depth: int, what: str, error: type[MsRecoverError] = ConfigError
) -> Any:
    """The JSON value of the regular file ``path`` (:func:`read_bounded`), nested at most
    ``depth`` levels; else ``error`` naming ``what``, the path and the problem in one line
    (never ``RecursionError`` or ``MemoryError``: the size bounds the parse)."""
    data = read_bounded(path, limit, what, error)
    try:
        value = json.loads(data)
    except RecursionError as exc:
        raise error(f"{what} {path} is malformed: nests deeper than {depth} levels") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 4300-digit int
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise error(f"{what} {path} is malformed: not JSON ({reason})".replace("\n", " ")) from exc
    if not depth_ok(value, depth):
        raise error(f"{what} {path} is malformed: nests deeper than {depth} levels")
    return value


def check_output_file(flag: str, path: str) -> None:
    """``path`` can be written as a file: its directory exists and it is not a directory.

    Checked before a long run, so that the run's result is not lost at its end."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ConfigError(f"{flag} {path!r} must be a file path in an existing, writable directory")


def check_output_dir(flag: str, path: str) -> None:
    """``path`` is, or can be created as, a directory."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {path!r} cannot be created: {exc.strerror or exc}; give a directory"
        ) from exc


# -- argparse types -----------------------------------------------------------------------


def seconds_arg(high: float = MAX_SECONDS) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in (0, high]."""

    def parse(text: str) -> float:
        try:
            return check_seconds("value", float(text), high=high)
        except (ValueError, ConfigError):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds above 0 and at most {high:g}"
            ) from None

    return parse


def int_arg(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in low..high."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer in {low}..{high}")
        return value

    return parse
