"""Real systemd boots of a pod VM image with podvm-gpu installed, in systemd-nspawn.

The image is a Debian minbase rootfs with the agent installed the way image builds install it
(tests/boot/image.py) and a stand-in kata-agent.service that records, at the moment it starts,
what kata-agent would find, then powers the container off. The tests prove the ordering of the
real units: kata-agent starts only after podvm-gpu.service has finished, and finds the final
CDI spec. The CPU path runs the unit unmodified on this GPU-less machine; the GPU path adds a
drop-in that runs the agent under umockdev with fake NVIDIA tools (tests/boot/gpu/).
test_boot_qemu.py boots the same image as a VM. A stand-in attestation-agent.service (ordered
only as cloud-api-adaptor orders the real one) records what it finds at its start: it must start
after the agent finished, with the status final and nvidia-persistenced running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from boot import checks, image
from boot.fixtures import SPEC_TEMPLATE, host_has_nvidia_pci_device, installed, rootfs  # noqa: F401
from boot.gpu import world

pytestmark = pytest.mark.slow


def test_installer_enables_the_agent_masks_cdi_refresh_and_disables_the_distro_daemon(installed):  # noqa: F811
    etc = installed / "etc/systemd/system"
    wants = etc / "multi-user.target.wants"
    assert (wants / "podvm-gpu.service").is_symlink()
    assert (wants / "podvm-gpu-watch.service").is_symlink()  # issue 34
    for unit in ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service"):
        assert os.readlink(etc / unit) == "/dev/null", unit
        assert not (wants / unit).exists(), unit
    assert not (wants / "nvidia-persistenced.service").is_symlink()
    assert os.readlink(installed / "usr/local/bin/podvm-gpu") == "/opt/podvm-gpu/bin/podvm-gpu"
    assert (installed / "usr/lib/systemd/system/kata-agent.service.d/10-podvm-gpu.conf").is_file()
    assert (installed / "usr/lib/systemd/system-preset/40-podvm-gpu.preset").is_file()


def test_cpu_vm_kata_agent_starts_after_the_agent_and_sees_the_unavailable_spec(rootfs, tmp_path):  # noqa: F811
    if host_has_nvidia_pci_device():
        pytest.fail("this host has an NVIDIA PCI device: the CPU path test needs a GPU-less host")
    boot = image.boot(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_the_unavailable_spec(record)
    agent_s = boot.agent_time_s()
    print(f"nspawn CPU path: boot {boot.wall_s:.2f} s, agent {agent_s:.3f} s (journal)")
    assert agent_s < 5, "the CPU path must not hold up kata-agent"


def test_gpu_vm_kata_agent_starts_after_the_agent_and_sees_a_ready_spec(rootfs, tmp_path):  # noqa: F811
    world.populate(rootfs, SPEC_TEMPLATE)
    boot = image.boot(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_a_ready_spec_with_persistenced_running(boot, record)
    print(f"nspawn GPU path: boot {boot.wall_s:.2f} s, agent {boot.agent_time_s():.3f} s (journal)")


def test_a_tdx_guest_attests_in_a_unit_of_its_own_with_network_and_the_agent_keeps_its_sandbox(
        rootfs, tmp_path):  # noqa: F811
    """Issue 26 under a real systemd: a TDX guest (the CPU flag) with a CC GPU and the default
    config: the nvattest stand-in runs in a transient unit of its own that may open IPv4
    sockets, the agent's own unit still may not, and the ready state is set only after it."""
    import json

    home = world.populate(rootfs, SPEC_TEMPLATE, attested=True)
    boot = image.boot(rootfs, tmp_path / "artifacts")

    status = (boot.record or {}).get("status") or {}
    assert status.get("state") == "ready", (status.get("attestation"), boot.console[-3000:])
    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_a_ready_spec_with_persistenced_running(boot, record)
    runs = [json.loads(line) for line in (home / "nvattest.log").read_text().splitlines()]
    attest = [r for r in runs if "attest" in r["argv"]]
    assert len(attest) == 1, runs
    assert attest[0]["cgroup"].endswith(".service") and \
        "/podvm-gpu-nvattest-gpu-" in attest[0]["cgroup"], attest[0]
    assert attest[0]["inet"] is True
    assert (home / "agent-inet").read_text().startswith("refused"), "the agent's sandbox"
    assert status["attestation"]["result"] == "passed", status["attestation"]
    assert status["attestation"]["runs"][0]["where"].startswith("unit podvm-gpu-nvattest-gpu-")
    calls = [json.loads(line) for line in (home / "calls.log").read_text().splitlines()]
    srs = calls.index(["nvidia-smi", "conf-compute", "-srs", "1"])
    assert attest[0]["time"] < (home / "cc-ready").stat().st_mtime, "-srs 1 after attestation"
    assert srs > 0
    print(f"nspawn attested boot: boot {boot.wall_s:.2f} s, agent {boot.agent_time_s():.3f} s, "
          f"attestation {status['attestation']['duration_s']:.3f} s")


def test_kata_agents_drop_in_alone_pulls_in_and_orders_the_agent(rootfs, tmp_path):  # noqa: F811
    """An image whose own units never mention podvm-gpu.service: neither enabled nor ordered
    before kata-agent. kata-agent's drop-in (Wants= + After=) must still start the agent first."""
    (rootfs / "etc/systemd/system/multi-user.target.wants/podvm-gpu.service").unlink()
    unit = (rootfs / "usr/lib/systemd/system/podvm-gpu.service").read_text()
    before = re.search(r"^Before=(.*)$", unit, re.M)  # also attestation-agent.service (issue 25)
    assert before and "kata-agent.service" in before.group(1).split(), unit
    others = " ".join(w for w in before.group(1).split() if w != "kata-agent.service")
    (rootfs / "etc/systemd/system/podvm-gpu.service").write_text(
        unit.replace(before.group(0), f"Before={others}" if others else ""))
    boot = image.boot(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_the_unavailable_spec(record)


@pytest.mark.parametrize("outcome", ["ready", "failed"])
def test_persistenced_outlives_every_boot_outcome_and_is_stopped_at_power_off(rootfs, tmp_path,  # noqa: F811
                                                                              outcome):
    """The daemon lifetime under a real systemd: boot starts nvidia-persistenced in a unit of
    its own, so a boot that fails after that step (here ``nvidia-ctk cdi generate`` exits 1)
    leaves podvm-gpu.service failed but the daemon running; kata-agent still starts and finds
    it alive; at power-off systemd stops it with SIGTERM, cleanly."""
    world.populate(rootfs, SPEC_TEMPLATE, fail_cdi_generate=outcome == "failed")
    image.clean_power_off(rootfs)
    boot = image.boot(rootfs, tmp_path / "artifacts")
    checks.persistenced_outlived_the_boot(boot, outcome)


def test_a_daemon_that_fails_to_start_is_quoted_from_its_journal(rootfs, tmp_path):  # noqa: F811
    """nvidia-persistenced says why it failed only to syslog ("Check syslog for more details" on
    stderr); under systemd that line is in its unit's journal, bounded to the time since boot
    started it, and the reason quotes it. The stand-in fails as the real daemon does (its
    source: the parent waits on a pipe, the child logs to syslog and exits 1)."""
    world.populate(rootfs, SPEC_TEMPLATE, fail_persistenced=True)
    boot = image.boot(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot, failed=True)
    checks.saw_the_failed_boot_and_its_unavailable_spec(
        record, "persistenced: nvidia-persistenced exited with status 1 during the wait: ",
        "Failed to query NVIDIA devices. Please ensure that the NVIDIA device files (/dev/nvidia*) "
        "exist, and that user 0 has read and write permissions for those files.")
    assert record["persistenced_unit"]["ActiveState"] == "failed", record["persistenced_unit"]


def test_a_daemon_killed_by_a_signal_is_named_so(rootfs, tmp_path):  # noqa: F811
    """A daemon killed while it initialises (the OOM killer, an operator's ``kill -9``) has
    no message of its own; the real systemd's record of its unit says ``code=killed ;
    status=9/KILL``, and the reason must say so, never "exited with status 9"."""
    world.populate(rootfs, SPEC_TEMPLATE, kill_persistenced=True)
    boot = image.boot(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot, failed=True)
    checks.saw_the_failed_boot_and_its_unavailable_spec(
        record, "persistenced: nvidia-persistenced was killed by SIGKILL during the wait")
    # nothing of its own to quote: not "status 9", nor systemd's own note from the unit's
    # process (nspawn: "Failed to configure loopback network device")
    assert record["status"]["reason"].endswith("killed by SIGKILL during the wait"), \
        record["status"]["reason"]
    assert record["persistenced_unit"]["ActiveState"] == "failed", record["persistenced_unit"]


def test_a_start_timeout_ends_the_boot_failed_and_leaves_the_initialising_daemon_alone(
        rootfs, tmp_path):  # noqa: F811 (the fixture imported above)
    """systemd's TimeoutStartSec= for podvm-gpu.service (cut to 20 s in a drop-in) passes while
    nvidia-persistenced still initialises its GPUs: systemd sends the agent SIGTERM. The boot
    ends ``failed`` naming the signal and the step, with the final status and the unavailable
    spec; the daemon, in its own unit (still activating: TimeoutStartSec=infinity there), is not
    touched and is alive when kata-agent starts; power-off stops it."""
    world.populate(rootfs, SPEC_TEMPLATE, hang_persistenced=True)
    dropin = rootfs / "etc/systemd/system/podvm-gpu.service.d/60-short-start-timeout.conf"
    # 20 s: well past the steps before persistenced even on a loaded machine, well before the
    # persistenced wait's own end (30 s + 15 s per GPU)
    dropin.write_text("[Service]\nTimeoutStartSec=20\n")
    image.clean_power_off(rootfs)
    boot = image.boot(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot, failed=True, result="timeout")
    checks.saw_the_failed_boot_and_its_unavailable_spec(
        record, "persistenced: interrupted by SIGTERM")
    steps = {s["name"]: s["result"] for s in record["status"]["steps"]}
    assert steps["persistenced"] == "failed", record["status"]["steps"]
    daemon = record["persistenced"]
    assert daemon and daemon["alive"], daemon
    assert "/system.slice/podvm-gpu-persistenced.service" in daemon["cgroup"], daemon
    assert record["persistenced_unit"]["ActiveState"] == "activating", record["persistenced_unit"]
    events = boot.files.get("/srv/gpu/persistenced-events.log", "").splitlines()
    # at power-off systemd signals the unit's processes (the control process and the daemon):
    # the stand-in may log its SIGTERM more than once before it exits
    assert events[:3] == [f"started {daemon['pid']}", f"initialising {daemon['pid']}",
                          f"SIGTERM {daemon['pid']}"], events
    assert set(events[2:]) == {f"SIGTERM {daemon['pid']}"}, events


# --- attestation-agent after the agent (issue 25) -------------------------------------------

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


def install_watch_probe(root, gpu: bool) -> None:
    """The watch probe (tests/boot/watch-probe.py) and the kata-agent stand-in's ordering after
    it; on the GPU path also the watcher's and the probe's drop-ins for the fake root."""
    units = image.HERE / "units/watch"
    etc = "/etc/systemd/system"
    image.install_file(image.HERE / "watch-probe.py", root, "/usr/local/libexec/watch-probe", 0o755)
    image.install_file(units / "watch-probe.service", root, f"{etc}/watch-probe.service")
    image.install_file(units / "kata-agent-70-watch-probe.conf", root,
                       f"{etc}/kata-agent.service.d/70-watch-probe.conf")
    if gpu:
        image.install_file(units / "podvm-gpu-watch-50-fake-gpu.conf", root,
                           f"{etc}/podvm-gpu-watch.service.d/50-fake-gpu.conf")
        image.install_file(units / "watch-probe-50-fake-gpu.conf", root,
                           f"{etc}/watch-probe.service.d/50-fake-gpu.conf")


def test_the_watcher_starts_after_a_ready_boot_and_an_xid_79_flips_the_spec(rootfs, tmp_path):  # noqa: F811
    """Issue 34 under a real systemd: podvm-gpu-watch.service (enabled by the installer) starts
    after the ready boot, in its sandbox; an Xid 79 in the kernel log it follows (the fake
    root's file) makes the spec unavailable and the status failed, and the unit ends 0."""
    import json

    home = world.populate(rootfs, SPEC_TEMPLATE)
    install_watch_probe(rootfs, gpu=True)
    boot = image.boot(rootfs, tmp_path / "artifacts")

    probe = json.loads((home / "watch-probe.json").read_text())
    assert probe["status_before"] == "ready", boot.console[-3000:]
    assert probe["watching"] and probe["watching"]["finding"] is None, boot.journal[-5000:]
    assert probe["unit_watching"]["ActiveState"] == "active", probe
    assert probe["flip_s"] is not None and probe["flip_s"] < 10, (probe, boot.journal[-5000:])
    assert probe["status_after"]["reason"].startswith("watch: GPU 0000:00:04.0: Xid 79")
    assert (probe["unit_after"]["Result"], probe["unit_after"]["ExecMainStatus"]) == ("success", "0")
    record = boot.record or {}
    assert "PODVM_GPU_STATE=failed" in (record.get("spec") or ""), record.get("spec")
    assert "podvm-gpu-watch" in boot.journal and "Xid 79" in boot.journal
    print(f"nspawn watch: the flip {probe['flip_s']:.3f} s after the record")


def test_on_a_cpu_vm_the_watcher_finds_nothing_to_watch(rootfs, tmp_path):  # noqa: F811
    import json

    if host_has_nvidia_pci_device():
        pytest.fail("this host has an NVIDIA PCI device: the CPU path test needs a GPU-less host")
    install_watch_probe(rootfs, gpu=False)
    boot = image.boot(rootfs, tmp_path / "artifacts")

    probe = json.loads((rootfs / "var/lib/watch-probe.json").read_text())
    assert probe["status_before"] == "no-gpu", probe
    assert (probe["unit_after"]["Result"], probe["unit_after"]["ExecMainStatus"]) == ("success", "0")
    assert probe["watch_after"] is None, "nothing watched, nothing written"
    assert "nothing to watch: the boot ended no-gpu" in boot.journal, boot.journal[-3000:]


# --- the watcher revokes through the attestation-agent (issue 43 item 4) ---------------------

AA_UNITS = image.HERE / "units/watch-aa"  # its drop-in checked in tests/test_units.py


@pytest.mark.parametrize("answer", ["ok", "not_enabled"])
def test_the_watcher_revokes_through_the_attestation_agent_with_the_shipped_rights(
        rootfs, tmp_path, answer):  # noqa: F811
    """Issue 43 item 4 under a real systemd: a TDX guest whose boot bound ``pass`` into RTMR3
    (the fake root's register, kept by tests/fake_rtmr's shim), then an attestation-agent
    stand-in on the agent's real socket path; an Xid 79 makes podvm-gpu-watch.service, in the
    shipped sandbox (its drop-in only maps the fake root: tests/test_units.py), revoke the pass
    with a ``fail`` sent through ExtendRuntimeMeasurement.

    ``ok``: the stand-in writes as the agent does; the watcher writes neither the log nor the
    register itself: the log holds the boot's pass and the agent's fail, nothing more, and the
    register is their replay. ``not_enabled`` (the agent's log off): the watcher appends and
    extends itself, within the shipped rights (the fake register's shim preloaded for it)."""
    import hashlib

    import fake_rtmr

    from podvm_gpu.host import aa, rtmr
    from podvm_gpu.steps.cc import bind

    home = world.populate(rootfs, SPEC_TEMPLATE, attested=True)
    root = home / "root"
    measurements = root / "sys/devices/virtual/misc/tdx_guest/measurements"
    measurements.mkdir(parents=True)
    (measurements / "rtmr3:sha384").write_bytes(bytes(48))
    (root / "sys/class/misc").mkdir(parents=True)
    (root / "sys/class/misc/tdx_guest").symlink_to("../../devices/virtual/misc/tdx_guest")
    (root / "run/confidential-containers").mkdir()  # where the agent's folder is bound
    shutil.copyfile(fake_rtmr.build(tmp_path / "shim"), home / "fake_rtmr.so")
    etc = "/etc/systemd/system"
    image.install_file(image.REPO / "tests/aa_standin.py", rootfs,
                       "/usr/local/libexec/aa-standin", 0o755)
    image.install_file(image.HERE / "watch-probe.py", rootfs, "/usr/local/libexec/watch-probe",
                       0o755)
    for src, dest in (
            (AA_UNITS / "attestation-agent.service", f"{etc}/attestation-agent.service"),
            (AA_UNITS / "podvm-gpu-watch-50-aa.conf", f"{etc}/podvm-gpu-watch.service.d/50-aa.conf"),
            (AA_UNITS / "podvm-gpu-60-rtmr.conf", f"{etc}/podvm-gpu.service.d/60-rtmr.conf"),
            (AA_UNITS / "watch-probe-60-aa.conf", f"{etc}/watch-probe.service.d/60-aa.conf"),
            (image.HERE / "units/watch/watch-probe.service", f"{etc}/watch-probe.service"),
            (image.HERE / "units/watch/watch-probe-50-fake-gpu.conf",
             f"{etc}/watch-probe.service.d/50-fake-gpu.conf"),
            (image.HERE / "units/watch/kata-agent-70-watch-probe.conf",
             f"{etc}/kata-agent.service.d/70-watch-probe.conf")):
        image.install_file(src, rootfs, dest)
    if answer == "not_enabled":
        image.install_file(AA_UNITS / "attestation-agent-60-not-enabled.conf", rootfs,
                           f"{etc}/attestation-agent.service.d/60-not-enabled.conf")
        image.install_file(AA_UNITS / "podvm-gpu-watch-60-rtmr.conf", rootfs,
                           f"{etc}/podvm-gpu-watch.service.d/60-rtmr.conf")
    (rootfs / f"{etc.lstrip('/')}/multi-user.target.wants/attestation-agent.service").symlink_to(
        f"{etc}/attestation-agent.service")
    boot = image.boot(rootfs, tmp_path / "artifacts")

    probe = json.loads((home / "watch-probe.json").read_text())
    assert probe["status_before"] == "ready", boot.console[-3000:]
    before = probe["binding_before"]
    assert (before["state"], before["result"], before["appended"]) == ("bound", "pass", True), \
        before  # the boot's own direct write, before the agent started
    assert probe["watching"] and probe["aa_listening"], (probe, boot.journal[-5000:])
    assert probe["flip_s"] is not None, (probe, boot.journal[-5000:])
    after = probe["status_after"]
    assert after["reason"].startswith("watch: GPU 0000:00:04.0: Xid 79"), after["reason"]
    assert "binding" not in after["reason"], after["reason"]  # nothing broken
    assert (after["binding"]["state"], after["binding"]["result"]) == ("bound", "fail"), after
    if answer == "ok":
        assert "attestation-agent" in after["binding"]["reason"], after["binding"]
    else:  # written by the watcher itself
        assert after["binding"]["reason"] is None and after["binding"]["appended"], after
    assert (probe["unit_after"]["Result"], probe["unit_after"]["ExecMainStatus"]) == \
        ("success", "0"), probe["unit_after"]

    requests = [json.loads(line) for line in
                (home / "aa-requests.jsonl").read_text().splitlines()]
    assert len(requests) == 1, requests
    [call] = requests
    assert (call["service"], call["method"]) == (aa.SERVICE, aa.METHOD), call
    assert set(call["fields"]) == {"1", "2", "3"}, call  # no RegisterIndex
    domain, operation, content = (call["fields"][n][0] for n in ("1", "2", "3"))
    assert (domain, operation) == (bind.DOMAIN, bind.OPERATION), call
    assert json.loads(content)["result"] == "fail", content

    # the log: the boot's pass, then the fail (the agent's with OK, else the watcher's); with
    # OK nothing written by the watcher: a third record, or a register the watcher overwrote
    # (no shim for it then), would show
    records = rtmr.parse_records((root / rtmr.EVENTLOG_PATH.lstrip("/")).read_bytes(), False,
                                 "AAEL")
    assert [bind.last_result([r]) for r in records] == ["pass", "fail"], records
    assert records[1].text() == f"{domain} {operation} {content}"
    register = (measurements / "rtmr3:sha384").read_bytes()
    assert register == rtmr.replay(records), "RTMR3 is the replay of the two events only"
    assert register != hashlib.sha384(bytes(48) + records[0].digest).digest()  # the fail is in
    print(f"nspawn watch revocation, the agent answering {answer}: boot {boot.wall_s:.2f} s, "
          f"the flip {probe['flip_s']:.3f} s after the record")
