"""The benchmark suite's quick variant, end to end (loose bounds: a smoke test, not a timed
test): every benchmark runs, the report and the plots are written, the figures are sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare_harness import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def test_the_quick_benchmarks_run_and_report(tmp_path: Path, control_plane: ControlPlane) -> None:
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=840,
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["quick"] is True
    assert "cores" in report["machine"]
    for plot in ("packing.png", "operator.png", "plugin.png"):
        assert (out / plot).stat().st_size > 10_000
    packing = report["results"]["packing"][0]["results"]
    share = {(r["workload"], r["policy"]): r for r in packing}
    for workload in {r["workload"] for r in packing}:
        assert share[workload, "bestfit"]["of_bound"] >= 0.9
        assert (
            share[workload, "bestfit"]["mean_in_use"] >= share[workload, "firstfit"]["mean_in_use"]
        )
    versus = report["results"]["operator"][0]["results"]
    assert versus["raw"]["bound_per_s"] > 0
    for who in ("kube-scheduler-raised", "kube-scheduler-default", "operator"):
        assert versus[who]["backlog_bound_per_s"] > 0, who
        assert versus[who]["burst_create_to_bound_p99_ms"] < 60_000, who
        assert 0 < versus[who]["backlog_cpu_s_per_1000_pods"] < 100, who
    assert versus["operator"]["single_create_to_bound_p99_ms"] < 5_000
    for who in ("kube-scheduler-raised", "operator"):  # charged the same work per pod
        requests = versus[who]["server_requests_per_pod"]
        assert 1.0 <= requests["PATCH pods"] < 1.1, who
        assert requests["etcd update pods"] >= 2.0, who
        for window in ("backlog", "burst"):
            assert versus[who][f"{window}_server_cpu_s_per_1000_pods"] > 0, who
    for variant, cost in report["results"]["server_cost"][0]["results"].items():
        assert cost["apiserver_ms_per_write"] > 0, variant
        # One stored write each (give or take the apiserver's own Lease renewals meanwhile).
        assert abs(cost["etcd Txn per write"] - 1.0) < 0.05, variant
    judged = report["results"]["admission_cost"][0]["results"]
    gpu_pod, plain_pod = judged["gpu pod (labelled)"], judged["pod without GPUs"]
    assert plain_pod["request_us"] > 0
    # The placement policy's conversions: tens of times a step that judges nothing.
    assert gpu_pod["policy_step_us"] > 5 * plain_pod["policy_step_us"] > 0
    for ratios in versus["operator_vs_kube_scheduler_per_round"].values():
        assert len(ratios) == 2  # the quick plan's two rounds
        assert all(r > 0 for r in ratios)
    scale = report["results"]["scale"][0]["results"]
    assert scale["startup_to_synced_s"] < 120
    assert scale["rss_mib"] < 1024
    plugin = report["results"]["plugin"][0]["results"]
    assert plugin["allocate"]["pods_marked_assigned"] == plugin["allocate"]["pods_bound_to_node"]
    assert plugin["allocate"]["allocate_p99_ms"] < 1000
    assert all(row["bytes"] <= row["limit_bytes"] for row in plugin["list_and_watch"])
    placement = report["results"]["placement"][0]["results"]
    assert all(row["decisions_per_s"] > 0 for row in placement)
    for name, sweep in report["results"]["sweep"][0]["results"].items():
        assert sweep["sweep_ms"] > 0, name
        assert sweep["loop_held_ms"] > 0, name
    gangs = report["results"]["gangs"][0]["results"]
    assert gangs["gangs"]["bound_per_s"] > 0
    assert gangs["single"]["bound_per_s"] > 0
    for label, burst in report["results"]["burst"][0]["results"].items():
        assert burst["unplaced"]["live"] <= burst["unplaced"]["model"], label
        assert burst["cards_used"]["live"] <= burst["cards_used"]["model"], label
        assert burst["stranded_mib"]["live"] <= burst["stranded_mib"]["model"], label
        assert burst["shown_unschedulable"] == 0, label
        assert burst.get("env_not_annotation", 0) == 0, label
