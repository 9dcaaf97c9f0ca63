"""A scripted apiserver for the CLI's reads: each path answers what a real apiserver answers
a user with the rights the test gives (403 where RBAC refuses), with no socket: the client's
REST layer is replaced (`tests/unit/cli/conftest.py`, fixture `apiserver`)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlparse


class Answer:
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.headers: dict[str, str] = {}
        self._body = json.dumps(body).encode()

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self._body


def forbidden(what: str) -> tuple[int, Any]:
    return 403, {
        "kind": "Status",
        "status": "Failure",
        "reason": "Forbidden",
        "code": 403,
        "message": f'{what} is forbidden: User "system:serviceaccount:team-a:dev" cannot list',
    }


def listing(*items: dict[str, Any]) -> tuple[int, Any]:
    return 200, {"metadata": {"resourceVersion": "1"}, "items": list(items)}


class Apiserver:
    """Answers by path (what is not scripted is a 404, as a missing CRD or object is); a path
    given a list of answers gives them in turn, the last one from then on. Every request is
    recorded as `METHOD path` in `calls`, and its path in `asked`."""

    def __init__(self) -> None:
        self.paths: dict[str, list[tuple[int, Any]]] = {}
        self.asked: list[str] = []
        self.calls: list[str] = []

    def __setitem__(self, path: str, answer: tuple[int, Any] | list[tuple[int, Any]]) -> None:
        self.paths[path] = list(answer) if isinstance(answer, list) else [answer]

    async def request(self, method: str, url: str, **_: Any) -> Answer:
        path = urlparse(url).path
        self.asked.append(path)
        self.calls.append(f"{method} {path}")
        answers = self.paths.get(
            path, [(404, {"kind": "Status", "code": 404, "message": "not found"})]
        )
        status, body = answers.pop(0) if len(answers) > 1 else answers[0]
        return Answer(status, body)
