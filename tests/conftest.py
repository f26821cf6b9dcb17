"""Suite-wide fixtures: the fault matrix's tally (issue 9).

A test that takes the ``scenario`` fixture is one fault-matrix scenario: it survived if it
passed, and it reports the committed steps its recoveries lost (``scenario.lost_steps``). The
terminal summary ends with ``N scenarios, S survived, L lost steps``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Generator, Iterator

import pytest

from ms_recover import env as E

# ms-recover agent's standby (on by default) imports MindSpore in one more process per node
# once the ranks train: seconds of CPU and 400 MB per agent of every short test job on this
# 2-core host. The suite turns it off; the tests of the standby turn it on explicitly
# (tests/integration/test_standby.py, tests/e2e/test_demo_job.py).
os.environ.setdefault(E.STANDBY, "off")


@dataclasses.dataclass
class Scenario:
    name: str
    lost_steps: int | None = None  # None: the test failed before it could count them
    survived: bool = False


_SCENARIOS: dict[str, Scenario] = {}


@pytest.fixture
def scenario(request: pytest.FixtureRequest) -> Iterator[Scenario]:
    found = _SCENARIOS.setdefault(request.node.nodeid, Scenario(request.node.nodeid))
    yield found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    found = _SCENARIOS.get(item.nodeid)
    if found is not None and report.when == "call":
        found.survived = report.passed


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SCENARIOS:
        return
    found = list(_SCENARIOS.values())
    survived = sum(s.survived for s in found)
    lost = sum(s.lost_steps or 0 for s in found)
    unknown = [s.name for s in found if s.lost_steps is None]
    terminalreporter.section("fault matrix")
    for s in found:
        if not s.survived:
            terminalreporter.write_line(f"LOST  {s.name}")
    line = f"{len(found)} scenarios, {survived} survived, {lost} lost steps"
    if unknown:
        line += f" ({len(unknown)} not counted: failed before their recoveries were read)"
    terminalreporter.write_line(line)
