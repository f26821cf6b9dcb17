"""Every class of IEEE-754 value, by bit pattern, and a bit-for-bit comparison.

Repair and replica checks promise *bit* identity, which ``==`` cannot test: ``-0.0 == 0.0``,
``nan != nan``, and two NaNs with different payloads look alike. These helpers build arrays
that hold each kind of value a state can contain (signed zeros, the smallest and largest
subnormals, the normal extremes, infinities, quiet and signalling NaNs with payloads, a
negative NaN) and compare arrays through their unsigned-integer views.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

# (float dtype, its same-width unsigned dtype, exponent-field mask, sign bit)
_LAYOUT: dict[str, tuple[type[np.unsignedinteger[Any]], int, int, int]] = {
    "float16": (np.uint16, 10, 0x7C00, 0x8000),
    "float32": (np.uint32, 23, 0x7F800000, 0x80000000),
    "float64": (np.uint64, 52, 0x7FF0000000000000, 0x8000000000000000),
}


def special_bits(dtype: Any) -> NDArray[Any]:
    """The bit patterns (as the same-width unsigned dtype) of every special value of ``dtype``.

    In order: +0, -0, the smallest subnormal and its negative, a mid subnormal, the largest
    subnormal, the smallest normal, 1, the largest finite and its negative, +inf, -inf, the
    canonical quiet NaN, a quiet NaN with payload 1, a signalling NaN with payload 1, a
    negative quiet NaN with a payload.
    """
    name = np.dtype(dtype).name
    if name not in _LAYOUT:
        raise ValueError(f"dtype {name} is not one of: {', '.join(_LAYOUT)}")
    uint, mant, exp, sign = _LAYOUT[name]
    quiet = exp | (1 << (mant - 1))
    one = np.array(1, dtype=name).view(uint).item()
    patterns = [
        0,
        sign,
        1,
        sign | 1,
        1 << (mant // 2),
        (1 << mant) - 1,
        1 << mant,
        one,
        exp - 1,
        sign | (exp - 1),
        exp,
        sign | exp,
        quiet,
        quiet | 1,
        exp | 1,
        sign | quiet | 5,
    ]
    return np.array(patterns, dtype=uint)


def special_values(dtype: Any) -> NDArray[Any]:
    """:func:`special_bits` viewed as ``dtype`` (the values themselves)."""
    return special_bits(dtype).view(np.dtype(dtype))


def finite_specials(dtype: Any) -> NDArray[Any]:
    """The finite special values of ``dtype`` (zeros, subnormals, extremes): safe to compute on."""
    values = special_values(dtype)
    finite: NDArray[Any] = values[np.isfinite(values)]
    return finite


def bits(array: NDArray[Any]) -> bytes:
    """The array's dtype, shape and raw bytes (C order): equal iff the arrays are bit-identical."""
    a = np.ascontiguousarray(array)
    return f"{a.dtype.str}{a.shape}".encode() + a.tobytes()


def bit_diff(a: dict[str, NDArray[Any]], b: dict[str, NDArray[Any]]) -> list[str]:
    """Names whose entries are not bit-identical (or present in only one of the dicts)."""
    names = sorted(set(a) | set(b))
    return [n for n in names if n not in a or n not in b or bits(a[n]) != bits(b[n])]
