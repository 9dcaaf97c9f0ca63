"""Configuration: environment over defaults, live values validated, bad values refused whole."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import fields, replace

import pytest

from gpushare.model import Policy
from gpushare_operator.config import (
    LIVE_FIELDS,
    OPTIONS,
    ConfigError,
    OperatorConfig,
    add_flags,
    live_view,
    load,
    with_live,
)
from gpushare_operator.main import main


def test_defaults_serve_volcano_pods_with_bestfit() -> None:
    config = load({}, {})
    assert config.scheduler_names == {"volcano"}
    assert config.policy is Policy.BESTFIT
    assert config.leader_elect is True


def test_the_environment_overrides_defaults() -> None:
    config = load(
        {},
        {
            "GPUSHARE_SCHEDULER_NAMES": "volcano, gpushare",
            "GPUSHARE_POLICY": "firstfit",
            "GPUSHARE_LEADER_ELECT": "false",
        },
    )
    assert config.scheduler_names == {"volcano", "gpushare"}
    assert config.policy is Policy.FIRSTFIT
    assert config.leader_elect is False


def test_every_bad_value_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        load(
            {},
            {
                "GPUSHARE_POLICY": "worstfit",
                "GPUSHARE_BIND_TIMEOUT": "-3",
                "GPUSHARE_METRICS_PORT": "http",
            },
        )
    message = str(caught.value)
    assert "GPUSHARE_POLICY='worstfit': must be bestfit, firstfit, binpack or spread" in message
    assert "GPUSHARE_BIND_TIMEOUT='-3'" in message
    assert "GPUSHARE_METRICS_PORT='http'" in message


def test_a_lease_whose_name_cannot_label_the_leaders_writes_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        load({}, {"GPUSHARE_LEASE_NAME": "a-lease-named-at-such-length-that-no-label-holds-it"})
    message = str(caught.value)
    assert "'gpushare-system.a-lease-named-at-such-length-that-no-label-holds-it'" in message
    assert "must fit a label value (63)" in message
    assert "choose a shorter GPUSHARE_LEASE_NAME" in message
    assert load({}, {"GPUSHARE_LEASE_NAME": "x" * 47}).lease_name == "x" * 47  # 63 with it


def test_a_live_spec_applies_over_the_start_up_configuration() -> None:
    base = OperatorConfig()
    live = with_live(
        base,
        {"policy": "spread", "schedulerNames": ["volcano", "x"], "assignmentTimeoutSeconds": 5},
    )
    assert (live.policy, live.scheduler_names, live.assignment_timeout_s) == (
        Policy.SPREAD,
        frozenset({"volcano", "x"}),
        5.0,
    )


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ({"policy": "worstfit"}, "spec.policy='worstfit'"),
        ({"bindTimeoutSeconds": 0}, "spec.bindTimeoutSeconds='0'"),
        ({"leaderElect": False}, "unknown field(s) leaderElect"),
        ({"memoryUnitMiB": 0}, "spec.memoryUnitMiB='0'"),
        ({"podMemoryLimits": "GiB"}, "MiB or Units"),
        (
            {"backoffInitialSeconds": 20, "backoffMaxSeconds": 5},
            "backoff initial must not exceed backoff max",
        ),
    ],
)
def test_a_bad_live_spec_is_refused_whole(spec: dict[str, object], hint: str) -> None:
    with pytest.raises(ConfigError, match="invalid configuration") as caught:
        with_live(OperatorConfig(), spec)
    assert hint in str(caught.value)


def test_one_option_per_field_each_with_its_own_variable_and_flag() -> None:
    assert [option.field for option in OPTIONS] == [item.name for item in fields(OperatorConfig)]
    assert len({option.env for option in OPTIONS}) == len(OPTIONS)
    assert len({option.flag for option in OPTIONS}) == len(OPTIONS)
    assert set(LIVE_FIELDS) == {
        "schedulerNames",
        "policy",
        "assignmentTimeoutSeconds",
        "bindTimeoutSeconds",
        "backoffInitialSeconds",
        "backoffMaxSeconds",
        "unschedulableRetrySeconds",
        "gangTimeoutSeconds",
        "memoryUnitMiB",
        "podMemoryLimits",
        "setSchedulerName",
        "overUsePolicy",
        "overUseGraceSeconds",
        "overUseDeleteAfterSeconds",
        "preemption",
        "defragmentation",
        "defragmentationIntervalSeconds",
    }


def test_the_help_names_each_variable_and_default() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    shown = " ".join(parser.format_help().split())
    assert (
        "--bind-timeout BIND_TIMEOUT_S seconds for each API call (a Binding, an Event, a read, "
        "a write, the Lease)"
    ) in shown
    assert "($GPUSHARE_BIND_TIMEOUT; default 10)" in shown
    assert "($GPUSHARE_SCHEDULER_NAMES; default volcano)" in shown
    assert "($GPUSHARE_LEADER_ELECT; default true)" in shown


def test_main_refuses_a_bad_flag_before_connecting_and_a_flag_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUSHARE_BIND_TIMEOUT", "-1")
    monkeypatch.setenv("GPUSHARE_POLICY", "bestfit")
    assert main(["--bind-timeout", "5", "--policy", "worstfit"]) == 2
    refusal = capsys.readouterr().err
    assert "--policy='worstfit'" in refusal  # where the bad value came from
    assert "GPUSHARE_BIND_TIMEOUT" not in refusal
    assert os.environ["GPUSHARE_POLICY"] == "bestfit"  # flags are not written back


def test_one_path_reads_a_flag_over_its_variable_over_the_default() -> None:
    config = load(
        {"policy": "spread", "bind_timeout_s": None},
        {"GPUSHARE_POLICY": "firstfit", "GPUSHARE_BIND_TIMEOUT": "7"},
    )
    assert config.policy is Policy.SPREAD
    assert config.bind_timeout_s == 7
    assert config.backoff_max_s == OperatorConfig().backoff_max_s


def test_the_published_configuration_reads_back_as_the_same_decisions() -> None:
    config = load({}, {"GPUSHARE_POLICY": "firstfit", "GPUSHARE_SCHEDULER_NAMES": "b,a"})
    published = live_view(config)
    assert published["policy"] == "firstfit"
    assert published["schedulerNames"] == ["a", "b"]
    assert json.loads(json.dumps(published)) == published
    assert with_live(OperatorConfig(), published) == replace(
        OperatorConfig(), **{f: getattr(config, f) for f in LIVE_FIELDS.values()}
    )
