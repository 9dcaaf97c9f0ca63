"""The GPU check of issue 29, one script for the lent GPU machine (../shared/reference/gpu-box.md:
Python 3.12 with PyTorch at /opt/torch/.venv, the CUDA toolkit, no Kubernetes, no network):

    bench/gpu/run.sh                      # on the GPU machine: sets up, runs this, under 5 min
    .venv/bin/python bench/gpu/check.py --fake     # here: the same flow on the fake backend

What it shows, with the plugin's own code (the NVML usage source, the mapping, the over-use
judge) against real PyTorch processes given a grant's environment (`framework_limits` for
1024 MiB of the card):
1. a process within its share allocates 256 MiB;
2. a process past it is refused by PyTorch's own allocator (`OutOfMemoryError`);
3. a process that ignores the limit (no such env) holds 3 GiB;
4. NVML reports the processes with their memory (contexts included), mapped to their
   "containers" (here: the pids the script started; no kubelet to write cgroups), and the
   over-user is flagged, the one within its share not, within 2 s of its allocation.
Prints one JSON object; exits 1 if any point does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for part in ("core", "device_plugin"):
    sys.path.insert(0, str(ROOT / part))

from gpushare.model.annotations import CardIndex  # noqa: E402
from gpushare.model.limits import Framework, LimitSettings, framework_limits  # noqa: E402
from gpushare.model.measured import CgroupPlace, Grant, Process, measure  # noqa: E402
from gpushare.model.overuse import OverUsePolicy, OverUseWatch  # noqa: E402
from gpushare.model.usage import PodRef, PodUid  # noqa: E402
from gpushare_plugin.discovery import Discovery  # noqa: E402

GRANT_MIB = 1024
HOLD_S = 90
FLAG_WITHIN_S = 2.0

HOLDER = """
import sys, time, torch
mib = int(sys.argv[1])
try:
    block = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("held", flush=True)
except torch.OutOfMemoryError as error:
    print("refused " + str(error).splitlines()[0], flush=True)
    sys.exit(0)
time.sleep(float(sys.argv[2]))
"""


def start(python: str, mib: int, env: dict[str, str]) -> subprocess.Popen[Any]:
    return subprocess.Popen(
        [python, "-c", HOLDER, str(mib), str(HOLD_S)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        text=True,
    )


def first_line(process: subprocess.Popen[Any]) -> str:
    assert process.stdout is not None
    return str(process.stdout.readline()).strip()


def run(fake: bool, python: str) -> dict[str, object]:
    discovery: Discovery
    if fake:
        from gpushare_plugin.discovery.fake import FakeDiscovery  # noqa: PLC0415

        spec = Path(tempfile.mkdtemp()) / "cards.yaml"
        spec.write_text("cards:\n  - {memoryMiB: 143771}\n")
        discovery = FakeDiscovery(f"@{spec}", node="gpu-check")
    else:
        from gpushare_plugin.discovery.nvml import NvmlDiscovery  # noqa: PLC0415

        discovery = NvmlDiscovery()
    (card, *_) = discovery.cards()
    # Every framework's, PyTorch's included (an admin's --framework-limits=all, or a pod's
    # gpushare.io/framework-limits): the machine's PyTorch is 2.11.
    limits = framework_limits(
        GRANT_MIB, card.memory_mib, LimitSettings(frameworks=frozenset(Framework))
    )
    result: dict[str, object] = {
        "card": {"model": card.model, "MiB": card.memory_mib},
        "grant_env": dict(limits.env),
    }
    children: dict[str, subprocess.Popen[Any]] = {}
    try:
        if fake:  # no CUDA here: processes that sleep, their memory written as NVML would say
            for name in ("within", "ignores"):
                children[name] = subprocess.Popen(["sleep", str(HOLD_S)])
            result["refused_by_the_framework"] = "not checked: no GPU"
            spec.write_text(
                "cards:\n  - {memoryMiB: 143771}\nprocesses:\n"
                f"  - {{pid: {children['within'].pid}, card: 0, usedMiB: 780}}\n"
                f"  - {{pid: {children['ignores'].pid}, card: 0, usedMiB: 3590}}\n"
            )
            allocated_at = time.monotonic()
        else:
            children["within"] = start(python, 256, dict(limits.env))
            result["within"] = first_line(children["within"])
            past = start(python, 2048, dict(limits.env))
            result["refused_by_the_framework"] = first_line(past)
            past.wait(60)
            children["ignores"] = start(python, 3072, {})
            result["ignores"] = first_line(children["ignores"])
            allocated_at = time.monotonic()
        seen, flagged, after_s = watch_until_flagged(discovery, children, card.index, allocated_at)
        result["nvml_processes_MiB"] = seen
        result["flagged"] = flagged
        result["flagged_after_s"] = after_s
    finally:
        for child in children.values():
            child.kill()
        discovery.close()
    result["ok"] = bool(
        flagged == ["ignores"]
        and set(seen) == {"within", "ignores"}
        and after_s <= FLAG_WITHIN_S
        and (fake or str(result["refused_by_the_framework"]).startswith("refused"))
    )
    return result


def watch_until_flagged(
    discovery: Discovery,
    children: dict[str, subprocess.Popen[Any]],
    card: int,
    allocated_at: float,
) -> tuple[dict[str, int | None], list[str], float]:
    """The plugin's usage source, mapping and judge, every 0.1 s until something is flagged
    (or 30 s): what NVML saw of each child, what was flagged, and after how long."""
    pods = {name: PodRef(namespace="check", name=name, uid=PodUid(name)) for name in children}
    places = {p.pid: CgroupPlace(PodUid(name), (name,)) for name, p in children.items()}
    containers = {name: (pods[name], "main") for name in children}
    grant = Grant({CardIndex(card): GRANT_MIB})
    grants = {(PodUid(name), "main"): grant for name in children}
    watch = OverUseWatch()
    flagged: list[str] = []
    seen: dict[str, int | None] = {}
    while time.monotonic() - allocated_at < 30 and not flagged:
        listed = [p for p in discovery.processes().found if p.pid in places]
        processes = [Process(p.pid, p.card, p.used_mib) for p in listed]
        seen = {children_name(places, p.pid): p.used_mib for p in processes}
        usage = measure(processes, places, containers, grants, at="now")
        actions = watch.observe(
            "gpu-check", usage, measured_at=time.time(), now=time.time(),
            policy=OverUsePolicy.WARN, grace_s=0, max_age_s=60,
        )  # fmt: skip
        flagged = sorted(a.use.pod.name for a in actions)
        if not flagged:
            time.sleep(0.1)
    return seen, flagged, round(time.monotonic() - allocated_at, 2)


def children_name(places: dict[int, CgroupPlace], pid: int) -> str:
    return str(places[pid].pod_uid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="the fake backend, no GPU")
    parser.add_argument("--python", default="/opt/torch/.venv/bin/python")
    args = parser.parse_args()
    result = run(args.fake, args.python)
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
