"""The operator as a real process (`python -m gpushare_operator.main`), for tests, the demo
and benchmarks: started against a kubeconfig, probed through its liveness endpoint, stopped
with SIGTERM or killed with SIGKILL like a crashed replica."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpushare_harness.controlplane import free_port
from gpushare_harness.process import LoggedProcess


def webhook_url(port: int) -> str:
    """Where the apiserver calls the webhook of operators started with `webhook_port=port`."""
    return f"https://127.0.0.1:{port}/gpu-pods"


class OperatorProcess(LoggedProcess):
    name = "operator"

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        *,
        identity: str = "op-1",
        env: dict[str, str] | None = None,
        profile: Path | None = None,
        detached: bool = False,
        webhook_port: int = 0,
        clock_skew_s: int = 0,
    ) -> None:
        """`profile`: write a cProfile of the operator's main thread there (benchmarks).
        `webhook_port`: serve the admission webhook on 127.0.0.1 at that port (every
        operator of one cluster the same: SO_REUSEPORT shares it, as a Service would); 0, none
        (pods are then not converted: install no admission objects). `clock_skew_s`: its wall
        clock runs that far ahead (libfaketime; its monotonic clock is left alone), as a
        replica on a machine whose clock drifted; its log's times are off by as much."""
        super().__init__(log, detached=detached)
        self.clock_skew_s = clock_skew_s
        self.kubeconfig = kubeconfig
        self.python_args = ["-m", "cProfile", "-o", str(profile)] if profile else []
        self.identity = identity
        self.liveness_port = free_port()
        self.env = {
            "GPUSHARE_METRICS_PORT": "0",
            "GPUSHARE_LEASE_DURATION": "4",
            "GPUSHARE_RENEW_DEADLINE": "3",
            "GPUSHARE_RETRY_PERIOD": "0.5",
            "GPUSHARE_STATUS_INTERVAL": "0.5",
            "GPUSHARE_WEBHOOK_PORT": str(webhook_port),
            "GPUSHARE_WEBHOOK_HOSTS": "127.0.0.1",
            **(env or {}),
            **(skewed_clock(clock_skew_s) if clock_skew_s else {}),
        }

    def start(self, *, wait_synced: bool = True, timeout_s: float = 60) -> OperatorProcess:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "GPUSHARE_IDENTITY": self.identity,
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        argv = [
            sys.executable,
            *self.python_args,
            "-m",
            "gpushare_operator.main",
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
        ]
        self._spawn(argv, env)
        if wait_synced:
            self.wait_logged("synced", timeout_s=timeout_s)
        return self

    def probe(self) -> dict[str, Any] | None:
        """The operator's own liveness report, or None while it does not answer."""
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                report: dict[str, Any] = json.loads(answer.read())["gpushare"]
                return report
        except (urllib.error.URLError, OSError, KeyError, ValueError):
            return None

    def wait(self, condition: Any, *, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"operator exited with {self._process.returncode} before {what}:\n{self.tail()}"
                )
            report = self.probe()
            if report is not None and condition(report):
                return report
            time.sleep(0.2)
        raise TimeoutError(f"operator: no {what} within {timeout_s} s:\n{self.tail()}")


FAKETIME_LIBRARIES = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/faketime/libfaketime.so.1"),
)


def skewed_clock(seconds: int) -> dict[str, str]:
    """The environment that sets a process's wall clock `seconds` off (libfaketime)."""
    library = next((path for path in FAKETIME_LIBRARIES if path.exists()), None)
    if library is None:
        raise FileNotFoundError(
            "libfaketime is missing (apt-get install libfaketime, or `make node-packages`)"
        )
    return {
        "LD_PRELOAD": str(library),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
