"""The walk of a pod event through the operator's code: which files (rooms) it enters, how
many stays (runs of calls within one file) it makes, how often it climbs back up (a call
from the scheduler or its core into an event handler), and which tasks it starts. Not a
speed figure: a reading aid for the house's layout (issue 32), run on any tree of the
project:

    .venv/bin/python bench/walk.py

Three events, with this replica leading and no API behind it: a pending GPU pod added and a
bound member of a gang deleted (its gang falls below its minimum), each as the pod reflector
delivers them, and what the scheduler does with a pod read back after its bind was answered
409 (already bound), until the cache holds it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from builders import capacity_node, gpu_pod  # noqa: E402

from gpushare.kube.reflector import DELETED, MODIFIED  # noqa: E402
from gpushare.model.gangs import VOLCANO_GROUP_ANNOTATIONS, GroupApi  # noqa: E402
from gpushare_operator.config import OperatorConfig  # noqa: E402
from gpushare_operator.runtime import Runtime  # noqa: E402
from gpushare_operator.scheduling.podinfo import PodInfo  # noqa: E402

PROJECT = ("/operator/gpushare_operator/", "/core/gpushare/")
INTAKE = ("gpushare_operator/runtime.py", "gpushare_operator/intake.py")
SCHEDULING = ("gpushare_operator/scheduler.py", "gpushare_operator/scheduling/")


class NoApi:
    """Stands where the API would be: only the read-back of a pod answers (with `pod`)."""

    def __init__(self) -> None:
        self.pod: dict[str, Any] | None = None

    def lister(self, resource: str) -> Callable[..., Any]:
        return lambda **_: None

    async def read_pod(self, pod: object) -> dict[str, Any] | None:
        return self.pod

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the walk called the API: {name}")


def walk(event: Callable[[], None]) -> dict[str, Any]:
    """The files `event()` enters, its stays and climbs."""
    files: list[str] = []
    climbs = 0

    def profile(frame: FrameType, what: str, _arg: object) -> None:
        nonlocal climbs
        if what not in ("call", "return"):
            return
        here = frame.f_code.co_filename
        if not any(part in here for part in PROJECT):
            return
        if what == "call" and frame.f_back is not None:
            caller = frame.f_back.f_code.co_filename
            handler = "intake.py" in here or frame.f_code.co_name.endswith("_event")
            if any(s in caller for s in SCHEDULING) and any(s in here for s in INTAKE) and handler:
                climbs += 1
        short = here.split("/work/", 1)[-1].split("/", 1)[-1] if "/work/" in here else here
        short = short[short.find("gpushare") :]
        if not files or files[-1] != short:
            files.append(short)
        if what == "return" and frame.f_back is not None:
            back = frame.f_back.f_code.co_filename
            if any(part in back for part in PROJECT):
                back_short = back[back.find("gpushare") :]
                if files[-1] != back_short:
                    files.append(back_short)

    tasks = asyncio.all_tasks()
    sys.setprofile(profile)
    try:
        event()
    finally:
        sys.setprofile(None)
    started = [t.get_name() for t in asyncio.all_tasks() - tasks]
    return {
        "rooms": len(set(files)),
        "stays": len(files),
        "climbs_back_up": climbs,
        "tasks_started": started,  # an eviction started from a watch event, say
    }


def drive(coroutine: Any) -> None:
    """Run a coroutine that never waits (its API answers at once) to its end."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    raise AssertionError("the coroutine waited")


def pod_event(runtime: Runtime) -> Callable[[str, PodInfo], None]:
    intake = getattr(runtime, "intake", None)
    handler = intake.pod_event if intake is not None else runtime.pod_event  # type: ignore[attr-defined]
    return handler  # type: ignore[no-any-return]


async def main() -> None:
    config = OperatorConfig(leader_elect=False, metrics_port=0)
    api = NoApi()
    runtime = Runtime(config=config, api=api, on_failure=lambda: None)
    node = capacity_node("n", 40000, 2)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
    handlers: Any = getattr(runtime, "intake", runtime)  # before issue 32: the runtime itself
    handlers.node_event(MODIFIED, node)
    handle_group = handlers.group_event
    group = {"metadata": {"name": "g", "namespace": "default"}, "spec": {"minMember": 2}}
    handle_group(GroupApi.VOLCANO, MODIFIED, group)
    handle = pod_event(runtime)
    members = []
    for name in ("m0", "m1"):
        body = gpu_pod(name, 1000, uid=name, node="n", index="0")
        body["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATIONS[0]] = "g"
        body["metadata"]["ownerReferences"] = [{"controller": True, "kind": "Job", "name": "j"}]
        handle(MODIFIED, PodInfo.parse(body))
        members.append(body)
    pending = PodInfo.parse(gpu_pod("p", 1000, uid="p"))
    api.pod = gpu_pod("p", 1000, uid="p", node="n", index="1")
    api.pod["metadata"]["resourceVersion"] = "99"

    def read_back() -> None:
        """The scheduler's read-back, to its end; then (the new layout) the intake's turn."""
        drive(runtime.scheduler._read_back(pending, runtime.scheduler._log))
        intake = getattr(runtime, "intake", None)
        if intake is not None:
            while not intake.findings.empty():
                intake.pod_event(*intake.findings.get_nowait())

    results = {
        "a pending GPU pod added": walk(lambda: handle(MODIFIED, pending)),
        "a bound gang member deleted": walk(lambda: handle(DELETED, PodInfo.gone("m0"))),  # type: ignore[arg-type]
        "a pod read back after a bind answered 409": walk(read_back),
    }
    await asyncio.sleep(0)  # let an eviction task the old layout starts be cancelled cleanly
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
