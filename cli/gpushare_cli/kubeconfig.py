"""Which cluster the CLI talks to, found as kubectl finds it: `--kubeconfig` (that file only),
else `$KUBECONFIG` (a list of files, merged; those that do not exist or are empty are
skipped; the first file naming a current context gives it), else
`~/.kube/config`; the in-cluster service account only when none of those exists. When nothing
works, or a file is not a kubeconfig, one error says which and how to fix it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.config import ConfigException, list_kube_config_contexts

from gpushare import kube
from gpushare_cli.errors import CliError, yaml_problem

COMPONENT = "kubectl-gpushare"
"""Its user agent: the apiserver's audit log names it so."""

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where a pod's service account token and namespace are mounted."""

FIX = "pass --kubeconfig FILE or set KUBECONFIG to the file kubectl uses"
"""What to do when no kubeconfig is found."""

MALFORMED = "correct it, or name another file with --kubeconfig or KUBECONFIG"
"""What to do about a file that is not a kubeconfig."""

_ENTRIES = {"clusters": "cluster", "contexts": "context", "users": "user"}
"""A kubeconfig's lists, and the mapping each of their entries holds."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    """The kubeconfig files to read, merged as kubectl merges them; none: the in-cluster
    service account."""

    files: tuple[Path, ...]
    context: str | None = None
    service_account: Path = SERVICE_ACCOUNT

    @property
    def in_cluster(self) -> bool:
        return not self.files

    def describe(self) -> str:
        if self.in_cluster:
            return f"the in-cluster service account ({self.service_account})"
        return "the kubeconfig " + ", ".join(map(str, self.files))


def find(
    flag: Path | None,
    context: str | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    home: Path | None = None,
    service_account: Path = SERVICE_ACCOUNT,
) -> Source:
    """The kubeconfig as kubectl picks it; CliError when there is none, or when a file it
    would read is not a kubeconfig."""
    if flag is not None:
        if not flag.is_file():
            raise CliError(f"--kubeconfig {flag}: no such file", status=2)
        if _load(flag) is None:
            raise CliError(f"the kubeconfig {flag} is empty; {FIX}", status=2)
        return Source(files=(flag,), context=context)
    tried = []
    listed = [Path(p).expanduser() for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        loaded = {file: _load(file) for file in listed if file.is_file()}
        present = {file: body for file, body in loaded.items() if body is not None}
        if present:
            return Source(files=tuple(present), context=context or _current_context(present))
        skipped = (f"{file}: {'empty' if file in loaded else 'no such file'}" for file in listed)
        tried.append(f"$KUBECONFIG ({', '.join(skipped)})")
    else:
        default = (home or Path.home()) / ".kube" / "config"
        if default.is_file() and _load(default) is not None:
            return Source(files=(default,), context=context)
        missing = "empty" if default.is_file() else "no such file"
        tried.append(f"{default} ({missing}; $KUBECONFIG is not set)")
    token = service_account / "token"
    if not environ.get("KUBERNETES_SERVICE_HOST") or not environ.get("KUBERNETES_SERVICE_PORT"):
        tried.append("the in-cluster service account (not in a pod: KUBERNETES_SERVICE_HOST unset)")
    elif not token.is_file():
        tried.append(f"the in-cluster service account (no token at {token})")
    elif context is not None:
        raise CliError(
            f"--context {context}: no kubeconfig to find it in ({'; '.join(tried)}); {FIX}",
            status=2,
        )
    else:
        return Source(files=(), service_account=service_account)
    raise CliError(f"no cluster to talk to: tried {'; '.join(tried)}; {FIX}")


def _load(file: Path) -> dict[str, Any] | None:
    """The kubeconfig in `file`; None when it is empty (kubectl reads nothing from it).
    CliError naming the file when it is not a kubeconfig: the client library would fail on
    it with a TypeError rather than say so."""
    where = f"the kubeconfig {file}"
    try:
        loaded = yaml.safe_load(file.read_text())
    except OSError as error:
        raise CliError(f"cannot read {where}: {error.strerror}; {MALFORMED}", status=2) from error
    except yaml.YAMLError as error:
        raise CliError(
            f"{where} is not valid YAML ({yaml_problem(error)}); {MALFORMED}", status=2
        ) from error
    if loaded is None:
        return None
    if not isinstance(loaded, dict):
        shown = "a list" if isinstance(loaded, list) else f"a plain value ({loaded!r})"
        raise CliError(f"{where} is {shown} where a Config mapping belongs; {MALFORMED}", status=2)
    for key, entry in _ENTRIES.items():
        listed = loaded.get(key) or []
        if not isinstance(listed, list) or not all(isinstance(item, dict) for item in listed):
            raise CliError(f"{where}: {key} must be a list of mappings; {MALFORMED}", status=2)
        for at, item in enumerate(listed):
            if not isinstance(item.get(entry, {}), dict):
                raise CliError(
                    f"{where}: {key}[{at}].{entry} must be a mapping; {MALFORMED}", status=2
                )
    return loaded


def context_namespace(source: Source) -> str:
    """The namespace of the kubeconfig's context (`--context`, else the current one), as
    kubectl takes it; in a pod, its service account's; "default" when it names none."""
    if source.in_cluster:
        try:
            return (source.service_account / "namespace").read_text().strip() or "default"
        except OSError:
            return "default"
    try:
        contexts, current = list_kube_config_contexts(_joined(source))
    except (ConfigException, OSError):
        return "default"
    wanted = (
        current
        if source.context is None
        else next((c for c in contexts if c.get("name") == source.context), None)
    )
    if source.context is not None and wanted is None:
        names = ", ".join(sorted(str(c.get("name")) for c in contexts))
        raise CliError(
            f"context {source.context!r} is not in the kubeconfig (it has: {names})", status=2
        )
    found = ((wanted or {}).get("context") or {}).get("namespace")
    return str(found) if found else "default"


async def connect(source: Source) -> client.ApiClient:
    """A client for `source` (closed by the caller, `async with`); CliError when the
    kubeconfig cannot be used."""
    try:
        if source.in_cluster:
            return await kube.api_client(user_agent=COMPONENT)  # the service account first
        # The client merges a list of files given as one string, as $KUBECONFIG holds it.
        return await kube.api_client(
            Path(_joined(source)), context=source.context, user_agent=COMPONENT
        )
    except ConfigException as error:
        raise CliError(
            f"cannot use {source.describe()}: {error}; name a context with --context, or "
            f"set one with `kubectl config use-context`"
        ) from error


def _current_context(loaded: Mapping[Path, Mapping[str, Any]]) -> str | None:
    """kubectl's current context of merged files: the first file's that names one (the
    client library would take the last's)."""
    if len(loaded) < 2:  # one file needs no merging
        return None
    for body in loaded.values():
        if body.get("current-context"):
            return str(body["current-context"])
    return None


def _joined(source: Source) -> str:
    return os.pathsep.join(map(str, source.files))
