"""The alert rules shipped in monitoring/ (issue 19): Debian's ``promtool check rules`` and
``promtool test rules`` on the shipped test file, and the rules run against what the exporter
really exports for healthy and broken worlds (no false alarm on a CPU VM, a fractional vGPU
or a healthy GPU VM; the right alerts on a broken one).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_nvml import describe, gpu, make_root, metrics_env
from prometheus_client.parser import text_string_to_metric_families

MONITORING = Path(__file__).resolve().parents[1] / "monitoring"
RULES = MONITORING / "podvm-gpu.rules.yml"
RULE_TESTS = MONITORING / "podvm-gpu.rules.test.yml"


def alert_names() -> list[str]:
    return [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule]


def promtool_run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_checks_the_rules(promtool):
    done = promtool_run(promtool, "check", "rules", str(RULES), cwd=MONITORING)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in done.stdout


def test_promtool_runs_the_shipped_rule_tests(promtool):
    done = promtool_run(promtool, "test", "rules", str(RULE_TESTS), cwd=MONITORING)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired, silent = set(), set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else silent).add(check["alertname"])
    assert set(alert_names()) <= fired
    assert set(alert_names()) <= silent


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def input_series(exposition: str, instance: str) -> list[dict]:
    """Every sample of a real scrape as a promtool input series, steady for 15 minutes, with
    the ``instance`` and ``job`` labels Prometheus adds."""
    out = []
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if math.isnan(s.value):
                continue
            labels = {**s.labels, "instance": instance, "job": "podvm"}
            selector = ", ".join(f"{k}={_quote(v)}" for k, v in sorted(labels.items()))
            out.append({"series": f"{s.name}{{{selector}}}", "values": f"{s.value:g}x15"})
    return out


def scrape(root: Path, desc: Path | None) -> str:
    done = subprocess.run([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(root)],
                          capture_output=True, text=True, timeout=120, env=metrics_env(desc))
    assert done.returncode == 0, done.stderr
    return done.stdout


def alerts_at_15m(promtool: str, tmp_path: Path, exposition: str) -> str:
    """Run the rules on the scrape's series; claim that nothing fires at 15 minutes. Returns
    promtool's output: empty of alert names when nothing fired, else the alerts that did."""
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": input_series(exposition, "vm"),
                       "alert_rule_test": [{"eval_time": "15m", "alertname": name, "exp_alerts": []}
                                           for name in alert_names()]}]}
    path = tmp_path / "real.test.yml"
    path.write_text(yaml.safe_dump(test))
    done = promtool_run(promtool, "test", "rules", str(path), cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == (0 if "SUCCESS" in output else 1), output
    return "" if done.returncode == 0 else output


def fired(output: str) -> set[str]:
    return set(re.findall(r"alertname: ?(\w+)", output))


def test_no_alert_on_a_cpu_vm_a_fractional_vgpu_or_a_healthy_gpu_vm(promtool, tmp_path, fake_nvml_libs):
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    booted = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(cpu)],
                            capture_output=True, text=True, timeout=60, env=metrics_env(None))
    assert booted.returncode == 0, booted.stderr
    worlds = {"cpu-vm": scrape(cpu, None)}
    lib = fake_nvml_libs["current"]
    done = {"fabric.state": 3, "fabric.status": 0}
    worlds["healthy"] = scrape(make_root(tmp_path / "ok", lib, gpus=2, nvswitches=2,
                                         running=("nv-fabricmanager",)),
                               describe(tmp_path / "d1", [gpu(0, **done), gpu(1, **done)]))
    vgpu = gpu(0, name="GRID A100-10C", **dict.fromkeys(("ecc.sbe_vol", "ecc.dbe_vol", "power_mw",
                                                           "remap.failure", "temp.slowdown")))
    worlds["vgpu"] = scrape(make_root(tmp_path / "vgpu", lib, gpus=1),
                            describe(tmp_path / "d2", [vgpu]))
    for name, exposition in worlds.items():
        assert "podvm_gpu_boot_state" in exposition
        assert fired(alerts_at_15m(promtool, tmp_path, exposition)) == set(), name


@pytest.mark.parametrize("world, expected", [
    ("fatal-xid-persistenced-gone", {"PodvmGpuFatalXid", "PodvmGpuDaemonDown", "PodvmGpuNvmlDown"}),
    ("gpu-lost", {"PodvmGpuLost"}),
    ("failed", {"PodvmGpuBootFailed"}),
    ("nvlink5-fabric-in-progress", {"PodvmGpuFabricNotCompleted", "PodvmGpuDaemonDown"}),
])
def test_the_alerts_fire_on_what_a_broken_world_really_exports(promtool, tmp_path, fake_nvml_libs,
                                                               world, expected):
    lib = fake_nvml_libs["current"]
    if world == "fatal-xid-persistenced-gone":
        root = make_root(tmp_path / "root", lib, gpus=1, persistenced=False, kernel_log=[
            "NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus."])
        desc = describe(tmp_path / "d", [gpu(0)])
    elif world == "gpu-lost":
        root = make_root(tmp_path / "root", lib, gpus=2)
        desc = describe(tmp_path / "d", [gpu(0), gpu(1, lost=1)])
    elif world == "nvlink5-fabric-in-progress":  # NVLSM died after a ready boot
        root = make_root(tmp_path / "root", lib, gpus=2, fabric="nvlink5",
                         running=("nv-fabricmanager",))
        desc = describe(tmp_path / "d", [gpu(0, **{"fabric.state": 2}),
                                         gpu(1, **{"fabric.state": 3, "fabric.status": 0})])
    else:
        root = make_root(tmp_path / "root", lib, state="failed", reason="modules: nvidia: no such module")
        desc = None
    assert fired(alerts_at_15m(promtool, tmp_path, scrape(root, desc))) == expected
