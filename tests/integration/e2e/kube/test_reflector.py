"""The list-then-watch that feeds the operator's cache and the plugin's, against the real
apiserver: paged lists, whole events however large, deletions missed while not watching,
a resource whose CRD is not installed, and a watch whose connection went silent."""

from __future__ import annotations

import asyncio
import functools
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import create_pod, eventually, gpu_pod
from kubernetes_asyncio import client

from gpushare import kube
from gpushare.kube.reflector import LISTED, Reflector, name_of
from gpushare_harness import ControlPlane
from gpushare_harness.relay import Relay, through

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


class Owner:
    """What a reflector's owner sees, as the owner would keep it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.held: dict[str, dict[str, Any]] = {}
        self.lists: list[set[str]] = []
        self.versions: list[str] = []

    def apply(self, event_type: str, body: dict[str, Any]) -> None:
        name = name_of(body)
        self.events.append((event_type, name))
        if event_type == "DELETED":
            self.held.pop(name, None)
        else:
            self.held[name] = body

    def listed(self, names: set[str], version: str) -> None:
        self.lists.append(names)
        self.versions.append(version)
        for gone in set(self.held) - names:
            del self.held[gone]


def pod_reflector(
    core: client.CoreV1Api, owner: Owner, **options: Any
) -> Reflector[dict[str, Any]]:
    return Reflector(
        "pods",
        functools.partial(core.list_namespaced_pod, "default"),
        transform=dict,
        on_event=owner.apply,
        on_listed=owner.listed,
        key=name_of,
        **options,
    )


async def test_a_paged_list_hands_over_every_object_once_then_watches_changes_of_any_size(
    core: client.CoreV1Api,
) -> None:
    for number in range(7):
        await create_pod(core, gpu_pod(f"listed-{number}", 1024))
    owner = Owner()
    reflector = pod_reflector(core, owner, page_size=3)
    reflector.start()
    try:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        expected = {f"listed-{number}" for number in range(7)}
        assert sorted(owner.events) == sorted((LISTED, name) for name in expected)
        assert owner.lists == [expected]
        assert owner.versions[0].isdigit(), "a LIST gives the version to watch from"
        assert reflector.count == 7

        # One watch event far over aiohttp's 64 KiB line limit arrives whole.
        large = gpu_pod("large", 1024)
        large["metadata"]["annotations"] = {"example.com/blob": "x" * 200_000}
        await create_pod(core, large)
        await core.delete_namespaced_pod("listed-0", "default", grace_period_seconds=0)

        async def watched() -> bool:
            return "large" in owner.held and "listed-0" not in owner.held

        await eventually(watched, timeout_s=20, what="the watch delivers the changes")
        assert owner.held["large"]["metadata"]["annotations"]["example.com/blob"] == "x" * 200_000
        assert ("DELETED", "listed-0") in owner.events
    finally:
        await reflector.stop()


async def test_a_new_list_drops_what_was_deleted_while_nobody_watched(
    core: client.CoreV1Api,
) -> None:
    for name in ("stays", "goes"):
        await create_pod(core, gpu_pod(name, 1024))
    owner = Owner()
    reflector = pod_reflector(core, owner)
    reflector.start()
    await asyncio.wait_for(reflector.synced.wait(), 30)
    await reflector.stop()
    await core.delete_namespaced_pod("goes", "default", grace_period_seconds=0)

    async def listed_again() -> bool:
        return len(owner.lists) == 2

    reflector.start()
    try:
        await eventually(listed_again, what="a second list")
        assert set(owner.held) == {"stays"}
        assert owner.lists[-1] == {"stays"}
    finally:
        await reflector.stop()


async def test_a_resource_whose_crd_is_missing_lists_as_empty(api: client.ApiClient) -> None:
    owner = Owner()
    reflector = Reflector(
        "missing",
        functools.partial(
            client.CustomObjectsApi(api).list_cluster_custom_object,
            "example.com",
            "v1",
            "notinstalled",
        ),
        transform=dict,
        on_event=owner.apply,
        on_listed=owner.listed,
        optional=True,
    )
    reflector.start()
    try:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        assert owner.lists == [set()]
        assert owner.events == []
    finally:
        await reflector.stop()


async def test_an_owner_failing_on_one_object_still_gets_every_other(
    core: client.CoreV1Api,
) -> None:
    class Fragile(Owner):
        def apply(self, event_type: str, body: dict[str, Any]) -> None:
            if name_of(body) == "bad":
                raise ValueError("a bug for this one object")
            super().apply(event_type, body)

    for name in ("bad", "good"):
        await create_pod(core, gpu_pod(name, 1024))
    owner = Fragile()
    reflector = pod_reflector(core, owner)
    reflector.start()
    try:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        assert set(owner.held) == {"good"}
        assert owner.lists == [{"bad", "good"}]
        await create_pod(core, gpu_pod("later", 1024))

        async def watched() -> bool:
            return "later" in owner.held

        await eventually(watched, timeout_s=20, what="the watch to go on after the failure")
    finally:
        await reflector.stop()


async def test_a_watch_gone_silent_is_opened_again_and_misses_nothing(
    plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path
) -> None:
    server = yaml.safe_load(plane.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    relay = Relay(int(server.rsplit(":", 1)[1]))
    config = through(Path(shutil.copy(plane.kubeconfig, tmp_path / "relayed")), await relay.start())
    owner = Owner()
    try:
        async with await kube.api_client(config) as relayed:
            reflector = pod_reflector(client.CoreV1Api(relayed), owner, idle_s=2)
            reflector.start()
            try:
                await asyncio.wait_for(reflector.synced.wait(), 30)
                # Half-open: the watch's connection stays, but nothing comes through it.
                assert relay.stall() >= 1
                await create_pod(core, gpu_pod("after-the-stall", 1024))

                async def seen() -> bool:
                    return "after-the-stall" in owner.held

                # The watch's own end would come WATCH_S (5 minutes) later.
                await eventually(seen, timeout_s=30, what="the watch to be opened again")
            finally:
                await reflector.stop()
    finally:
        await relay.close()
