"""Named arrays as one byte stream: the point-to-point format of the host backend.

A transfer is a manifest (msgpack ``[[name, dtype, shape], ...]``) followed by the arrays'
bytes, concatenated in manifest order and cut into chunks of ``chunk_bytes``. A chunk that lies
inside one array is sent zero-copy from it; small arrays are coalesced into shared chunks, so a
model with thousands of small tensors does not cost thousands of messages. The receiver
allocates every array from the manifest and scatters each chunk into place.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from ms_recover.errors import CommError


def _plain(dtype: np.dtype[Any]) -> bool:
    """True for dtypes that survive ``np.dtype(dtype.str)`` (no objects, no record fields)."""
    return not dtype.hasobject and dtype.fields is None and dtype.subdtype is None


def flatten(arrays: dict[str, NDArray[Any]]) -> tuple[bytes, list[NDArray[Any]]]:
    """The manifest and each array as a flat ``uint8`` view (a copy only if not C-contiguous)."""
    entries: list[list[Any]] = []
    views: list[NDArray[Any]] = []
    for name, value in arrays.items():
        array = np.asarray(value)
        if not isinstance(name, str) or not _plain(array.dtype):
            raise CommError(
                f"cannot send {name!r} of dtype {array.dtype}: names must be str "
                "and dtypes plain numbers, bools or strings (no objects/records)"
            )
        entries.append([name, array.dtype.str, list(array.shape)])
        views.append(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return msgpack.packb(entries, use_bin_type=True), views


def chunks(views: list[NDArray[Any]], chunk_bytes: int) -> Iterator[tuple[int, NDArray[Any], bool]]:
    """Yield ``(stream offset, payload, borrowed)`` covering every view, in order.

    ``borrowed`` payloads are slices of the caller's memory (send zero-copy and wait until they
    are sent before returning); the others are fresh copies this module owns.
    """
    offset = 0
    pending: list[NDArray[Any]] = []
    size = 0
    for view in views:
        pos = 0
        while pos < view.size:
            take = min(chunk_bytes - size, view.size - pos)
            if size == 0 and take == chunk_bytes:
                yield offset, view[pos : pos + take], True
                offset += take
            else:
                pending.append(view[pos : pos + take])
                size += take
                if size == chunk_bytes:
                    yield offset, np.concatenate(pending), False
                    offset, pending, size = offset + size, [], 0
            pos += take
    if pending:
        yield offset, np.concatenate(pending), False


def allocate(manifest: bytes | memoryview) -> tuple[dict[str, NDArray[Any]], Scatter]:
    """Empty arrays described by ``manifest`` and a Scatter that fills them."""
    try:
        entries = msgpack.unpackb(manifest, raw=False, use_list=True)
        arrays: dict[str, NDArray[Any]] = {}
        for name, dtype, shape in entries:
            if not isinstance(name, str) or name in arrays or not isinstance(dtype, str):
                raise ValueError(f"bad or repeated entry name {name!r:.60}")
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"bad shape {shape!r:.60} for {name!r:.60}")
            parsed = np.dtype(dtype)
            if not _plain(parsed):
                raise ValueError(f"dtype {dtype!r} of {name!r:.60} is not plain")
            arrays[name] = np.empty(tuple(shape), dtype=parsed)
    except CommError:
        raise
    except Exception as exc:  # garbage manifests raise many unrelated types
        raise CommError(f"malformed transfer manifest: {exc}") from exc
    views = [a.reshape(-1).view(np.uint8) for a in arrays.values()]
    return arrays, Scatter(views)


class Scatter:
    """Writes consecutive stream bytes into the receiver's arrays."""

    def __init__(self, views: list[NDArray[Any]]) -> None:
        self._views = views
        self._index = 0
        self._pos = 0
        self.received = 0
        self.total = sum(view.size for view in views)

    def write(self, data: memoryview) -> None:
        """Append ``data`` to the stream; raises CommError if it overruns the manifest."""
        src = np.frombuffer(data, dtype=np.uint8)
        if src.size == 0 or self.received + src.size > self.total:
            raise CommError(
                f"chunk of {src.size} bytes at offset {self.received} does not fit "
                f"a transfer of {self.total} bytes"
            )
        done = 0
        while done < src.size:
            view = self._views[self._index]
            take = min(view.size - self._pos, src.size - done)
            view[self._pos : self._pos + take] = src[done : done + take]
            self._pos += take
            done += take
            if self._pos == view.size:
                self._index += 1
                self._pos = 0
        self.received += src.size
