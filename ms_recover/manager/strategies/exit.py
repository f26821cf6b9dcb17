"""``exit``: the last resort. Every process of the job leaves with
:data:`~ms_recover.exitcodes.JOB_EXIT`, so that the scheduler can restart the whole job.
"""

from __future__ import annotations

from ms_recover import exitcodes
from ms_recover.config import JobConfig
from ms_recover.manager.actions import Action
from ms_recover.manager.commands import exit_job
from ms_recover.manager.model import JobModel
from ms_recover.manager.strategies.base import Incident, Launch, RecoveryStrategy
from ms_recover.strategy import Strategy


class Exit(RecoveryStrategy):
    name = Strategy.EXIT
    bounded = False

    def never_applies(self, cfg: JobConfig) -> str | None:
        return None

    def feasible(self, m: JobModel, incident: Incident) -> tuple[bool, str]:
        return True, "last resort"

    def launch(self, m: JobModel, incident: Incident, reason: str) -> Launch:
        return Launch()  # no round: see start()

    def start(
        self, m: JobModel, now: float, incident: Incident, why: str, reason: str
    ) -> list[Action]:
        return exit_job(m, exitcodes.JOB_EXIT, f"{why}; {reason}")
