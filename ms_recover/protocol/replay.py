"""Replay protection: a frame is accepted once, in order, per (sender, incarnation nonce).

Every process draws a random nonce at start (:func:`~ms_recover.protocol.codec.new_nonce`) and
signs it into each frame with a ``seq`` that starts at 0 and only grows. A receiver keeps the
highest ``seq`` seen per (sender, nonce) and drops a frame whose ``seq`` is not above it: a
captured frame sent again, or an old frame re-ordered behind a newer one. A restarted process
has a new nonce, so it legitimately starts again at 0.

The state belongs to one receiving process (one manager incarnation): a restarted manager knows
no seqs yet and accepts each member's next frame, which is what re-registration needs. Whether a
*new* incarnation may take over a member's slot is the manager's decision (see
``ManagerServer._on_agent_hello``); this class only says whether a frame is new.

Memory is bounded: at most ``max_nonces_per_sender`` nonces per sender and ``max_senders``
senders are kept, least recently used first out. Forgetting a nonce can only re-admit frames of
an incarnation that is no longer a member, and the slot rule above refuses those.
"""

from __future__ import annotations

from collections import OrderedDict


class ReplayGuard:
    """Highest seq per (sender, nonce); pure, no I/O, no clock."""

    def __init__(self, max_senders: int = 200_000, max_nonces_per_sender: int = 4) -> None:
        self._seen: OrderedDict[str, OrderedDict[int, int]] = OrderedDict()
        self.max_senders = max_senders
        self.max_nonces = max_nonces_per_sender
        self.replays = 0

    def check(self, sender: str, nonce: int, seq: int) -> str:
        """Record the frame and return "" if it is new, else why it is dropped (not recorded)."""
        nonces = self._seen.get(sender)
        if nonces is None:
            nonces = self._seen[sender] = OrderedDict()
            if len(self._seen) > self.max_senders:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(sender)
            last = nonces.get(nonce)
            if last is not None:  # a known incarnation: the common case, one comparison
                if seq <= last:
                    self.replays += 1
                    return f"replayed or reordered frame: seq {seq} <= {last} for this incarnation"
                nonces[nonce] = seq
                if len(nonces) > 1:  # keep the least recently used nonce first out
                    nonces.move_to_end(nonce)
                return ""
        nonces[nonce] = seq
        if len(nonces) > self.max_nonces:
            nonces.popitem(last=False)
        return ""

    def known(self, sender: str, nonce: int) -> bool:
        """Whether frames of this incarnation were seen (and are still remembered)."""
        return nonce in self._seen.get(sender, {})
