"""Packing a rank's state for repair, with a checksum per tensor, and verifying it on arrival.

The manifest travels as one more named array (``__manifest__``: UTF-8 JSON bytes) next to the
state, so the data plane needs no special message for it.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ms_recover.errors import RepairError

MANIFEST = "__manifest__"


def checksum(array: NDArray[Any]) -> int:
    """CRC-32 of the array's bytes (C order)."""
    return zlib.crc32(np.ascontiguousarray(array).data)


def digest(arrays: dict[str, NDArray[Any]]) -> str:
    """One CRC-32 over every tensor, in name order: equal digests mean equal state."""
    crc = 0
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        head = f"{len(name)}:{name}:{array.dtype.str}:{array.shape}".encode()
        crc = zlib.crc32(array.data, zlib.crc32(head, crc))
    return f"{crc:08x}"


def sha256_of(arrays: dict[str, NDArray[Any]]) -> str:
    """SHA-256 over every tensor's name and bytes, in name order (for comparing final weights)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def pack(arrays: dict[str, NDArray[Any]], step: int) -> dict[str, NDArray[Any]]:
    """The state plus its manifest (step, and every tensor's checksum, shape and dtype)."""
    if MANIFEST in arrays:
        raise RepairError(f"state name {MANIFEST!r} is reserved")
    manifest = {
        "step": step,
        "tensors": {n: [checksum(a), list(a.shape), a.dtype.str] for n, a in arrays.items()},
    }
    raw = np.frombuffer(json.dumps(manifest, sort_keys=True).encode(), dtype=np.uint8)
    return {**arrays, MANIFEST: raw}


def unpack(received: dict[str, NDArray[Any]], src: int) -> tuple[dict[str, NDArray[Any]], int]:
    """Verify every tensor against the manifest; returns (state, step) or raises RepairError."""
    if MANIFEST not in received:
        raise RepairError(f"state from rank {src} has no manifest")
    try:
        manifest = json.loads(received[MANIFEST].tobytes().decode())
        step = int(manifest["step"])
        tensors = {
            str(n): (int(crc), [int(d) for d in shape], str(dtype))
            for n, (crc, shape, dtype) in dict(manifest["tensors"]).items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RepairError(f"state from rank {src} has a malformed manifest") from exc
    arrays = {n: a for n, a in received.items() if n != MANIFEST}
    if set(arrays) != set(tensors):
        missing = sorted(set(tensors) - set(arrays))
        extra = sorted(set(arrays) - set(tensors))
        raise RepairError(f"state from rank {src}: missing {missing}, unexpected {extra}")
    for name, (crc, shape, dtype) in tensors.items():
        got = arrays[name]
        if list(got.shape) != shape or got.dtype.str != dtype:
            raise RepairError(
                f"tensor {name!r} from rank {src}: got {got.shape}/{got.dtype}, "
                f"manifest says {tuple(shape)}/{dtype}"
            )
        if checksum(got) != crc:
            raise RepairError(f"checksum mismatch on tensor {name!r} from rank {src}")
    return arrays, step
