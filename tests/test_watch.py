"""``podvm-gpu watch`` in scenario worlds (issue 34): after a ready boot, a GPU that fails is
taken out of the spec for every container created after.

The world's kernel log is a regular file (tests/scenarios/world.py); records are appended to it
as the kernel would add them, and the watcher must see them through inotify, not its interval:
the tests set ``watch.interval_s`` to an hour where the kernel log alone must decide, so a
reaction within the test's bound proves the path is event-driven.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from scenarios.world import DATA, OWN_CASES, World, load_case, product_command

from podvm_gpu.cdi.unavailable import UNAVAILABLE_DEVICE
from podvm_gpu.watchfile import WATCH_PATH

REACT_S = 10.0  # the tests' bound; the bench measures the real reaction (about a second or less)
XID_79 = ("NVRM: Xid (PCI:0000:00:04): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
          "the bus.")
XID_13 = ("NVRM: Xid (PCI:0000:00:04): 13, pid=4242, name=python3, Graphics Exception: ESR "
          "0x404490=0x80000002")


def case(name: str, config: str | None = None, extra_log: list[str] = (), rules: list = ()):
    """A copy of the field case ``name`` (tests/data/cases) with a config file, kernel-log lines
    put first (before the driver's banner: an earlier load's, which the boot does not judge),
    and tool rules put first."""
    loaded = load_case(next(p for folder in (DATA / "cases", OWN_CASES)
                            for p in folder.glob(f"{name}-*.yaml")))
    if config is not None:
        before = loaded.files.get("etc/podvm-gpu/config.yaml") or ""
        loaded.files = {**loaded.files, "etc/podvm-gpu/config.yaml": before + config}
    loaded.kernel_log = [*extra_log, *loaded.kernel_log]
    loaded.tools = [*rules, *loaded.tools]
    return loaded


def rule(argv: list[str], stdout: str = "", rc: int = 0) -> dict:
    return {"argv": argv, "rc": rc, "stdout": stdout, "stderr": "", "delay_s": 0.0,
            "effects": [], "only_before": {}, "keep_output_s": 0.0}


def append_kmsg(world: World, message: str, level: int = 3) -> int:
    """Append one kernel record (facility kernel) after the last one; its sequence number."""
    path = Path(world.path("/dev/kmsg"))
    seq = next_seq(path)
    with path.open("a") as f:
        f.write(f"{level},{seq},{int(time.monotonic() * 1e6)},-;{message}\n")
    return seq


def next_seq(path: Path) -> int:
    """The sequence number after the last well-formed record of the log file at ``path``."""
    seqs = [int(fields[1]) for fields in (line.split(b",", 2) for line in
                                          path.read_bytes().splitlines())
            if len(fields) == 3 and fields[1].isdigit()]
    return max(seqs) + 1 if seqs else 0


def start_watch(world: World, *args: str) -> subprocess.Popen:
    out = open(os.path.join(world.layout.out, "watch.stdout"), "ab")
    err = open(os.path.join(world.layout.out, "watch.stderr"), "ab")
    argv = [*product_command(), "watch", "--root", world.layout.root, *args]
    try:
        return world.start_product(argv, out, err)
    finally:
        out.close()
        err.close()


def stderr_of(world: World) -> str:
    return Path(world.layout.out, "watch.stderr").read_text(errors="replace")


def wait_until(what, limit_s: float, proc: subprocess.Popen | None = None):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            return what()
        time.sleep(0.05)
    return what()


def watching(world: World, proc: subprocess.Popen) -> dict | None:
    """watch.json once the watcher has read the log up to its start."""
    def look():
        try:
            return json.loads(Path(world.path(WATCH_PATH)).read_text())
        except (OSError, ValueError):
            return None
    return wait_until(look, 30, proc)


def spec(world: World) -> dict:
    return yaml.safe_load(Path(world.path("/var/run/cdi/nvidia.yaml")).read_text())


def status(world: World) -> dict:
    return json.loads(Path(world.path("/run/podvm-gpu/status.json")).read_text())


def spec_env(world: World) -> list[str]:
    devices = spec(world)["devices"]
    return devices[0]["containerEdits"]["env"] if devices[0]["name"] == UNAVAILABLE_DEVICE \
        else []


def ready_world(world: World) -> None:
    run = world.run("boot")
    assert run.status and run.status["state"] == "ready", (run.stdout, run.stderr)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


HOUR = "watch:\n  interval_s: 3600\n"


def test_an_xid_79_after_the_boot_makes_the_spec_unavailable_naming_the_gpu():
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        assert spec(world)["devices"][0]["name"] != UNAVAILABLE_DEVICE
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            seq = append_kmsg(world, XID_79)
            sent = time.monotonic()
            flipped = wait_until(lambda: status(world)["state"] == "failed", REACT_S, proc)
            took = time.monotonic() - sent
            assert flipped, stderr_of(world)
            assert proc.wait(REACT_S) == 0, stderr_of(world)
        finally:
            stop(proc)
        doc = status(world)
        assert doc["reason"].startswith("watch: GPU 0000:00:04.0: Xid 79"), doc["reason"]
        assert doc["cdi"] is None
        env = spec_env(world)
        assert "PODVM_GPU_STATE=failed" in env
        assert any(e.startswith("PODVM_GPU_REASON=watch: GPU 0000:00:04.0: Xid 79") for e in env)
        found = json.loads(Path(world.path(WATCH_PATH)).read_text())
        assert found["finding"]["gpu"] == "0000:00:04.0" and found["finding"]["applied"]
        assert found["kmsg_seq"] == seq
        assert "Xid 79" in stderr_of(world)
        # the interval is an hour: only the kernel log's own event can have woken it
        assert took < REACT_S
        checked = world.run("check")
        rows = {row["name"]: row for row in json.loads(checked.stdout)["checks"]}
        assert checked.rc == 1
        assert rows["status"]["result"] == "fail"
        assert rows["status"]["detail"].startswith("a GPU failed after boot: watch: ")
        assert "rerun" not in rows["status"]["hint"] and "boot" not in rows["status"]["hint"]
        assert rows["watch"]["result"] == "fail" and "Xid 79" in rows["watch"]["detail"]
        assert "podvm-gpu watch --clear" in rows["watch"]["hint"]
        scraped = subprocess.run([*product_command(), "metrics", "--root", world.layout.root],
                                 capture_output=True, text=True, timeout=60)
        assert 'podvm_gpu_watch_finding{gpu="0000:00:04.0"} 1.0' in scraped.stdout, scraped.stderr


def test_records_from_before_the_boot_are_not_findings():
    with World(case("P02", HOUR, extra_log=[XID_79])) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, "virtio_net virtio0 eth0: link up")
            time.sleep(1.5)
            assert proc.poll() is None, stderr_of(world)
            assert status(world)["state"] == "ready"
        finally:
            stop(proc)
        assert proc.returncode == 0
        assert spec(world)["devices"][0]["name"] != UNAVAILABLE_DEVICE


def test_an_xid_13_only_warns_and_the_watcher_goes_on():
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, XID_13)
            warned = wait_until(lambda: any("Xid 13" in w for w in status(world)["warnings"]),
                                REACT_S, proc)
            assert warned, stderr_of(world)
            assert proc.poll() is None
            assert status(world)["state"] == "ready"
        finally:
            stop(proc)
        doc = json.loads(Path(world.path(WATCH_PATH)).read_text())
        assert doc["finding"] is None and doc["warnings"][0]["count"] == 1


def test_a_recovery_action_that_turns_to_node_reboot_fails_within_an_interval():
    with World(case("P02", "watch:\n  interval_s: 0.5\n")) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            config = json.loads(Path(world.layout.config).read_text())
            config["rules"].insert(0, rule(["nvidia-smi", "--query-gpu=pci.bus_id,"
                                            "gpu_recovery_action"], "00000000:00:04.0, Node Reboot\n"))
            Path(world.layout.config).write_text(json.dumps(config))
            assert wait_until(lambda: status(world)["state"] == "failed", REACT_S, proc), \
                stderr_of(world)
        finally:
            stop(proc)
        assert "Node Reboot" in status(world)["reason"]
        assert status(world)["reason"].startswith("watch: GPU 0000:00:04.0")


def test_in_a_confidential_guest_the_finding_sets_the_ready_state_back():
    srs_0 = ["nvidia-smi", "conf-compute", "-srs", "0"]
    with World(case("S77", HOUR, rules=[rule(srs_0, "CC Ready State: Not Ready\n")])) as world:
        ready_world(world)
        assert status(world)["confidential_computing"]["confidential"] is True
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, XID_79)
            assert proc.wait(REACT_S + 20) == 0, stderr_of(world)
        finally:
            stop(proc)
        called = [c.argv for c in world.calls() if c.argv[:2] == ["nvidia-smi", "conf-compute"]
                  and "-srs" in c.argv]
        assert called[-1] == srs_0, called
        found = json.loads(Path(world.path(WATCH_PATH)).read_text())["finding"]
        assert found["ready_state"] == "set to not ready"
        assert status(world)["state"] == "failed"
        assert "PODVM_GPU_STATE=failed" in spec_env(world)


def test_a_ready_state_that_cannot_be_set_back_is_reported_not_retried():
    lost = rule(["nvidia-smi", "conf-compute", "-srs", "0"], "", rc=15)
    lost["stderr"] = "Unable to set the ready state: GPU is lost\n"
    with World(case("S77", HOUR, rules=[lost])) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, XID_79)
            assert proc.wait(REACT_S + 20) == 0, stderr_of(world)
        finally:
            stop(proc)
        srs = [c for c in world.calls() if c.argv[-2:] == ["-srs", "0"]]
        assert len(srs) == 1
        reason = status(world)["reason"]
        assert "conf-compute -srs 0: exit 15" in reason, reason
        assert "PODVM_GPU_STATE=failed" in spec_env(world)


def test_a_boot_run_again_while_a_finding_stands_ends_failed_naming_it():
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, XID_79)
            assert proc.wait(REACT_S + 20) == 0, stderr_of(world)
        finally:
            stop(proc)
        again = world.run("rerun")
        assert again.rc == 1 and again.status["state"] == "failed", again.stderr
        assert again.status["reason"].startswith("watch: "), again.status["reason"]
        assert "Xid 79" in again.status["reason"]
        assert "PODVM_GPU_STATE=failed" in spec_env(world)
        # cleared explicitly, the boot runs again and judges for itself: the Xid 79 came after
        # the driver loaded, so the modules step fails on it (no longer a watch finding)
        clear = subprocess.run([*product_command(), "watch", "--root", world.layout.root,
                                "--clear"], capture_output=True, text=True, timeout=60)
        assert clear.returncode == 0 and "cleared" in clear.stdout, clear.stderr
        assert not os.path.exists(world.path(WATCH_PATH))
        third = world.run("rerun")
        assert third.status["state"] == "failed", third.stderr
        assert third.status["reason"].startswith("modules: ") and "Xid 79" in \
            third.status["reason"]


def test_a_dry_run_while_a_finding_stands_says_so_and_exits_1():
    """Issue 47 item 6: ``boot --dry-run`` planned a full boot and exited 0 where the real boot
    fails ``watch: a finding of the watcher stands``: it says that and exits 1."""
    from podvm_gpu.host.fs import Root
    from podvm_gpu.watchfile import VERSION, save

    with World(case("P02", HOUR)) as world:
        ready_world(world)
        save(Root(world.layout.root), {"version": VERSION, "finding": {
            "reason": "watch: GPU 0000:00:04.0: Xid 79 (fallen off the bus)"}})
        for extra in ([], ["--json"]):
            argv = [a for a in world.product_argv("boot") if a != "--json"]
            done = subprocess.run([*argv, "--dry-run", *extra], capture_output=True, text=True,
                                  timeout=60, env=world._env(), cwd=world.layout.dir)
            assert done.returncode == 1, (done.stdout, done.stderr)
            assert "a finding of the watcher stands" in done.stdout, done.stdout
            assert "Xid 79" in done.stdout and "nvidia-ctk" not in done.stdout, done.stdout


@pytest.mark.parametrize("name", ["P01"])
def test_nothing_to_watch_on_a_cpu_vm_exits_0_at_once(name):
    with World(case(name)) as world:
        world.run("boot")
        started = time.monotonic()
        done = subprocess.run([*product_command(), "watch", "--root", world.layout.root],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("nothing to watch: the boot ended no-gpu")
        assert time.monotonic() - started < 5
        assert not os.path.exists(world.path(WATCH_PATH))


def test_records_after_the_boots_ready_line_and_before_the_watcher_started_are_judged():
    """The boot's final console line (facility daemon) marks the position it reached: an Xid
    between it and the watcher's start is a finding; one before it is not."""
    with World(case("P02", HOUR, extra_log=[XID_79])) as world:
        ready_world(world)
        append_kmsg(world, "podvm-gpu[4242]: ready: 1 GPU(s), CDI spec /var/run/cdi/nvidia.yaml",
                    level=(3 << 3) | 5)
        seq = append_kmsg(world, XID_79)
        proc = start_watch(world)
        try:
            assert proc.wait(REACT_S + 20) == 0, stderr_of(world)
        finally:
            stop(proc)
        doc = status(world)
        assert doc["state"] == "failed" and f"kernel log record {seq}" in doc["reason"]


def test_an_empty_kernel_log_is_watched_from_its_start_said_plainly():
    """It said "kernel log after record -1" (the position of a log without records); an Xid
    that arrives then is still a finding."""
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        Path(world.path("/dev/kmsg")).write_bytes(b"")
        proc = start_watch(world)
        try:
            said = wait_until(lambda: "watching 1 GPU(s)" in stderr_of(world) and
                              stderr_of(world), 30, proc)  # said just after watch.json
            assert "watching 1 GPU(s): kernel log from its start (no record in it yet), polls " \
                "every 3600 s" in said, said
            assert "record -1" not in said
            append_kmsg(world, XID_79)
            assert proc.wait(REACT_S) == 0, stderr_of(world)
        finally:
            stop(proc)
        assert status(world)["state"] == "failed"


def test_a_restarted_watcher_reads_the_log_from_the_position_it_kept():
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            kept = watching(world, proc)
            assert kept, stderr_of(world)
            append_kmsg(world, XID_13)
            assert wait_until(lambda: any("Xid 13" in w for w in status(world)["warnings"]),
                              REACT_S, proc)
        finally:
            stop(proc)
        assert proc.returncode == 0  # SIGTERM: stopped, the position kept
        position = json.loads(Path(world.path(WATCH_PATH)).read_text())["kmsg_seq"]
        assert position == kept["kmsg_seq"] + 1
        seq = append_kmsg(world, XID_79)  # while no watcher ran
        again = start_watch(world)
        try:
            assert again.wait(REACT_S + 20) == 0, stderr_of(world)
        finally:
            stop(again)
        doc = status(world)
        assert doc["state"] == "failed" and f"kernel log record {seq}" in doc["reason"]
        # the warning of the first run was not raised again: the record was read already
        assert sum("Xid 13" in w for w in doc["warnings"]) == 1


def test_a_finding_for_a_gpu_the_spec_does_not_hold_is_a_warning():
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, XID_79.replace("0000:00:04", "0000:00:09"))
            assert wait_until(lambda: any("not one the spec holds" in w
                                          for w in status(world)["warnings"]), REACT_S, proc)
            assert proc.poll() is None and status(world)["state"] == "ready"
        finally:
            stop(proc)


def kill_persistenced(world: World) -> int:
    """End the world's nvidia-persistenced stand-in as a crash would: its process and its
    entry under the root's /proc go; the pid file stays."""
    import shutil
    import signal

    pid = int(Path(world.path("/var/run/nvidia-persistenced/nvidia-persistenced.pid"))
              .read_text())
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    shutil.rmtree(world.path(f"/proc/{pid}"), ignore_errors=True)
    return pid


def test_persistenced_gone_on_a_regular_vm_is_started_again_and_warned():
    with World(case("P02", "watch:\n  interval_s: 0.3\n")) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            pid = kill_persistenced(world)
            back = wait_until(lambda: any(f"nvidia-persistenced (pid {pid}) is gone; started "
                                          "again" in w for w in status(world)["warnings"]),
                              REACT_S + 10, proc)
            assert back, stderr_of(world)
            assert proc.poll() is None and status(world)["state"] == "ready"
        finally:
            stop(proc)
        starts = [c for c in world.calls() if c.argv[0] == "nvidia-persistenced"]
        assert len(starts) == 2  # the boot's and the watcher's


def test_a_persistenced_that_refuses_an_option_is_started_again_without_it_by_the_watcher():
    """Issue 44 item 4 (in issue 47's session): nvidia-persistenced 535.171.04 prints
    ``unrecognized option: "--uvm-persistence-mode"`` and exits 0 without starting (S18); it
    dies after a ready boot, and the watcher starts it again without that option, as boot does
    (one start in host/daemons.py): the spec stays ready."""
    with World(case("S18", "watch:\n  interval_s: 0.3\n")) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            pid = kill_persistenced(world)
            back = wait_until(lambda: any(f"nvidia-persistenced (pid {pid}) is gone; started "
                                          "again" in w for w in status(world)["warnings"]),
                              REACT_S + 15, proc)
            assert back, (status(world), stderr_of(world))
            assert proc.poll() is None and status(world)["state"] == "ready"
            assert spec(world)["devices"][0]["name"] != UNAVAILABLE_DEVICE
        finally:
            stop(proc)
        starts = [c.argv[1:] for c in world.calls() if c.argv[0] == "nvidia-persistenced"]
        # the boot's refused start and its retry, then the watcher's: the same two
        assert starts == [["--persistence-mode", "--uvm-persistence-mode"],
                          ["--persistence-mode"]] * 2, starts


def test_a_watcher_started_after_persistenced_died_warns_at_its_start():
    """Issue 47 item 21: a watcher started while the boot's nvidia-persistenced is already dead
    said nothing (it watches only the daemons that ran at its start, 4.5): it warns."""
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        kill_persistenced(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            said = wait_until(lambda: [w for w in status(world)["warnings"]
                                       if "nvidia-persistenced" in w], 10, proc)
            assert said and "not running at the watcher's start" in said[0], \
                (status(world)["warnings"], stderr_of(world))
        finally:
            stop(proc)


def test_persistenced_gone_in_a_confidential_guest_is_a_finding():
    srs_0 = rule(["nvidia-smi", "conf-compute", "-srs", "0"], "")
    with World(case("S77", "watch:\n  interval_s: 0.3\n", rules=[srs_0])) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            pid = kill_persistenced(world)
            assert proc.wait(REACT_S + 10) == 0, stderr_of(world)
        finally:
            stop(proc)
        reason = status(world)["reason"]
        assert f"nvidia-persistenced (pid {pid}) is gone in a confidential guest" in reason
        assert len([c for c in world.calls() if c.argv[0] == "nvidia-persistenced"]) == 1


def test_a_run_folder_others_can_write_is_refused_as_boot_refuses_it():
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        run_dir = world.path("/run/podvm-gpu")
        os.chmod(run_dir, 0o777)
        done = subprocess.run([*product_command(), "watch", "--root", world.layout.root],
                              capture_output=True, text=True, timeout=60)
        os.chmod(run_dir, 0o755)
        assert done.returncode == 1, done.stderr
        assert "refusing to write under this root" in done.stderr and run_dir.removeprefix(
            world.layout.root) in done.stderr.replace(world.layout.root, "")
        assert not os.path.exists(world.path(WATCH_PATH))


@pytest.mark.parametrize("warns", [False, True])
def test_xid_154_asking_for_a_gpu_reset_honours_reset_pending_warns(warns):
    xid_154 = ("NVRM: Xid (PCI:0000:00:04): 154, GPU recovery action changed from 0x0 (None) to "
               "0x1 (PF FLR)")
    config = HOUR + ("health:\n  reset_pending_warns: true\n" if warns else "")
    with World(case("P02", config)) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, xid_154)
            if warns:
                assert wait_until(lambda: any("GPU Reset" in w and "reset_pending_warns" in w
                                              for w in status(world)["warnings"]), REACT_S, proc)
                assert proc.poll() is None and status(world)["state"] == "ready"
            else:
                assert proc.wait(REACT_S + 20) == 0, stderr_of(world)
                assert "Xid 154" in status(world)["reason"] and "GPU Reset" in \
                    status(world)["reason"]
        finally:
            stop(proc)


def test_a_fabric_that_leaves_completed_is_a_finding_within_an_interval():
    """P03 (8 x H200, 4 NVSwitches): the fabric was Completed/Success at boot; the poll sees it
    fall back to In Progress (the fabric manager lost it)."""
    from scenarios import effects

    with World(case("P03", "watch:\n  interval_s: 0.5\n")) as world:
        ready_world(world)
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            time.sleep(1.2)  # polls that find it healthy
            assert status(world)["state"] == "ready", stderr_of(world)
            with effects.locked_state(world.layout) as state:
                state["fabric"] = "in-progress"
            assert wait_until(lambda: status(world)["state"] == "failed", REACT_S, proc), \
                stderr_of(world)
        finally:
            stop(proc)
        reason = status(world)["reason"]
        assert "fabric State In Progress" in reason and reason.startswith("watch: GPU 0000:"), reason


def test_a_route_unhealthy_after_a_ready_boot_is_a_finding_and_the_reading_is_kept():
    """Issue 44 item 6: S491's 580 world (8 x H200, 4 NVSwitches; a route recovery in progress
    and a word not understood: ready with warnings). The watcher reads the fabric health the
    boot read, keeps it in watch.json (the exporter's DCGM_FI_DEV_FABRIC_HEALTH_*), and when the
    detail says GPU 00000000:AB:00.0's route is unhealthy, takes the GPUs out of the spec."""
    with World(case("S491", "watch:\n  interval_s: 0.5\n")) as world:
        ready_world(world)
        assert [g["gpu"] for g in status(world)["fabric"]["health"]][5] == "00000000:AB:00.0"
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            assert wait_until(lambda: (json.loads(Path(world.path(WATCH_PATH)).read_text())
                                       .get("fabric_health")), REACT_S, proc), stderr_of(world)
            assert status(world)["state"] == "ready", stderr_of(world)
            config = json.loads(Path(world.layout.config).read_text())
            detail = next(r for r in config["rules"] if "fabric.health.bandwidth" in r["argv"][1])
            detail["stdout"] = detail["stdout"].replace(
                "00000000:AB:00.0, False, False, False", "00000000:AB:00.0, False, False, True")
            Path(world.layout.config).write_text(json.dumps(config))
            assert wait_until(lambda: status(world)["state"] == "failed", REACT_S, proc), \
                stderr_of(world)
        finally:
            stop(proc)
        reason = status(world)["reason"]
        assert reason.startswith("watch: GPU 0000:ab:00.0: GPU 00000000:AB:00.0: fabric unhealthy:"
                                 " fabric.health.route_unhealthy True"), reason
        kept = json.loads(Path(world.path(WATCH_PATH)).read_text())["fabric_health"]
        assert kept[5]["route_unhealthy"] == "True", "the reading the finding was made on is kept"
        assert kept[5]["mask"] & (0x3 << 4) == 1 << 4


def test_a_finding_revokes_the_pass_the_boot_bound_into_rtmr3():
    """Issue 37's binding: a TDX guest whose boot bound ``pass`` (S170); the watcher's finding
    appends a ``fail`` event and extends RTMR3 with it, so a relying party's policy refuses
    the VM whose GPU failed after attestation."""
    srs_0 = rule(["nvidia-smi", "conf-compute", "-srs", "0"], "")
    with World(case("S170", HOUR, rules=[srs_0])) as world:
        ready_world(world)
        bound = status(world)["binding"]
        assert (bound["state"], bound["result"]) == ("bound", "pass"), bound
        register = Path(world.path("/sys/class/misc/tdx_guest/measurements/rtmr3:sha384"))
        before = register.read_bytes()
        gpu = status(world)["gpus"][0]["pci_address"]
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, XID_79.replace("0000:00:04", gpu.rsplit(".", 1)[0]))
            assert proc.wait(REACT_S + 20) == 0, stderr_of(world)
        finally:
            stop(proc)
        doc = status(world)
        assert doc["state"] == "failed" and "binding broken" not in doc["reason"], doc["reason"]
        assert (doc["binding"]["state"], doc["binding"]["result"]) == ("bound", "fail")
        assert doc["binding"]["appended"] is True
        assert register.read_bytes() != before
        log = Path(world.path("/run/attestation-agent/eventlog")).read_bytes()
        assert log.rindex(b'"result":"fail"') > log.rindex(b'"result":"pass"')


def run_watch_once(world: World, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*product_command(), "watch", "--root", world.layout.root, *args],
                          capture_output=True, text=True, timeout=60, env=world._env())


@pytest.mark.parametrize("how", ["root-file", "named-missing", "named-bad"])
def test_a_bad_config_fails_the_watcher_once_naming_it_as_metrics_does(how, tmp_path):
    """Issue 35's leftovers: the watcher took the defaults with a warning where every other
    command fails on a bad config; exit 2 (as metrics), which the unit does not restart."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("budget_s: forever\n")
    with World(case("P02", HOUR)) as world:
        ready_world(world)
        config = Path(world.path("/etc/podvm-gpu/config.yaml"))
        args = {"root-file": [], "named-missing": ["--config", str(tmp_path / "gone.yaml")],
                "named-bad": ["--config", str(bad)]}[how]
        if how == "root-file":
            config.write_text("budget_s: forever\n")
        done = run_watch_once(world, *args)
        assert done.returncode == 2, (done.stdout, done.stderr)
        named = {"root-file": f"{config}: budget_s: must be a number of seconds",
                 "named-missing": f"{tmp_path / 'gone.yaml'}: no such file",
                 "named-bad": f"{bad}: budget_s: must be a number of seconds"}[how]
        assert done.stderr.startswith(f"podvm-gpu: error: {named}"), done.stderr
        assert "not watching: fix it" in done.stderr and "defaults" not in done.stderr
        assert len(done.stderr.splitlines()) == 1 and done.stdout == ""
        assert not os.path.exists(world.path(WATCH_PATH))
        assert status(world)["state"] == "ready"
        as_json = run_watch_once(world, "--json", *args)
        assert as_json.returncode == 2
        assert json.loads(as_json.stdout) == {"watching": False,
                                              "error": done.stderr.split("error: ", 1)[1]
                                              .split("; not watching")[0]}


def test_a_finding_kept_but_not_applied_is_applied_with_the_defaults_under_a_bad_config():
    """Failing closed: the bad config is said, and the GPU still leaves the spec."""
    from podvm_gpu.host.fs import Root
    from podvm_gpu.watchfile import new_state, save

    with World(case("P02", HOUR)) as world:
        ready_world(world)
        kept = new_state(status(world)["started_at"])
        kept["kmsg_seq"] = 7
        kept["finding"] = {"gpu": "0000:00:04.0", "what": "Xid 79", "source":
                           "kernel log record 7", "at": "2026-12-04T00:00:00Z", "kmsg_seq": 7,
                           "reason": "watch: GPU 0000:00:04.0: Xid 79; found at "
                                     "2026-12-04T00:00:00Z (kernel log record 7)",
                           "applied": False, "ready_state": None}
        save(Root(world.layout.root), kept)
        Path(world.path("/etc/podvm-gpu/config.yaml")).write_text("budget_s: forever\n")
        done = run_watch_once(world)
        assert done.returncode == 0, done.stderr
        assert "budget_s: must be a number of seconds" in done.stderr
        assert "is applied with the defaults" in done.stderr
        assert status(world)["state"] == "failed"
        assert status(world)["reason"].startswith("watch: GPU 0000:00:04.0: Xid 79")
        assert "PODVM_GPU_STATE=failed" in spec_env(world)
