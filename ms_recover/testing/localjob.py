"""LocalJob: a whole job on one machine: the manager (in a thread) plus one pod per node.

Used by the tests and by ``ms-recover demo``. Everything binds 127.0.0.1 on ephemeral ports,
and :meth:`LocalJob.close` kills every process it started, by PID (process group), and joins
the manager thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ms_recover import env as E
from ms_recover.config import JobConfig
from ms_recover.manager.server import ManagerServer
from ms_recover.observability.events import Event, EventLog
from ms_recover.testing.pods import LocalPods


class LocalJob:
    def __init__(
        self,
        config: JobConfig,
        command: list[str],
        env: dict[str, str] | None = None,
        log_dir: str = "",
        reschedule_delay_s: float = 0.0,
        on_event: Callable[[Event], None] | None = None,
        spares: int = 0,
    ) -> None:
        self.events = EventLog(config.events_path)
        if on_event is not None:
            self.events.subscribe(on_event)
        self.server = ManagerServer(
            config.replace(manager_port=0), events=self.events, bind="127.0.0.1"
        )
        self.config = config.replace(
            manager_port=self.server.port, manager_host="127.0.0.1", pod_ip="127.0.0.1"
        )
        if config.secret:  # the members learn it as from a Kubernetes Secret
            env = {**(env or {}), E.SECRET: config.secret.decode()}
        self.member_env = env
        self.pods = LocalPods(self.config, command, env, log_dir, reschedule_delay_s, spares=spares)
        self._thread: threading.Thread | None = None
        self.exit_code: int | None = None

    def start(self) -> LocalJob:
        self._thread = threading.Thread(target=self._serve, name="local-manager", daemon=True)
        self._thread.start()
        self.pods.start()
        return self

    def _serve(self) -> None:
        self.exit_code = self.server.serve(end_grace_s=0.5)

    def wait(self, timeout_s: float) -> bool:
        """Supervise the pods until the job ended; False on timeout."""
        ok = self.pods.wait(timeout_s)
        if ok and self._thread is not None:
            self._thread.join(timeout=5)
        return ok

    def find(self, event: str, **match: Any) -> list[Event]:
        return [
            e for e in self.events.recent(event) if all(e.get(k) == v for k, v in match.items())
        ]

    def status(self) -> dict[str, Any]:
        return self.server.status()

    def close(self) -> None:
        self.pods.close()
        self.server.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> LocalJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
