"""Health rules: which XIDs count, and how a card comes back."""

from __future__ import annotations

import pytest

from gpushare_plugin.discovery import XidEvent
from gpushare_plugin.health import CardHealth, HealthPolicy


def cards(recovery_s: float = 60, disable: str = "") -> CardHealth:
    return CardHealth(policy=HealthPolicy.from_setting(disable, recovery_s), uuids=("a", "b"))


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_say_nothing_about_the_card(xid: int) -> None:
    health = cards()
    assert health.observe(XidEvent(uuid="a", xid=xid), 0) == []
    assert health.unhealthy() == frozenset()


def test_a_critical_xid_marks_its_card_and_one_without_a_card_marks_all() -> None:
    health = cards()
    assert health.observe(XidEvent(uuid="a", xid=79), 0) == ["a"]
    assert health.observe(XidEvent(uuid="a", xid=48), 1) == []  # already unhealthy
    assert health.xid_of("a") == 48
    assert health.observe(XidEvent(uuid=None, xid=79), 2) == ["b"]
    assert health.unhealthy() == {"a", "b"}
    assert health.observe(XidEvent(uuid="elsewhere", xid=79), 3) == []


def test_a_card_is_probed_only_after_a_quiet_recovery_period() -> None:
    health = cards(recovery_s=60)
    health.observe(XidEvent(uuid="a", xid=79), 0)
    assert health.due_for_probe(59) == []
    health.observe(XidEvent(uuid="a", xid=79), 30)  # a new XID restarts the wait
    assert health.due_for_probe(60) == []
    assert health.due_for_probe(90) == ["a"]
    assert health.recover("a")
    assert health.unhealthy() == frozenset()
    assert not health.recover("a")


def test_dp_disable_healthchecks_as_nvidias_plugin_reads_it() -> None:
    assert not HealthPolicy.from_setting("all", 1).enabled
    assert not HealthPolicy.from_setting("xids", 1).enabled
    extra = cards(disable="79, 48")
    assert extra.observe(XidEvent(uuid="a", xid=79), 0) == []
    assert extra.observe(XidEvent(uuid="a", xid=63), 0) == ["a"]
    with pytest.raises(ValueError, match="'some'"):
        HealthPolicy.from_setting("some", 1)
    off = cards(disable="all")
    assert off.observe(XidEvent(uuid="a", xid=79), 0) == []
