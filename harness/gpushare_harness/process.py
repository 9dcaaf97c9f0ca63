"""A child process with a JSON-lines log, as the harness runs the operator, the device plugin
and the kubelet device-manager harness: started, waited on by log line, stopped with SIGTERM
or killed with SIGKILL like a crash. A restarted process appends to the same log."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpushare_harness.controlplane import dying_with_parent


class LoggedProcess:
    name = "process"
    clock_skew_s = 0
    """How far ahead the process's wall clock runs, and the times in its log."""

    def __init__(self, log: Path, *, detached: bool = False) -> None:
        """`detached`: the process outlives this one (the demo leaves it running; stop it by
        its pid's process group), else it dies with its parent (tests): with the thread that
        started it, so start it from one that lives as long as it should (not a worker
        thread of `asyncio.to_thread`)."""
        self.log = log
        self.detached = detached
        self._process: subprocess.Popen[bytes] | None = None
        self.log_start = 0

    def _spawn(
        self, argv: Sequence[str], env: dict[str, str], *, stderr: Path | None = None
    ) -> None:
        self.log_start = len(self.log_events())
        with self.log.open("ab") as out, contextlib.ExitStack() as stack:
            err = stack.enter_context(stderr.open("ab")) if stderr else subprocess.STDOUT
            self._process = subprocess.Popen(
                list(argv) if self.detached else dying_with_parent(argv),
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=self.detached,
            )

    def wait_logged(
        self,
        event: str | tuple[str, ...],
        *,
        timeout_s: float,
        after: int | None = None,
        match: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """The first log line whose `event` is `event` (or one of them) and that `match`
        accepts, from line `after` on (default: since the last start)."""
        events = (event,) if isinstance(event, str) else event
        first = self.log_start if after is None else after
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log_events()[first:]:
                if line.get("event") in events and (match is None or match(line)):
                    return line
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self._process.returncode} before "
                    f"logging {event}:\n{self.tail()}"
                )
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: no {event} within {timeout_s} s:\n{self.tail()}")

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def wait_exit(self, timeout_s: float = 30) -> int:
        """The exit status once the process ends by itself."""
        assert self._process is not None, "not started"
        return self._process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to clean up."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def stop(self, timeout_s: float = 20) -> int | None:
        """SIGTERM and wait: a clean shutdown; its exit status."""
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
        """The JSON lines of the log, in order (other lines skipped)."""
        found = []
        with contextlib.suppress(OSError):
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        found.append(json.loads(line))
        return found
