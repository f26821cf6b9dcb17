"""The state provider interface: a rank's named training state as numpy arrays.

Repair copies a replica's whole state to a rank that is missing it or is behind. A provider
exposes parameters, optimizer moments, step counters, RNG state, etc. under stable names.

A provider may also define ``digest() -> str``: the same string as
``repair.digest(provider.state_dict())``, computed more cheaply (without the copies).
:func:`state_digest` uses it when it is there; the replica check digests the whole state every
``digest_every_steps`` commits and at every stop.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from numpy.typing import NDArray

from ms_recover.worker import repair


@runtime_checkable
class StateProvider(Protocol):
    """What the worker needs to copy a rank's state to a peer and back."""

    def state_dict(self) -> dict[str, NDArray[Any]]:
        """Every piece of named state, as contiguous numpy arrays (copies are fine)."""

    def load_state_dict(self, arrays: dict[str, NDArray[Any]]) -> None:
        """Load state in place. Raises RepairError naming the first missing/extra/mismatched
        entry (name, shape, dtype); on error nothing is half-loaded where avoidable."""


def state_digest(provider: StateProvider) -> str:
    """``repair.digest(provider.state_dict())``, by the provider's own ``digest()`` if it has
    one."""
    own = getattr(provider, "digest", None)
    if callable(own):
        return str(own())
    return repair.digest(provider.state_dict())
