"""Fake cards from a spec, with failures and recoveries at run time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_plugin.discovery import DiscoveryError, XidEvent
from gpushare_plugin.discovery.fake import FakeDiscovery


def test_the_guides_node_from_an_inline_spec() -> None:
    cards = FakeDiscovery("8x11178", node="gpu-node-1").cards()
    assert [c.index for c in cards] == list(range(8))
    assert {c.memory_mib for c in cards} == {11178}
    assert len({c.uuid for c in cards}) == 8
    # Stable across restarts, distinct across nodes.
    assert FakeDiscovery("8x11178", node="gpu-node-1").cards() == cards
    assert FakeDiscovery("8x11178", node="gpu-node-2").cards()[0].uuid != cards[0].uuid


def test_heterogeneous_inline_spec() -> None:
    cards = FakeDiscovery("2x81920, 1x40960", node="n").cards()
    assert [c.memory_mib for c in cards] == [81920, 81920, 40960]


@pytest.mark.parametrize("spec", ["", "8", "8x", "0x100", "8x11178,", "2*1024", "x100"])
def test_a_bad_inline_spec_says_how_to_write_one(spec: str) -> None:
    with pytest.raises(DiscoveryError, match="COUNTxMiB"):
        FakeDiscovery(spec, node="n")


def test_a_bad_file_is_refused_at_start(tmp_path: Path) -> None:
    spec = tmp_path / "cards.yaml"
    with pytest.raises(DiscoveryError, match=r"cards\.yaml"):
        FakeDiscovery(f"@{spec}", node="n")
    spec.write_text(yaml.safe_dump({"cards": [{"memoryMiB": "lots"}]}))
    with pytest.raises(DiscoveryError, match=r"cards\[0\].memoryMiB"):
        FakeDiscovery(f"@{spec}", node="n")


def test_a_card_fails_once_and_recovers_when_its_xid_is_removed(tmp_path: Path) -> None:
    spec = tmp_path / "cards.yaml"
    cards: list[dict[str, Any]] = [
        {"memoryMiB": 100, "model": "A", "numaNode": 1, "uuid": "GPU-a"},
        {"memoryMiB": 50},
    ]
    spec.write_text(yaml.safe_dump({"cards": cards}))
    fake = FakeDiscovery(f"@{spec}", node="n")
    first = fake.cards()[0]
    assert (first.uuid, first.model, first.numa_node) == ("GPU-a", "A", 1)
    assert fake.wait_event(0) is None
    cards[0]["xid"] = 79
    spec.write_text(yaml.safe_dump({"cards": cards}))
    os.utime(spec, (1, 1))  # a distinct mtime even on a coarse clock
    assert fake.wait_event(500) == XidEvent(uuid="GPU-a", xid=79)
    assert fake.wait_event(0) is None  # raised once
    assert not fake.probe("GPU-a")
    del cards[0]["xid"]
    spec.write_text(yaml.safe_dump({"cards": cards}))
    os.utime(spec, (2, 2))
    assert fake.probe("GPU-a")
