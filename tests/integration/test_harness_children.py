"""The harness's children: they die with whoever started them, and starting them from a
process busy with gRPC (the benchmarks' stand-in kubelet) runs nothing of gRPC's in them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpushare_harness.controlplane import alive

pytestmark = pytest.mark.integration

# A parent with gRPC threads at work, as bench/plugin.py is when it starts the device plugin.
_STARTER = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    import grpc
    from gpushare_harness.process import LoggedProcess

    class Sleeper(LoggedProcess):
        name = "sleeper"

    async def main() -> None:
        server = grpc.aio.server()
        server.add_insecure_port("unix://" + sys.argv[1] + "/grpc.sock")
        await server.start()
        async with grpc.aio.insecure_channel("unix://" + sys.argv[1] + "/grpc.sock") as channel:
            await channel.channel_ready()
            children = []
            for number in range(20):
                child = Sleeper(Path(sys.argv[1]) / f"sleeper-{number}.log")
                child._spawn(["sleep", "600"], env={})
                children.append(child.pid)
            print(json.dumps(children), flush=True)
            await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def test_children_die_with_their_starter_and_run_none_of_its_grpc(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _STARTER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as starter:
        try:
            assert starter.stdout is not None
            children = json.loads(starter.stdout.readline())
            assert all(alive(pid) for pid in children)
        finally:
            starter.send_signal(signal.SIGKILL)
        _, stderr = starter.communicate()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if alive(pid)]
    # gRPC's fork handlers say this when they run; in a child they once restarted a poller
    # that aborted it before exec.
    assert "fork" not in stderr, stderr
