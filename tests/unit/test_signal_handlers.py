"""``ms-recover manager`` runs inside ``cli.main``, which another program (a test suite, a
launcher) may call: whichever way it ends, the SIGTERM handler the caller had is back, so that
program still obeys SIGTERM (tests/integration/test_bad_input.py's manager cases left the suite
deaf to SIGTERM)."""

from __future__ import annotations

import pathlib
import signal

import pytest

from ms_recover import cli


def _own_handler(signum: int, frame: object) -> None:
    raise AssertionError("not to be called")


@pytest.fixture
def own_sigterm() -> object:
    previous = signal.signal(signal.SIGTERM, _own_handler)
    yield _own_handler
    signal.signal(signal.SIGTERM, previous)


def test_a_manager_that_cannot_start_gives_sigterm_back(
    own_sigterm: object, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["manager", "--port", "0", "--events", str(tmp_path)])
    assert code == 2 and "cannot be opened for appending" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is own_sigterm
