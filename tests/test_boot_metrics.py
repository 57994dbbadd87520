"""podvm-gpu-metrics.service under a real PID 1: a qemu boot (TCG) of the test image with the
unit enabled and its whole sandbox in force (device policy, capability bounding set, read-only
system, system call filter).

What it proves: the exporter starts after the boot, serves on loopback, reads the kernel's own
records from the real ``/dev/kmsg`` (``DeviceAllow=/dev/kmsg``, and CAP_SYSLOG where the VM's
kernel has ``dmesg_restrict=1``, recorded; a program cannot write kernel records, so the count is
the evidence) and writes the textfile into ``/run/podvm-gpu`` under ``ProtectSystem=strict``.
The VM has no GPU: the boot ends ``no-gpu`` and NVML is not asked.

The unit is the product's, unchanged; the config (``metrics:`` in /etc/podvm-gpu/config.yaml)
also makes the boot write the textfile at its end.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from boot import checks, image
from boot.fixtures import installed, rootfs  # noqa: F401
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
OUT = "/var/lib/podvm-gpu-metrics-test"
FILES = tuple(f"{OUT}/{name}" for name in ("scrape.txt", "textfile.prom", "unit.txt", "journal.txt",
                                           "dmesg_restrict.txt"))


def enable_metrics(rootfs: Path) -> None:  # noqa: F811
    etc = rootfs / "etc/systemd/system"
    (etc / "multi-user.target.wants/podvm-gpu-metrics.service").symlink_to(
        "/usr/lib/systemd/system/podvm-gpu-metrics.service")
    (rootfs / "etc/podvm-gpu").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/podvm-gpu/config.yaml").write_text(
        "metrics: {listen: '127.0.0.1:9400', textfile: true, textfile_interval_s: 1}\n")
    image.install_file(HERE / "boot/metrics/scrape.py", rootfs, "/usr/local/libexec/scrape-metrics", 0o755)
    standin = etc / "kata-agent.service.d/60-scrape-metrics.conf"
    standin.parent.mkdir(parents=True, exist_ok=True)
    standin.write_text("[Unit]\nAfter=podvm-gpu-metrics.service\n[Service]\n"
                       "ExecStartPre=/usr/bin/python3 /usr/local/libexec/scrape-metrics\n"
                       "TimeoutStartSec=240\n")


def test_metrics_unit_serves_reads_the_real_kernel_log_and_writes_the_textfile_in_its_sandbox(rootfs, tmp_path):  # noqa: F811
    enable_metrics(rootfs)
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts", timeout_s=420, extra=FILES)
    record = checks.kata_agent_started_after_the_agent_finished(boot)
    assert record["status"]["state"] == "no-gpu"
    unit = boot.files.get(f"{OUT}/unit.txt", "")
    journal = boot.files.get(f"{OUT}/journal.txt", "")
    assert "ActiveState=active" in unit and "NRestarts=0" in unit, unit + journal
    scrape = {f.name: f for f in text_string_to_metric_families(boot.files[f"{OUT}/scrape.txt"])}
    records = scrape["podvm_gpu_kernel_log_records"].samples[0].value
    assert records > 100, "the exporter read the real kernel log in its sandbox"
    assert scrape["podvm_gpu_nvml_error_info"].samples[0].labels["reason"] == "no-gpu"
    textfile = {f.name: f for f in text_string_to_metric_families(boot.files[f"{OUT}/textfile.prom"])}
    assert textfile["podvm_gpu_boot_state"].samples[2].labels == {"state": "no-gpu"}
    assert textfile["podvm_gpu_boot_state"].samples[2].value == 1
    assert "Operation not permitted" not in journal and "Traceback" not in journal, journal
    restrict = boot.files[f"{OUT}/dmesg_restrict.txt"].strip()
    print(f"qemu boot with the metrics unit: {boot.wall_s:.1f} s, {records:.0f} kernel records "
          f"read, kernel.dmesg_restrict={restrict}")
