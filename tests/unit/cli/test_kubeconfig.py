"""The CLI finds its cluster as kubectl does: --kubeconfig, else $KUBECONFIG (its files
merged, missing ones skipped), else ~/.kube/config, and the pod's service account only when
none of those exists; with nothing, one line says what was tried and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpushare_cli.errors import CliError
from gpushare_cli.kubeconfig import Source, context_namespace, find
from gpushare_cli.main import main


def kubeconfig(at: Path, namespace: str | None = None, context: str = "dev") -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    ctx = {"cluster": "c", "user": "u"} | ({"namespace": namespace} if namespace else {})
    at.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": context, "context": ctx}],
                "current-context": context,
            }
        )
    )
    return at


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home with no kubeconfig, no $KUBECONFIG, and not in a pod."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for variable in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path / "home"


def service_account(tmp_path: Path, namespace: str = "ml") -> Path:
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "token").write_text("t")
    (folder / "namespace").write_text(namespace)
    return folder


IN_A_POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_the_kubeconfig_flag_wins_over_KUBECONFIG_and_the_home_kubeconfig(
    home: Path, tmp_path: Path
) -> None:
    flag = kubeconfig(tmp_path / "flag")
    listed = kubeconfig(tmp_path / "listed")
    kubeconfig(home / ".kube" / "config")
    found = find(flag, environ={"KUBECONFIG": str(listed), **IN_A_POD}, home=home)
    assert found.files == (flag,)


def test_KUBECONFIG_wins_over_the_home_kubeconfig_and_its_missing_files_are_skipped(
    home: Path, tmp_path: Path
) -> None:
    kubeconfig(home / ".kube" / "config")
    first, second = kubeconfig(tmp_path / "a"), kubeconfig(tmp_path / "b")
    listed = f"{tmp_path / 'missing'}:{first}:{second}"
    assert find(None, environ={"KUBECONFIG": listed}, home=home).files == (first, second)


def test_the_home_kubeconfig_when_KUBECONFIG_is_unset_or_empty(home: Path) -> None:
    default = kubeconfig(home / ".kube" / "config")
    assert find(None, environ={}, home=home).files == (default,)
    assert find(None, environ={"KUBECONFIG": ""}, home=home).files == (default,)


def test_the_service_account_only_when_no_kubeconfig_exists(home: Path, tmp_path: Path) -> None:
    account = service_account(tmp_path)
    found = find(None, environ=IN_A_POD, home=home, service_account=account)
    assert found.in_cluster
    assert context_namespace(found) == "ml"  # the pod's own namespace, as kubectl takes it
    kubeconfig(home / ".kube" / "config")
    assert not find(None, environ=IN_A_POD, home=home, service_account=account).in_cluster


def test_with_no_kubeconfig_and_not_in_a_pod_one_line_says_what_was_tried_and_the_fix(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect"]) == 1
    shown = capsys.readouterr()
    assert shown.out == ""
    assert shown.err == (
        f"gpushare: no cluster to talk to: tried {home}/.kube/config (no such file; "
        "$KUBECONFIG is not set); the in-cluster service account (not in a pod: "
        "KUBERNETES_SERVICE_HOST unset); pass --kubeconfig FILE or set KUBECONFIG to the file "
        "kubectl uses\n"
    )


def test_a_KUBECONFIG_of_missing_files_is_named_in_the_error(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "gone"))
    with pytest.raises(CliError) as refused:
        find(None)
    assert f"tried $KUBECONFIG ({tmp_path / 'gone'}: no such file)" in str(refused.value)


def test_a_kubeconfig_flag_naming_no_file_is_a_bad_argument(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--kubeconfig", str(tmp_path / "nope"), "inspect"]) == 2
    assert capsys.readouterr().err == f"gpushare: --kubeconfig {tmp_path / 'nope'}: no such file\n"


def test_the_namespace_is_the_contexts_across_merged_files(home: Path, tmp_path: Path) -> None:
    first = kubeconfig(tmp_path / "a", namespace="team-a", context="a")
    second = kubeconfig(tmp_path / "b", namespace="team-b", context="b")
    merged = find(None, environ={"KUBECONFIG": f"{first}:{second}"}, home=home)
    assert context_namespace(merged) == "team-a"  # as kubectl: the first current-context
    assert context_namespace(Source(files=(first, second), context="b")) == "team-b"
    with pytest.raises(CliError, match="context 'c' is not in the kubeconfig"):
        context_namespace(Source(files=(first,), context="c"))


@pytest.mark.parametrize(
    ("written", "wrong"),
    [
        ("", " is empty"),
        ("# only a comment\n", " is empty"),
        ("- a\n", " is a list where a Config mapping belongs"),
        ("just text\n", " is a plain value ('just text') where a Config mapping belongs"),
        ("a: [\n", " is not valid YAML (expected the node content, but found '<stream end>' "),
        ("clusters: 1\n", ": clusters must be a list of mappings"),
        ("contexts: [{name: c, context: here}]\n", ": contexts[0].context must be a mapping"),
    ],
)
def test_a_malformed_kubeconfig_is_one_line_naming_the_file_and_what_is_wrong(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], written: str, wrong: str
) -> None:
    bad = tmp_path / "config"
    bad.write_text(written)
    assert main(["--kubeconfig", str(bad), "inspect"]) == 2
    shown = capsys.readouterr()
    assert shown.out == ""
    assert shown.err.startswith(f"gpushare: the kubeconfig {bad}{wrong}")
    assert shown.err.count("\n") == 1


def test_an_empty_file_in_KUBECONFIG_is_skipped_as_kubectl_skips_it(
    home: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    listed = kubeconfig(tmp_path / "listed", namespace="team-a")
    found = find(None, environ={"KUBECONFIG": f"{empty}:{listed}"}, home=home)
    assert found.files == (listed,)
    assert context_namespace(found) == "team-a"
    with pytest.raises(CliError, match=rf"tried \$KUBECONFIG \({empty}: empty\)"):
        find(None, environ={"KUBECONFIG": str(empty)}, home=home)


def test_a_malformed_file_in_KUBECONFIG_is_named_though_others_are_good(
    home: Path, tmp_path: Path
) -> None:
    listed = kubeconfig(tmp_path / "listed")
    bad = tmp_path / "bad"
    bad.write_text("- a\n")
    with pytest.raises(CliError, match=f"the kubeconfig {bad} is a list") as refused:
        find(None, environ={"KUBECONFIG": f"{listed}:{bad}"}, home=home)
    assert refused.value.status == 2
