"""The per-rank result file of the demo, test and benchmark training programs.

``OUT/rank_R.json`` holds the SHA-256 of the rank's whole state (so runs can be compared bit for
bit), its committed step, recoveries, incarnation, the steps it got by repair instead of running
(``skipped``) and its per-step losses, plus any program-specific fields.
"""

from __future__ import annotations

import json
import os
from typing import Any

from numpy.typing import NDArray

from ms_recover.worker.repair import sha256_of
from ms_recover.worker.session import Session


def write_rank_record(
    out: str,
    session: Session,
    state: dict[str, NDArray[Any]],
    losses: dict[int, float],
    **extra: Any,
) -> None:
    """Write ``out/rank_<rank>.json`` for this rank (call before ``session.finish()``)."""
    os.makedirs(out, exist_ok=True)
    record = {
        "rank": session.rank,
        "sha256": sha256_of(state),
        "committed": session.committed,
        "recoveries": session.recoveries,
        "incarnation": session.incarnation,
        "skipped": session.skipped,
        "worlds": session.worlds,
        "losses": {str(k): v for k, v in sorted(losses.items())},
        **extra,
    }
    with open(os.path.join(out, f"rank_{session.rank}.json"), "w") as fh:
        json.dump(record, fh)
