"""Assertions on a boot (tests/boot/image.py ``Boot``), shared by the nspawn and qemu boot tests."""

from __future__ import annotations

import yaml
from boot.image import Boot
from schemas import assert_status_conforms


def _what_the_agent_said(record: dict) -> str:
    """The boot's own account for an assertion message: its state, reason and each step's
    result and duration (a failure in CI must name its step, not only the unit's exit)."""
    status = record.get("status") or {}
    steps = [f"{s.get('name')} {s.get('result')} {s.get('duration_s')} s: {s.get('message')}"
             for s in status.get("steps") or []]
    return "\n".join([f"state {status.get('state')}: {status.get('reason')}",
                      f"warnings {status.get('warnings')}", *steps])


def kata_agent_started_after_the_agent_finished(boot: Boot, failed: bool = False,
                                                result: str = "exit-code") -> dict:
    """The ordering and the clean state every boot must show; returns the stand-in's record.

    A boot that ends ``failed`` leaves podvm-gpu.service failed (exit 1: ``systemctl --failed``
    shows it), and kata-agent still starts after it (its drop-in has Wants=, not Requires=).
    ``result`` is the failed unit's Result (``timeout`` when TimeoutStartSec= stopped it).
    """
    assert boot.returncode == 0, f"boot exit {boot.returncode}:\n{boot.console[-4000:]}"
    record = boot.record
    assert record is not None, f"the kata-agent stand-in never ran:\n{boot.console[-4000:]}"
    agent = record["agent_unit"]
    expected = ("failed", "failed", result, "1") if failed else ("active", "exited", "success", "0")
    assert (agent["ActiveState"], agent["SubState"], agent["Result"], agent["ExecMainStatus"]) == expected, (
        agent, _what_the_agent_said(record))
    agent_exited = int(agent["ExecMainExitTimestampMonotonic"])
    standin_started = int(record["standin_unit"]["InactiveExitTimestampMonotonic"])
    assert 0 < agent_exited <= standin_started, (agent, record["standin_unit"])
    assert record["status"]["finished_at"] is not None
    assert_status_conforms(record["status"])  # the document a real systemd boot left
    assert record["cdi_dir"] == ["nvidia.yaml"], "no temporary or second spec file beside the final one"
    systemd_says = [e["MESSAGE"] for e in boot.agent_journal if e.get("UNIT") == "podvm-gpu.service"]
    if not failed:
        assert [m.split()[0] for m in systemd_says] == ["Starting", "Finished"], (
            f"systemd has more to say about the unit than start and finish: {systemd_says}")
    assert not [m for m in systemd_says if "Killing process" in m or "left-over process" in m], (
        f"systemd killed something of the agent's unit: {systemd_says}")
    assert "nvidia-cdi-refresh" not in boot.journal
    assert not record["nvidia_units_ran"], "the installer leaves no distro or toolkit unit to race the agent"
    return record


def saw_the_unavailable_spec(record: dict) -> None:
    assert record["status"]["state"] == "no-gpu", record["status"]
    spec = yaml.safe_load(record["spec"])
    assert spec["kind"] == "nvidia.com/gpu"
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert "PODVM_GPU_STATE=no-gpu" in spec["devices"][0]["containerEdits"]["env"]


def saw_the_failed_boot_and_its_unavailable_spec(record: dict, *reason_words: str) -> None:
    status = record["status"]
    assert status["state"] == "failed", status
    assert all(w in status["reason"] for w in reason_words), status["reason"]
    spec = yaml.safe_load(record["spec"])
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert "PODVM_GPU_STATE=failed" in spec["devices"][0]["containerEdits"]["env"]


def persistenced_lived_in_its_own_unit_until_power_off(boot: Boot, record: dict, events: str) -> None:
    """The daemon the agent started was alive when kata-agent started, in its own unit, and
    systemd stopped it with SIGTERM at power-off (the fake says so in /srv/gpu)."""
    daemon = record["persistenced"]
    assert daemon and daemon["alive"], daemon
    assert "/system.slice/podvm-gpu-persistenced.service" in daemon["cgroup"], daemon
    lines = [line for line in events.splitlines() if not line.startswith("auto_online_blocks")]
    assert lines == [f"started {daemon['pid']}", f"SIGTERM {daemon['pid']}"], lines
    assert record["persistenced_unit"]["ActiveState"] == "active", record["persistenced_unit"]


def persistenced_outlived_the_boot(boot: Boot, outcome: str) -> None:
    """kata-agent started after a ``ready`` or a ``failed`` boot (``cdi generate`` failing after
    persistenced started) and found the daemon alive in its own unit, which systemd stopped at
    power-off."""
    record = kata_agent_started_after_the_agent_finished(boot, failed=outcome == "failed")
    if outcome == "failed":
        saw_the_failed_boot_and_its_unavailable_spec(
            record, "cdi: nvidia-ctk cdi generate failed (exit 1)", "ERROR_LIBRARY_NOT_FOUND")
    else:
        saw_a_ready_spec_with_persistenced_running(boot, record)
    persistenced_lived_in_its_own_unit_until_power_off(
        boot, record, boot.files.get("/srv/gpu/persistenced-events.log", ""))


def saw_a_ready_spec_with_persistenced_running(boot: Boot, record: dict) -> None:
    assert record["root"] == "/srv/gpu/root"
    assert record["status"]["state"] == "ready", (record["status"], boot.calls)
    spec = yaml.safe_load(record["spec"])
    assert {"0", "all"} <= {d["name"] for d in spec["devices"]}
    nodes = [n["hostPath"] for n in spec["containerEdits"]["deviceNodes"]]
    assert "/srv/gpu/root/dev/nvidia-uvm" in nodes, "nvidia-ctk got the agent's root as dev root"
    # nvidia-persistenced, started by the agent, lives in a unit of its own (systemd-run)
    daemon = record["persistenced"]
    assert daemon and daemon["alive"], daemon
    assert "/system.slice/podvm-gpu-persistenced.service" in daemon["cgroup"], daemon
    tools = [call[0] for call in boot.calls]
    first_nvml_client = min(i for i, call in enumerate(boot.calls)
                            if call[0] == "nvidia-smi" or call[:3] == ["nvidia-ctk", "cdi", "generate"])
    assert tools.index("nvidia-persistenced") < first_nvml_client, boot.calls
