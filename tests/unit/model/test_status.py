"""A GPUNode's Ready and Stale conditions, from its device plugin's heartbeat."""

from __future__ import annotations

from typing import Any

from gpushare.model.status import Heartbeat, gpunode_conditions

EARLIER = "2026-12-01T00:00:00Z"
NOW = "2026-12-03T00:00:00Z"


def conditions(
    last: float | None, healthy: int = 2, previous: list[dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    shown = gpunode_conditions(
        Heartbeat(last=last, now=1000.0, stale_after_s=90), healthy, previous or [], NOW
    )
    return {c["type"]: c for c in shown}


def test_a_node_whose_plugin_beats_is_ready_and_not_stale() -> None:
    shown = conditions(last=970.0)
    assert (shown["Ready"]["status"], shown["Ready"]["reason"]) == ("True", "PluginReady")
    assert shown["Stale"]["status"] == "False"


def test_a_node_whose_plugin_stopped_beating_is_stale_and_not_ready() -> None:
    shown = conditions(last=900.0)
    assert (shown["Stale"]["status"], shown["Stale"]["reason"]) == ("True", "HeartbeatStopped")
    assert "more than 90 s" in shown["Stale"]["message"]
    assert shown["Ready"]["status"] == "False"


def test_a_node_with_every_card_unhealthy_is_not_ready() -> None:
    shown = conditions(last=990.0, healthy=0)
    assert (shown["Ready"]["status"], shown["Ready"]["reason"]) == ("False", "NoHealthyCard")
    assert shown["Stale"]["status"] == "False"


def test_a_plugin_that_writes_no_heartbeat_leaves_both_unknown() -> None:
    shown = conditions(last=None)
    assert {c["status"] for c in shown.values()} == {"Unknown"}


def test_the_transition_time_moves_only_when_the_status_changes() -> None:
    before = [
        {"type": "Ready", "status": "True", "lastTransitionTime": EARLIER},
        {"type": "Stale", "status": "False", "lastTransitionTime": EARLIER},
    ]
    same = conditions(last=990.0, previous=before)
    assert {c["lastTransitionTime"] for c in same.values()} == {EARLIER}
    changed = conditions(last=800.0, previous=before)
    assert {c["lastTransitionTime"] for c in changed.values()} == {NOW}
    # An unchanged state is the same object: nothing to write.
    assert conditions(last=995.0, previous=list(same.values())) == same
