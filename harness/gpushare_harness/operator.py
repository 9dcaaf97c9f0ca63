"""The operator as a real process (`python -m gpushare_operator.main`), for tests, the demo
and benchmarks: started against a kubeconfig, probed through its liveness endpoint, stopped
with SIGTERM or killed with SIGKILL like a crashed replica."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpushare_harness.controlplane import die_with_parent, free_port


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        *,
        identity: str = "op-1",
        env: dict[str, str] | None = None,
        profile: Path | None = None,
    ) -> None:
        """`profile`: write a cProfile of the operator's main thread there (benchmarks)."""
        self.kubeconfig = kubeconfig
        self.python_args = ["-m", "cProfile", "-o", str(profile)] if profile else []
        self.log = log
        self.identity = identity
        self.liveness_port = free_port()
        self.env = {
            "GPUSHARE_METRICS_PORT": "0",
            "GPUSHARE_LEASE_DURATION": "4",
            "GPUSHARE_RENEW_DEADLINE": "3",
            "GPUSHARE_RETRY_PERIOD": "0.5",
            "GPUSHARE_STATUS_INTERVAL": "0.5",
            **(env or {}),
        }
        self._process: subprocess.Popen[bytes] | None = None
        self.log_start = 0

    def start(self, *, wait_synced: bool = True, timeout_s: float = 60) -> OperatorProcess:
        self.log_start = len(self.log_events())  # a restarted process appends to the log
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "GPUSHARE_IDENTITY": self.identity,
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    *self.python_args,
                    "-m",
                    "gpushare_operator.main",
                    "--liveness",
                    f"http://127.0.0.1:{self.liveness_port}/healthz",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
        if wait_synced:
            self.wait_logged("synced", timeout_s=timeout_s, after=self.log_start)
        return self

    def wait_logged(self, event: str, *, timeout_s: float, after: int = 0) -> dict[str, Any]:
        """The first log line with `event` (from line `after` on). The log, not the liveness
        probe: kopf caches probe results for 10 s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log_events()[after:]:
                if line.get("event") == event:
                    return line
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"operator exited with {self._process.returncode} before "
                    f"logging {event}:\n{self.tail()}"
                )
            time.sleep(0.1)
        raise TimeoutError(f"operator: no {event} within {timeout_s} s:\n{self.tail()}")

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

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to release the Lease."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def stop(self, timeout_s: float = 20) -> int | None:
        """SIGTERM and wait: a clean shutdown."""
        if self._process is None:
            return None
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        return self._process.returncode

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def log_events(self) -> list[dict[str, Any]]:
        """The operator's structlog lines (JSON), in order."""
        found = []
        with contextlib.suppress(OSError):
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        found.append(json.loads(line))
        return found
