"""Who may take a member's slot: the incarnation rule of docs/design.md §5 (issue 9 #7).

Every process signs a random incarnation nonce into its frames. A hello from the nonce that
holds a slot is the same process registering again (after a reconnect, or with a restarted
manager) and is always accepted. A hello from another nonce is a *new incarnation*, and it may
take the slot only on evidence that the old one is gone:

* the old member is no longer alive: its agent reported its exit, it was declared lost after
  falling silent, or it was told to exit (the model marks each; the slot is then free);
* for an agent still counted alive: it has been silent for :data:`TAKEOVER_BEATS` of its
  heartbeat intervals (``JobConfig.agent_heartbeat_s``) while the claim waits (a pod
  recreated before its loss was noticed: its old agent died with it). The claim is refused
  as soon as the old agent is heard again, which is what a replayed or forged hello of a live
  agent meets. The hellos of the claimed node's ranks wait with the claim and are handled
  after the decide that follows its acceptance;
* a rank's hello while a fault naming it or its node waits for the manager's decision (a
  recreated pod's ranks start before the manager decided on its restart) is handled after
  that decide too (:meth:`Slots.defer`): the round it starts counts the rank among those to
  replace, and would otherwise drop a registration made just before it;
* for a rank still counted alive: never (its agent or its silence will report it gone first).

This class holds only the bookkeeping; :class:`~ms_recover.manager.server.ManagerServer`
applies it. No I/O, no clock of its own.
"""

from __future__ import annotations

import enum

from ms_recover.protocol.codec import Envelope

#: Heartbeat intervals a registered agent must have been silent before a new incarnation may
#: take its slot.
TAKEOVER_BEATS = 2

Pending = tuple[bytes, Envelope]  # (ZeroMQ identity, the hello) of a waiting registration


class Hello(str, enum.Enum):
    """What to do with an agent hello."""

    REGISTER = "register"  # a free slot, or the same incarnation again
    TAKEOVER = "takeover"  # a new incarnation, and the old one is gone: a node restarted
    HOLD = "hold"  # a new incarnation, and the old one may still be alive: wait


class Slots:
    """Incarnation nonces per slot, and agent claims waiting for evidence."""

    def __init__(self, heartbeat_s: float, ranks_per_node: int) -> None:
        self.takeover_s = TAKEOVER_BEATS * heartbeat_s
        self.ranks_per_node = ranks_per_node
        self.agent_nonce: dict[int, int] = {}
        self.rank_nonce: dict[int, int] = {}
        self.claims: dict[int, Pending] = {}  # node -> the hello of a new agent incarnation
        self.held: dict[int, list[Pending]] = {}  # node -> its ranks' hellos, with the claim
        self.released: list[Pending] = []  # hellos to handle after the next decide

    def agent_hello(self, node: int, pending: Pending, alive: bool, silent_s: float) -> Hello:
        """The verdict on an agent hello for ``node``, whose agent is ``alive`` and was last
        heard ``silent_s`` ago. A HOLD records the claim (the claimant's heartbeats ask again)."""
        if not alive or self.agent_nonce.get(node) == pending[1].nonce:
            return Hello.REGISTER
        if silent_s >= self.takeover_s:
            return Hello.TAKEOVER
        self.claims[node] = pending
        return Hello.HOLD

    def agent_registered(self, node: int, nonce: int) -> None:
        """``node``'s slot now belongs to incarnation ``nonce``; its ranks' held hellos follow."""
        self.agent_nonce[node] = nonce
        self.claims.pop(node, None)
        self.released.extend(self.held.pop(node, []))

    def claimant(self, node: int, ident: bytes) -> Pending | None:
        """The waiting hello if ``ident`` is the claimant of ``node``'s slot."""
        claim = self.claims.get(node)
        return claim if claim is not None and claim[0] == ident else None

    def refuse(self, node: int) -> list[bytes]:
        """The registered agent of ``node`` spoke: drop its claim; the identities to refuse
        (the claimant first, then its ranks). Empty if there was no claim."""
        claim = self.claims.pop(node, None)
        if claim is None:
            return []
        return [claim[0], *(ident for ident, _ in self.held.pop(node, []))]

    def hold_worker(self, node: int, pending: Pending) -> bool:
        """Keep a rank's hello while its node's slot is claimed (at most a node's ranks)."""
        if node not in self.claims or len(self.held.get(node, ())) >= self.ranks_per_node:
            return False
        self.held.setdefault(node, []).append(pending)
        return True

    def rank_taken(self, rank: int, alive: bool, pid: int, hello_pid: int, nonce: int) -> bool:
        """Whether rank ``rank``'s slot belongs to another live process than the hello's."""
        return alive and (pid != hello_pid or self.rank_nonce.get(rank) != nonce)

    def defer(self, pending: Pending) -> None:
        """Handle a rank's hello after the next decide, with the released ones."""
        self.released.append(pending)

    def take_released(self) -> list[Pending]:
        released, self.released = self.released, []
        return released
