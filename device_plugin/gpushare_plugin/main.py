"""`gpushare-device-plugin`: the packaged entry point (what the DaemonSet runs).

Order: read the cards, choose the memory unit (refusing one the kubelet cannot list), publish
the GPUNode inventory, start the pod watch and health checks, then serve and register. SIGTERM
(or SIGINT) stops serving, removes the sockets and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from importlib.metadata import version
from typing import Any

from gpushare import logs
from gpushare.kube import api_client
from gpushare.kube.retry import PUBLISH, pause
from gpushare.model.device_list import DeviceListStrategy
from gpushare.model.devices import check_unit_fits, smallest_fitting_unit
from gpushare.model.errors import InvalidInventory
from gpushare.model.request import GpuKind
from gpushare_plugin.allocator import Allocator
from gpushare_plugin.config import ConfigError, PluginConfig, load, parser
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery import Discovery, DiscoveryError
from gpushare_plugin.discovery.fake import FakeDiscovery
from gpushare_plugin.discovery.nvml import NvmlDiscovery
from gpushare_plugin.health import CardHealth, watch_health
from gpushare_plugin.inventory import InventoryPublisher, keep_beating
from gpushare_plugin.kubeapi import COMPONENT, PluginApi
from gpushare_plugin.lifecycle import Supervisor
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.podcache import PodCache
from gpushare_plugin.podresources import PodResources
from gpushare_plugin.server import DevicePluginServicer
from gpushare_plugin.usage import UsageMeter


def open_discovery(config: PluginConfig) -> Discovery:
    if config.fake_gpus:
        return FakeDiscovery(config.fake_gpus, node=config.node_name)
    return NvmlDiscovery()


def choose_unit(config: PluginConfig, table_sizes: DeviceTable) -> int:
    """The configured unit if the kubelet can list it, else InvalidInventory naming the
    smallest that fits; with `auto`, that smallest unit."""
    sizes = table_sizes.sizes()
    if config.gpu_memory_factor is None:
        return smallest_fitting_unit(sizes)
    check_unit_fits(sizes, config.gpu_memory_factor)
    return config.gpu_memory_factor


async def run(config: PluginConfig, stop: asyncio.Event) -> int:
    log = logs.get("plugin", node=config.node_name)
    try:
        discovery = await asyncio.to_thread(open_discovery, config)
    except DiscoveryError as error:
        log.error("cannot read the GPU cards", error=str(error))
        return 1
    try:
        cards = await asyncio.to_thread(discovery.cards)
        if not cards:
            log.warning("no GPU card on this node: nothing to advertise; idle until stopped")
            await stop.wait()
            return 0
        table = DeviceTable(
            node=config.node_name,
            cards=cards,
            unit_mib=1,
            strategy=config.device_list_strategy,
            serves=config.scheduler_names,
        )
        try:
            table.unit_mib = choose_unit(config, table)
        except InvalidInventory as error:
            log.error("refusing to start", error=str(error))
            return 2
        log.info(
            "cards found",
            cards=[
                {"card": c.index, "uuid": c.uuid, "model": c.model, "MiB": c.memory_mib}
                for c in cards
            ],
            unit_mib=table.unit_mib,
            chosen="auto" if config.gpu_memory_factor is None else "flag",
        )
        if config.device_list_strategy is DeviceListStrategy.ENVVAR:
            log.warning(
                "containers are told their cards by NVIDIA_VISIBLE_DEVICES alone",
                strategy=config.device_list_strategy.value,
                risk="a container whose image or envFrom sets NVIDIA_VISIBLE_DEVICES can see "
                "every card of this node, unless the NVIDIA container toolkit refuses the "
                "variable from unprivileged containers",
                fix="set DEVICE_LIST_STRATEGY (Helm: devicePlugin.deviceListStrategy) to "
                "cdi-cri (a CDI spec on the node) or volume-mounts (with the toolkit's "
                "settings): docs/admission.md",
            )
        metrics = PluginMetrics(node=config.node_name)
        metrics.serve(config.metrics_port)
        async with await api_client(config.kubeconfig, user_agent=COMPONENT) as client:
            api = PluginApi(client)
            kubelet_records = (
                None
                if config.pod_resources_socket is None
                else PodResources(config.pod_resources_socket, config.node_name)
            )
            if kubelet_records is not None:
                table.identifies_pods = await kubelet_records.readable()
                log.info("kubelet_records", identifies_pods=table.identifies_pods)
            publisher = InventoryPublisher(
                api=api, table=table, plugin_version=version("kube-gpushare")
            )
            # Not `retry`: `publish` logs its own failure and answers False; it is tried
            # again until it succeeds or the plugin is stopped.
            for delay in PUBLISH.delays():
                if await publisher.publish():
                    break
                if await pause(delay, stop):
                    return 0
            pods = PodCache(api, config.node_name)
            allocator = Allocator(
                table=table,
                pods=pods,
                api=api,
                metrics=metrics,
                listing=config.listing,
                limits=config.limits,
                wait_s=config.allocate_wait_s,
                schedulers=config.scheduler_names,
                kubelet_records=kubelet_records,
            )
            servicers = [
                DevicePluginServicer(kind=kind, table=table, allocator=allocator, metrics=metrics)
                for kind in GpuKind
            ]
            meter = UsageMeter(
                discovery=discovery,
                table=table,
                pods=pods,
                granted=allocator.granted,
                api=api,
                metrics=metrics,
                proc_root=config.proc_root,
                listing=config.listing,
                refresh_s=config.heartbeat_s,
            )
            health = CardHealth(policy=config.health, uuids=tuple(c.uuid for c in cards))
            supervisor = Supervisor(socket_dir=config.socket_dir, servicers=servicers)
            try:
                return await _run_until_stopped(
                    stop,
                    serving=supervisor.run(stop),
                    watching=pods.run(),
                    marking=allocator.mark_started(),
                    heartbeat=keep_beating(publisher, config.heartbeat_s),
                    usage=meter.run(config.usage_interval_s),
                    health=watch_health(
                        discovery=discovery,
                        health=health,
                        table=table,
                        publisher=publisher,
                        metrics=metrics,
                    ),
                )
            finally:
                await allocator.close()
    finally:
        await asyncio.to_thread(discovery.close)


async def _run_until_stopped(stop: asyncio.Event, **loops: Coroutine[Any, Any, object]) -> int:
    """Run the named loops; when serving ends (stop) or any loop fails, cancel the rest."""
    log = logs.get("plugin")
    tasks = {asyncio.create_task(loop, name=name): name for name, loop in loops.items()}
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    status = 0
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error(f"{tasks[task]} loop failed", error=repr(task.exception()))
            status = 1
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return status


async def _main(config: PluginConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return await run(config, stop)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load(vars(parser().parse_args(argv)), os.environ)
    except ConfigError as error:
        print(f"gpushare-device-plugin: {error}", file=sys.stderr)
        return 2
    logs.configure(config.log_level)
    return asyncio.run(_main(config))


if __name__ == "__main__":
    sys.exit(main())
