"""A real systemd boot (nspawn) orders guest-components' attestation-agent after the agent.

The image is the one tests/test_boot_nspawn.py boots (installed by the product's installer,
which ships the attestation-agent drop-in), with a stand-in attestation-agent.service ordered
only as cloud-api-adaptor orders the real one, and the GPU path's fake NVIDIA world. The
stand-in records, at its start, what the real attestation-agent would find: it must start only
after podvm-gpu.service finished, when the status is final and nvidia-persistenced (the first
NVML client) runs. The kata-agent stand-in, which powers the container off, is ordered after
it by a test-only drop-in, so the record is always written before the power-off.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from boot import checks, image
from boot.fixtures import SPEC_TEMPLATE, installed, rootfs  # noqa: F401
from boot.gpu import world

pytestmark = pytest.mark.slow

RECORD = "var/lib/attestation-agent-standin/record.json"


def install_attestation_agent_standin(root) -> None:
    image.install_file(image.HERE / "units/attestation-agent.service", root,
                       "/etc/systemd/system/attestation-agent.service")
    image.install_file(image.HERE / "attestation-agent-standin.py", root,
                       "/usr/local/libexec/attestation-agent-standin", 0o755)
    wants = root / "etc/systemd/system/multi-user.target.wants/attestation-agent.service"
    wants.symlink_to("/etc/systemd/system/attestation-agent.service")
    for unit, text in (
            ("attestation-agent.service", "[Service]\nEnvironment=PODVM_GPU_ROOT=/srv/gpu/root\n"),
            ("kata-agent.service", "[Unit]\nAfter=attestation-agent.service\n")):
        dropin = root / f"etc/systemd/system/{unit}.d/70-test.conf"
        dropin.parent.mkdir(parents=True, exist_ok=True)
        dropin.write_text(text)


def test_the_installer_ships_the_attestation_agent_drop_in(installed):  # noqa: F811
    dropin = installed / "usr/lib/systemd/system/attestation-agent.service.d/10-podvm-gpu.conf"
    assert "After=podvm-gpu.service" in dropin.read_text()
    assert "Before=kata-agent.service attestation-agent.service" in \
        (installed / "usr/lib/systemd/system/podvm-gpu.service").read_text()


def test_attestation_agent_starts_after_the_agent_with_persistenced_running(rootfs, tmp_path):  # noqa: F811
    world.populate(rootfs, SPEC_TEMPLATE)
    install_attestation_agent_standin(rootfs)
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", "--image", "--root",
                           str(rootfs), "--json"], capture_output=True, text=True, timeout=120)
    rows = {row["name"]: row for row in json.loads(done.stdout)["checks"]}
    assert rows["attestation-agent-ordering"]["result"] == "pass", rows["attestation-agent-ordering"]

    boot = image.boot(rootfs, tmp_path / "artifacts")

    checks.kata_agent_started_after_the_agent_finished(boot)
    record = json.loads((rootfs / RECORD).read_text())
    agent, standin = record["agent_unit"], record["standin_unit"]
    assert (agent["ActiveState"], agent["SubState"], agent["Result"]) == ("active", "exited", "success"), agent
    agent_exited = int(agent["ExecMainExitTimestampMonotonic"])
    standin_started = int(standin["InactiveExitTimestampMonotonic"])
    assert 0 < agent_exited <= standin_started, (agent, standin)
    assert record["status"]["state"] == "ready" and record["status"]["finished_at"], record["status"]
    assert record["spec_present"] and record["persistenced_alive"], record
    print(f"nspawn attestation-agent order: boot {boot.wall_s:.2f} s; the stand-in started "
          f"{(standin_started - agent_exited) / 1e3:.1f} ms after the agent's unit finished")
