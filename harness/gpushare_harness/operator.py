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
    ) -> None:
        """`profile`: write a cProfile of the operator's main thread there (benchmarks).
        `webhook_port`: serve the admission webhook on 127.0.0.1 at that port (every
        operator of one cluster the same: SO_REUSEPORT shares it, as a Service would); 0, none
        (pods are then not converted: install no admission objects)."""
        super().__init__(log, detached=detached)
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
