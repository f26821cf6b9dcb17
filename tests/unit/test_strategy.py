"""The recover-strategy annotation: parsing, priority order, and the operator's env mapping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_recover.config import JobConfig
from ms_recover.errors import ConfigError
from ms_recover.strategy import (
    PRIORITY,
    Strategy,
    format_strategies,
    from_operator_env,
    parse_strategies,
)

S = Strategy
ALL_NAMES = ["retry", "recover-in-place", "recover", "elastic-training", "dump", "exit"]


def test_priority_order_is_the_documented_one() -> None:
    assert [s.value for s in PRIORITY] == ALL_NAMES
    assert str(S.RECOVER_IN_PLACE) == "recover-in-place"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("exit,recover", (S.RECOVER, S.EXIT)),
        ("recover,recover-in-place", (S.RECOVER_IN_PLACE, S.RECOVER)),
        ("exit,dump,retry", (S.RETRY, S.DUMP, S.EXIT)),
        (" recover , exit ", (S.RECOVER, S.EXIT)),
        ("\trecover-in-place,\n exit", (S.RECOVER_IN_PLACE, S.EXIT)),
        ("elastic-training", (S.ELASTIC_TRAINING,)),
        ("", ()),
        ("   ", ()),
    ],
)
def test_parse_returns_priority_order(text: str, expected: tuple[Strategy, ...]) -> None:
    assert parse_strategies(text) == expected


def test_unknown_name_lists_every_valid_value() -> None:
    with pytest.raises(ConfigError) as info:
        parse_strategies("recover,recovr")
    text = str(info.value)
    assert "recover-strategy 'recovr' is not one of:" in text
    for name in ALL_NAMES:
        assert name in text


@pytest.mark.parametrize("text", ["Recover", "RECOVER", "recover_in_place", "restart"])
def test_names_are_exact_tokens(text: str) -> None:
    with pytest.raises(ConfigError, match=f"'{text}' is not one of"):
        parse_strategies(text)


def test_duplicate_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"'recover' is listed twice in 'recover,exit, recover'"):
        parse_strategies("recover,exit, recover")


@pytest.mark.parametrize("text", ["recover,,exit", "recover,", ",exit", "recover, ,exit"])
def test_empty_entry_is_an_error(text: str) -> None:
    with pytest.raises(ConfigError, match="has an empty entry; valid: retry, recover-in-place"):
        parse_strategies(text)


def test_format_is_canonical() -> None:
    assert format_strategies((S.RECOVER_IN_PLACE, S.EXIT)) == "recover-in-place,exit"
    assert format_strategies(()) == ""


@pytest.mark.parametrize(
    ("tft", "restart", "expected"),
    [
        ("{ARF:1}", "", (S.RECOVER, S.EXIT)),
        ("{ARF:1}", "off", (S.RECOVER, S.EXIT)),
        ("{ARF:1}", "on", (S.RECOVER_IN_PLACE, S.RECOVER, S.EXIT)),
        ("{ARF:1}", " ON ", (S.RECOVER_IN_PLACE, S.RECOVER, S.EXIT)),
        ("{UCE:1,HCCE:1}", "", (S.RETRY, S.EXIT)),
        ("{HCCE:1}", "", (S.RETRY, S.EXIT)),
        ("{TTP:1}", "", (S.DUMP, S.EXIT)),
        ("{TTP:1,UCE:1,ARF:1}", "on", (S.RETRY, S.RECOVER_IN_PLACE, S.RECOVER, S.DUMP, S.EXIT)),
        ("{ARF: 1, TTP : 1}", "", (S.RECOVER, S.DUMP, S.EXIT)),
        ("{ARF:0}", "on", ()),
        ("{ARF:0,UCE:0}", "", ()),
        ("{}", "on", ()),
        ("{XYZ:1}", "", ()),
    ],
)
def test_operator_env_mapping(tft: str, restart: str, expected: tuple[Strategy, ...]) -> None:
    assert from_operator_env(tft, restart) == expected


def test_restart_fault_process_alone_implies_nothing() -> None:
    assert from_operator_env("{TTP:1}", "on") == (S.DUMP, S.EXIT)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"MS_ENABLE_TFT": "{ARF:1}"}, (S.RECOVER, S.EXIT)),
        (
            {"MS_ENABLE_TFT": "{ARF:1}", "ENABLE_RESTART_FAULT_PROCESS": "on"},
            (S.RECOVER_IN_PLACE, S.RECOVER, S.EXIT),
        ),
        ({"MS_ENABLE_TFT": "{ARF:1}", "MS_RECOVER_STRATEGY": "dump,exit"}, (S.DUMP, S.EXIT)),
        # an explicitly empty annotation still wins: no process-level recovery
        ({"MS_ENABLE_TFT": "{ARF:1}", "MS_RECOVER_STRATEGY": ""}, ()),
        ({"MS_ENABLE_TFT": ""}, (S.RECOVER_IN_PLACE, S.RECOVER, S.EXIT)),  # defaults
    ],
)
def test_job_config_reads_the_annotation_first(
    env: dict[str, str], expected: tuple[Strategy, ...]
) -> None:
    assert JobConfig.from_env(env).strategies == expected


def test_job_config_bad_annotation_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'recovr' is not one of"):
        JobConfig.from_env({"MS_RECOVER_STRATEGY": "recovr"})


def test_explicit_strategies_beat_the_annotation() -> None:
    cfg = JobConfig.from_env({"MS_RECOVER_STRATEGY": "recover"}, strategies=(S.EXIT,))
    assert cfg.strategies == (S.EXIT,)


@settings(deadline=None)
@given(st.lists(st.sampled_from(list(Strategy)), unique=True), st.randoms())
def test_any_permutation_parses_to_priority_order(chosen: list[Strategy], rnd: object) -> None:
    shuffled = list(chosen)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    spaced = [f"{' ' * (i % 3)}{s.value}{' ' * (i % 2)}" for i, s in enumerate(shuffled)]
    parsed = parse_strategies(",".join(spaced))
    expected = tuple(s for s in PRIORITY if s in chosen)
    assert parsed == expected
    assert parse_strategies(format_strategies(parsed)) == parsed
    assert format_strategies(parsed) == ",".join(s.value for s in expected)
