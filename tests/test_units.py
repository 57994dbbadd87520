"""The systemd units: systemd-analyze verify with an empty stderr, the properties the boot
ordering and the daemons depend on, and the hardening score.

Units are checked where the installer puts them, in a throw-away root (``--root``) that holds
the host's targets (so dependencies resolve) and stubs for every ExecStart= binary (verify
checks that they exist). systemd-analyze only *warns* about bad keys, bad values and ordering
cycles and still exits 0, so every test asserts on stderr (TESTING-NOTES.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from podvm_gpu.host.daemons import DAEMONS, FABRICMANAGER, NVLSM, PERSISTENCED

NVATTEST_UNIT = "podvm-gpu-nvattest-gpu.service"  # the transient unit's name, its pid left out

REPO = Path(__file__).resolve().parents[1]
SYSTEMD = REPO / "systemd"
BOOT = REPO / "tests/boot"
UNIT_DIR = "/usr/lib/systemd/system"
BUDGET_S = 240  # the agent's default budget (contract section 3)

# Unit files and drop-ins -> where the installer (or the boot tests) put them.
INSTALLED = {
    SYSTEMD / "podvm-gpu.service": f"{UNIT_DIR}/podvm-gpu.service",
    SYSTEMD / "podvm-gpu-metrics.service": f"{UNIT_DIR}/podvm-gpu-metrics.service",
    SYSTEMD / "podvm-gpu-watch.service": f"{UNIT_DIR}/podvm-gpu-watch.service",
    SYSTEMD / "podvm-gpu-pod-labels.service": f"{UNIT_DIR}/podvm-gpu-pod-labels.service",
    SYSTEMD / "kata-agent.service.d/10-podvm-gpu.conf": f"{UNIT_DIR}/kata-agent.service.d/10-podvm-gpu.conf",
    SYSTEMD / "attestation-agent.service.d/10-podvm-gpu.conf":
        f"{UNIT_DIR}/attestation-agent.service.d/10-podvm-gpu.conf",
    BOOT / "units/attestation-agent.service": "/etc/systemd/system/attestation-agent.service",
    BOOT / "units/kata-agent.service": "/etc/systemd/system/kata-agent.service",
    BOOT / "gpu/podvm-gpu.service.d/50-fake-gpu.conf": "/etc/systemd/system/podvm-gpu.service.d/50-fake-gpu.conf",
    BOOT / "gpu/kata-agent.service.d/50-fake-gpu.conf": "/etc/systemd/system/kata-agent.service.d/50-fake-gpu.conf",
    **{BOOT / "units" / u: f"{UNIT_DIR}/{u}"
       for u in ("nvidia-persistenced.service", "nvidia-cdi-refresh.service", "nvidia-cdi-refresh.path")},
}
EXEC_STUBS = ["/opt/podvm-gpu/bin/podvm-gpu", "/usr/bin/python3", "/usr/bin/umockdev-run", "/usr/bin/touch",
              "/usr/bin/nvidia-persistenced", "/usr/bin/nv-fabricmanager", "/usr/sbin/nvlsm",
              "/usr/bin/nvattest"]
DAEMON_DIR = "/etc/systemd/system"  # systemd-analyze --root reads no /run/systemd/transient
# The daemons' transient units as unit files, with the command lines boot gives them by default.
DAEMON_ARGV = {PERSISTENCED.unit: ["/usr/bin/nvidia-persistenced", "--persistence-mode"],
               FABRICMANAGER.unit: ["/usr/bin/nv-fabricmanager", "-c",
                                    "/run/podvm-gpu/fabricmanager.cfg", "-g", "0xa088c20300543a1e"],
               NVLSM.unit: ["/usr/sbin/nvlsm", "-F", "/usr/share/nvidia/nvlsm/nvlsm.conf", "-g",
                            "0xa088c20300543a1e", "-f", "stdout", "--pid_file",
                            "/run/podvm-gpu/nvlsm.pid"]}


def systemd_analyze(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("systemd-analyze") is None:
        from boot.image import unavailable

        unavailable("systemd-analyze is missing (Debian package systemd)")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60)


# nspawn's own line when a --read-only container ends (nspawn 252), not systemd-analyze's
_NSPAWN_LEAVING = re.compile(r'^Attempted to remove disk file system under "/run/systemd/nspawn/[^"]*", '
                             r"and we can't allow that\.\n", re.M)


def analyze_in(rootfs: Path, root: Path, *args: str) -> subprocess.CompletedProcess:
    """systemd-analyze of the image ``rootfs`` (Debian 13's 257), run inside it with nspawn
    (read-only), on the unit root ``root`` bound to /mnt; the host's is 252. ``{root}`` in
    ``args`` is replaced by /mnt."""
    from boot import image

    image.require_tools("systemd-nspawn")
    done = subprocess.run(["systemd-nspawn", "--quiet", "--pipe", "--register=no", "--keep-unit", "--read-only",
                           "--setenv=SYSTEMD_COLORS=0", f"--directory={rootfs}", f"--bind-ro={root}:/mnt",
                           "systemd-analyze",
                           *(a.replace("{root}", "/mnt") for a in args)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env=image.nspawn_env(rootfs))
    done.stderr = _NSPAWN_LEAVING.sub("", done.stderr)
    return done


@pytest.fixture(scope="module", params=["host", pytest.param("trixie", marks=pytest.mark.slow)])
def analyzer(request):
    """systemd-analyze as ``analyzer(root, *args)`` (``{root}`` in args: the unit root): the
    host's (Debian 12, systemd 252), and Debian 13's (257), inside the cached trixie base image,
    so a systemd that judges a setting differently shows up."""
    if request.param == "host":
        return lambda root, *args: systemd_analyze(*(a.replace("{root}", str(root)) for a in args))
    from boot import image

    image.require_root()
    rootfs = image.variant_rootfs(image.TRIXIE_BASE)
    version = analyze_in(rootfs, Path("/"), "--version").stdout.split()[1]
    assert version == "257", version
    return lambda root, *args: analyze_in(rootfs, root, *args)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A root with the units installed as install-podvm-gpu.sh installs them."""
    root = tmp_path_factory.mktemp("unit-root")
    unit_dir = root / UNIT_DIR.lstrip("/")
    unit_dir.mkdir(parents=True)
    for host_dir in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        for target in host_dir.glob("*.target"):
            if not (unit_dir / target.name).exists():
                shutil.copyfile(target, unit_dir / target.name)
    for source, dest in INSTALLED.items():
        path = root / dest.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)
    for stub in EXEC_STUBS:
        path = root / stub.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    etc = root / "etc/systemd/system"
    for daemon in DAEMONS.values():  # transient at run time; a file here for systemd-analyze
        transient = root / DAEMON_DIR.lstrip("/") / daemon.unit
        transient.parent.mkdir(parents=True, exist_ok=True)
        transient.write_text(daemon.unit_file(DAEMON_ARGV[daemon.unit]))
    from podvm_gpu.steps.cc.attest import run as nvattest  # issue 26: nvattest's unit, same way
    (root / DAEMON_DIR.lstrip("/") / NVATTEST_UNIT).write_text(nvattest.unit_file(
        ["/usr/bin/nvattest", "attest", "--device", "gpu", "--verifier", "local", "--nonce",
         "00" * 32, "--format", "json"], 50))
    (etc / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    (etc / "multi-user.target.wants/podvm-gpu.service").symlink_to(f"{UNIT_DIR}/podvm-gpu.service")
    return root


LIST_KEYS = {"After", "Before", "Wants", "Requires", "WantedBy", "CapabilityBoundingSet",
             "ReadWritePaths", "RestrictAddressFamilies", "BindsTo", "Requisite", "PartOf"}


def parse_unit(*paths: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values of a unit file plus drop-ins, in order; an empty value resets
    the list, as systemd does for list settings (``ExecStart=`` in a drop-in)."""
    unit: dict[str, dict[str, list[str]]] = {}
    for path in paths:
        section = None
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = unit.setdefault(line.strip("[]"), {})
                continue
            key, _, value = line.partition("=")
            values = section.setdefault(key.strip(), [])
            if value.strip():
                values.extend(value.split() if key in LIST_KEYS else [value.strip()])
            else:
                values.clear()
    return unit


@pytest.fixture(scope="module")
def agent() -> dict[str, dict[str, list[str]]]:
    return parse_unit(SYSTEMD / "podvm-gpu.service")


def seconds(timespan: str) -> float:
    out = systemd_analyze("timespan", timespan).stdout
    return int(re.search(r"μs:\s*(\d+)", out).group(1)) / 1e6


@pytest.mark.parametrize("unit", ["podvm-gpu.service", "podvm-gpu-metrics.service",
                                  "podvm-gpu-pod-labels.service", "podvm-gpu-watch.service", "kata-agent.service",
                                  "nvidia-persistenced.service",
                                  "nvidia-cdi-refresh.service", "nvidia-cdi-refresh.path",
                                  PERSISTENCED.unit, FABRICMANAGER.unit, NVATTEST_UNIT])
def test_unit_verifies_without_any_warning(root, unit, analyzer):
    """Every unit with its drop-ins: the product's, and the boot tests' stand-ins and drop-ins."""
    done = analyzer(root, "verify", "--man=no", "--root={root}", unit)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_verify_check_catches_a_bad_key(root, tmp_path, analyzer):
    """The empty-stderr rule is what catches mistakes: systemd-analyze exits 0 on them."""
    broken = root / "etc/systemd/system/broken.service"
    broken.write_text((SYSTEMD / "podvm-gpu.service").read_text().replace("RemainAfterExit=", "RemainAfterExits="))
    try:
        done = analyzer(root, "verify", "--man=no", "--root={root}", "broken.service")
    finally:
        broken.unlink()
    assert done.returncode == 0
    assert "Unknown key 'RemainAfterExits'" in done.stderr


def test_a_mask_as_the_installer_makes_it_is_seen_by_systemd(root):
    mask = root / "etc/systemd/system/nvidia-cdi-refresh.path"
    mask.symlink_to("/dev/null")
    try:
        done = systemd_analyze("verify", "--man=no", f"--root={root}", "nvidia-cdi-refresh.path")
    finally:
        mask.unlink()
    assert "Unit nvidia-cdi-refresh.path is masked" in done.stderr


def test_agent_is_a_oneshot_that_stays_active_and_runs_the_venv_command(agent):
    service = agent["Service"]
    assert service["Type"] == ["oneshot"]
    assert service["RemainAfterExit"] == ["yes"]
    assert service["ExecStart"] == ["/opt/podvm-gpu/bin/podvm-gpu boot"]
    assert agent["Install"]["WantedBy"] == ["multi-user.target"]


def test_agent_runs_before_kata_agent_and_after_what_it_needs(agent):
    unit = agent["Unit"]
    assert "kata-agent.service" in unit["Before"]
    assert {"systemd-udev-trigger.service", "systemd-modules-load.service", "local-fs.target"} <= set(unit["After"])
    assert unit.get("DefaultDependencies", ["yes"]) == ["yes"], "keeps Conflicts/Before=shutdown.target"


def test_start_timeout_is_above_the_agents_budget(agent):
    timeout = seconds(agent["Service"]["TimeoutStartSec"][0])
    assert BUDGET_S + 10 <= timeout < 300, "above the budget, below cloud-api-adaptor's 5 minute wait"


@pytest.mark.parametrize("daemon", DAEMONS.values(), ids=lambda d: d.tool)
def test_a_daemons_unit_never_times_out_its_start_and_is_not_bound_to_the_agent(root, daemon):
    """persistenced and the fabric manager fork once initialised (persistenced after attaching
    every GPU), so systemd's start time-out would kill one mid-attach: it is off; the agent's own
    wait is bounded. NVLSM stays in the foreground (``-f stdout``): Type=exec, its readiness the
    agent's check (podvm_gpu/steps/fabric/nvl5.py). Nothing ties the unit to podvm-gpu.service: the agent's
    failure or stop leaves it."""
    unit = parse_unit(root / DAEMON_DIR.lstrip("/") / daemon.unit)
    service = unit["Service"]
    assert service["Type"] == (["exec"] if daemon is NVLSM else ["forking"])
    assert service["TimeoutStartSec"] == ["infinity"]
    assert service["Restart"] == ["no"]
    assert not {"BindsTo", "PartOf", "Requires", "Requisite"} & set(unit.get("Unit", {}))
    assert "DefaultDependencies" not in unit.get("Unit", {}), "stopped at shutdown"


def test_output_goes_to_the_journal_unbuffered(agent):
    service = agent["Service"]
    assert service["StandardOutput"] == ["journal"]
    assert service["StandardError"] == ["journal"]
    assert "PYTHONUNBUFFERED=1" in service["Environment"]


def test_hardening_leaves_what_gpu_setup_needs(agent):
    service = agent["Service"]
    caps = set(service["CapabilityBoundingSet"])
    assert {"CAP_SYS_MODULE", "CAP_MKNOD", "CAP_SYS_ADMIN"} <= caps
    assert "/run" in service["ReadWritePaths"], "/run/podvm-gpu and /var/run/cdi (/var/run -> /run)"
    # Optional paths only: a missing ReadWritePaths= entry fails the unit with 226/NAMESPACE.
    assert all(p == "/run" or p.startswith("-") for p in service["ReadWritePaths"])
    # The one write below the read-only /sys (ProtectKernelTunables=): RTMR3 in a TDX guest
    # (docs/interface.md 3.14), the path podvm_gpu/host/rtmr.py writes, optional
    from podvm_gpu.host.rtmr import RTMR3_PATH

    assert f"-{RTMR3_PATH}" in service["ReadWritePaths"]
    assert service["ProtectKernelTunables"] == ["yes"] and service["ProtectSystem"] == ["strict"]
    # Device nodes: no device allow-list, nothing that implies one (ProtectClock=, PrivateDevices=).
    assert "DeviceAllow" not in service
    assert service.get("DevicePolicy", ["auto"]) == ["auto"]
    for key in ("PrivateDevices", "ProtectKernelModules", "ProtectKernelLogs", "ProtectClock", "PrivateNetwork"):
        assert service.get(key, ["no"]) == ["no"], key


@pytest.mark.parametrize("unit, path, most", [
    ("podvm-gpu.service", f"{UNIT_DIR}/podvm-gpu.service", 4.0),
    ("podvm-gpu-metrics.service", f"{UNIT_DIR}/podvm-gpu-metrics.service", 2.5),
    ("podvm-gpu-pod-labels.service", f"{UNIT_DIR}/podvm-gpu-pod-labels.service", 2.0),
    ("podvm-gpu-watch.service", f"{UNIT_DIR}/podvm-gpu-watch.service", 3.0),
    (PERSISTENCED.unit, f"{DAEMON_DIR}/{PERSISTENCED.unit}", 3.5),
    (FABRICMANAGER.unit, f"{DAEMON_DIR}/{FABRICMANAGER.unit}", 3.5),
    (NVLSM.unit, f"{DAEMON_DIR}/{NVLSM.unit}", 3.5),
    (NVATTEST_UNIT, f"{DAEMON_DIR}/{NVATTEST_UNIT}", 4.0)])
def test_exposure_score(root, unit, path, most, analyzer):
    done = analyzer(root, "security", "--offline=true", "--root={root}", path)
    score = float(re.search(rf"Overall exposure level for {re.escape(unit)}: ([\d.]+)",
                            done.stdout).group(1))
    print(f"systemd-analyze security: {unit} exposure {score}")
    assert score <= most, done.stdout


def test_kata_agent_drop_in_wants_and_orders_after_the_agent_without_requiring_it():
    unit = parse_unit(SYSTEMD / "kata-agent.service.d/10-podvm-gpu.conf")["Unit"]
    assert unit["Wants"] == ["podvm-gpu.service"]
    assert unit["After"] == ["podvm-gpu.service"]
    for hard in ("Requires", "BindsTo", "Requisite", "PartOf"):
        assert hard not in unit, f"{hard}= would keep kata-agent from reporting a failed GPU setup"


def test_attestation_agent_drop_in_wants_and_orders_after_the_agent_without_requiring_it():
    unit = parse_unit(SYSTEMD / "attestation-agent.service.d/10-podvm-gpu.conf")["Unit"]
    assert unit["Wants"] == ["podvm-gpu.service"]
    assert unit["After"] == ["podvm-gpu.service"]
    for hard in ("Requires", "BindsTo", "Requisite", "PartOf"):
        assert hard not in unit, f"{hard}= would keep attestation-agent from starting after a failed GPU setup"
    agent = parse_unit(SYSTEMD / "podvm-gpu.service")["Unit"]
    assert "attestation-agent.service" in agent["Before"]


def test_every_install_path_ships_the_attestation_agent_drop_in():
    """Packer and mkosi install with the bundle's installer: the bundle carries the drop-in and
    the installer puts it where systemd reads vendor drop-ins."""
    bundle = (SYSTEMD / "make-bundle.sh").read_text()
    installer = (SYSTEMD / "install-podvm-gpu.sh").read_text()
    assert '"$here/attestation-agent.service.d/10-podvm-gpu.conf" "$out/attestation-agent-10-podvm-gpu.conf"' in bundle
    assert '"$unitdir/attestation-agent.service.d/10-podvm-gpu.conf"' in installer
    for builder in (REPO / "packer/podvm-gpu.pkr.hcl", REPO / "mkosi/mkosi.postinst.chroot"):
        assert "install-podvm-gpu.sh" in builder.read_text() or "install-into-root.sh" in builder.read_text()


def test_preset_enables_the_agent_and_disables_the_metrics_and_the_units_it_replaces():
    lines = [line for line in (SYSTEMD / "podvm-gpu.preset").read_text().splitlines()
             if line and not line.startswith("#")]
    assert lines == ["enable podvm-gpu.service", "enable podvm-gpu-watch.service",
                     "disable podvm-gpu-metrics.service",
                     # issue 28: the pod labels' reader, started only with the metrics unit
                     "enable podvm-gpu-pod-labels.service",
                     "disable nvidia-persistenced.service",
                     "disable nvidia-fabricmanager.service", "disable nvidia-cdi-refresh.path",
                     "disable nvidia-cdi-refresh.service"]


def test_gpu_test_drop_in_only_swaps_the_command_and_environment():
    unit = parse_unit(SYSTEMD / "podvm-gpu.service", BOOT / "gpu/podvm-gpu.service.d/50-fake-gpu.conf")
    assert unit["Service"]["ExecStart"] == [
        "/usr/bin/umockdev-run --device=/srv/gpu/h100.umockdev -- /opt/podvm-gpu/bin/podvm-gpu boot"]
    assert unit["Service"]["Type"] == ["oneshot"]


@pytest.mark.parametrize("script", ["make-bundle.sh", "install-podvm-gpu.sh", "install-into-root.sh"])
def test_scripts_parse_as_posix_sh(script):
    done = subprocess.run(["sh", "-n", str(SYSTEMD / script)], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.fixture(scope="module")
def metrics() -> dict[str, dict[str, list[str]]]:
    return parse_unit(SYSTEMD / "podvm-gpu-metrics.service")


def test_metrics_unit_serves_at_the_configs_address_after_the_boot_and_restarts(metrics):
    assert metrics["Service"]["Type"] == ["simple"]
    assert metrics["Service"]["ExecStart"] == ["/opt/podvm-gpu/bin/podvm-gpu metrics --serve"]
    assert metrics["Service"]["Restart"] == ["on-failure"], "an address not yet up is retried"
    assert "podvm-gpu.service" in metrics["Unit"]["After"], "a scrape is never the first NVML client"
    for hard in ("Requires", "BindsTo", "Requisite", "Wants"):
        assert hard not in metrics["Unit"], f"{hard}=: the exporter reports a failed boot, it needs none"
    assert "Before" not in metrics["Unit"], "nothing in the boot waits for the exporter"


def test_metrics_unit_sandbox_leaves_the_kernel_log_nvml_and_the_textfile(metrics):
    service = metrics["Service"]
    assert service["CapabilityBoundingSet"] == ["CAP_SYSLOG"], "/dev/kmsg with dmesg_restrict=1"
    assert service["DevicePolicy"] == ["closed"]
    assert service["DeviceAllow"] == ["/dev/kmsg r", "char-nvidia* rw"]
    assert service["ReadWritePaths"] == ["-/run/podvm-gpu"], "the textfile, optional"
    for key in ("ProtectKernelLogs", "ProtectProc", "ProcSubset", "PrivateNetwork", "PrivateDevices",
                "User", "DynamicUser"):
        assert key not in service, key


def test_watch_unit_runs_after_a_final_boot_restarts_and_has_no_network():
    unit = parse_unit(SYSTEMD / "podvm-gpu-watch.service")
    assert unit["Unit"]["After"] == ["podvm-gpu.service"]
    assert unit["Unit"]["PartOf"] == ["podvm-gpu.service"]  # a boot run again restarts it
    service = unit["Service"]
    assert service["ExecCondition"] == ["/opt/podvm-gpu/bin/podvm-gpu status"]
    assert service["ExecStart"] == ["/opt/podvm-gpu/bin/podvm-gpu watch"]
    assert service["Restart"] == ["on-failure"] and service["Type"] == ["simple"]
    # a bad config (exit 2, podvm_gpu/watch/command.py BAD_CONFIG) fails once, not every 5 s
    from podvm_gpu.watch.command import BAD_CONFIG

    assert service["RestartPreventExitStatus"] == [str(BAD_CONFIG)] == ["2"]
    assert service["PrivateNetwork"] == ["yes"] and service["RestrictAddressFamilies"] == ["AF_UNIX"]
    # what the work needs: the kernel log, the spec and run folders, the NVIDIA nodes
    assert service.get("ProtectKernelLogs", ["no"]) == ["no"]
    # and the binding's revocation (issue 43 item 4): AA's socket needs no right (a path
    # socket, AF_UNIX); the direct write (no agent, or NOT_ENABLED) its log and RTMR3's file
    assert service["ReadWritePaths"] == ["-/run/podvm-gpu", "-/run/cdi", "-/run/attestation-agent",
                                         "-/sys/devices/virtual/misc/tdx_guest/measurements"]
    from podvm_gpu.host import aa, rtmr

    assert rtmr.EVENTLOG_PATH.startswith("/run/attestation-agent/")
    assert aa.SOCKET_PATH.startswith("/run/") and "AF_UNIX" in service["RestrictAddressFamilies"]
    text = (SYSTEMD / "podvm-gpu-watch.service").read_text()
    for right in ("attestation-agent.sock", "NOT_ENABLED", "ProtectKernelTunables="):
        assert right in text, f"the unit says why: {right}"
    agent = parse_unit(SYSTEMD / "attestation-agent.service.d" / "10-podvm-gpu.conf")
    assert agent["Service"]["ExecStartPre"] == ["-/opt/podvm-gpu/bin/podvm-gpu binding --repair"]
    assert "char-nvidia* rw" in service["DeviceAllow"] and "/dev/kmsg rw" in service["DeviceAllow"]
    assert set(service["CapabilityBoundingSet"]) == {"CAP_SYSLOG", "CAP_SYS_ADMIN",
                                                     "CAP_DAC_READ_SEARCH"}
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_revocation_boots_drop_in_gives_the_watcher_no_right_the_shipped_unit_lacks():
    """What tests/test_boot_nspawn.py's revocation boot (issue 43 item 4) may change in
    podvm-gpu-watch.service: the fake root and tools, the shipped writable paths taken under
    that root, two files of the fake driver, and the attestation-agent's socket folder bound
    read-only. Not a capability, device, network, syscall or namespace setting, nor any other
    writable path: what the boot proves, the shipped sandbox allows."""
    fake_root = "/srv/gpu/root"
    dropin = parse_unit(BOOT / "units/watch-aa/podvm-gpu-watch-50-aa.conf")
    assert set(dropin) == {"Service"}, dropin
    service = dropin["Service"]
    assert set(service) == {"Environment", "ReadWritePaths", "BindReadOnlyPaths"}, service
    assert {e.split("=", 1)[0] for e in service["Environment"]} == {"PODVM_GPU_ROOT", "PATH"}
    shipped = {p.lstrip("-") for line in parse_unit(SYSTEMD / "podvm-gpu-watch.service")[
        "Service"]["ReadWritePaths"] for p in line.split()}
    twins = {f"-{fake_root}{p}" for p in shipped}
    granted = {p for line in service["ReadWritePaths"] for p in line.split()}
    assert twins <= granted  # every shipped right, under the fake root
    # the fake root's /var/run is a folder: /run/cdi's twin is named there too
    assert granted - twins == {f"-{fake_root}/var/run/cdi", "/srv/gpu/calls.log",
                               "/srv/gpu/cc-ready"}, granted - twins
    from podvm_gpu.host import aa

    folder = aa.SOCKET_PATH.split("/attestation-agent/")[0]  # /run/confidential-containers
    assert service["BindReadOnlyPaths"] == [f"{folder}:{fake_root}{folder}"], service
    standin = (BOOT / "units/watch-aa/attestation-agent.service").read_text()
    assert f" {aa.SOCKET_PATH} ${{AA_STANDIN_ANSWER}} " in standin, "the agent's real path"
    assert "Environment=AA_STANDIN_ANSWER=ok" in standin
    shim = parse_unit(BOOT / "units/watch-aa/podvm-gpu-watch-60-rtmr.conf")  # not_enabled's
    assert set(shim) == {"Service"} and set(shim["Service"]) == {"Environment"}, shim
    assert {e.split("=", 1)[0] for e in shim["Service"]["Environment"]} == {
        "LD_PRELOAD", "FAKE_RTMR_PATH"}


def test_every_install_path_ships_the_watch_unit_enabled():
    bundle = (SYSTEMD / "make-bundle.sh").read_text()
    installer = (SYSTEMD / "install-podvm-gpu.sh").read_text()
    assert '"$here/podvm-gpu-watch.service"' in bundle
    assert '"$unitdir/podvm-gpu-watch.service"' in installer
    assert "systemctl enable podvm-gpu-watch.service" in installer


def test_pod_labels_unit_runs_once_after_process_user_data_and_before_the_exporter():
    """Issue 28: the reader of apf.json is its own short-lived unit, between cloud-api-adaptor's
    process-user-data.service (which writes apf.json) and the exporter, which never opens it."""
    unit = parse_unit(SYSTEMD / "podvm-gpu-pod-labels.service")
    assert unit["Service"]["Type"] == ["oneshot"]
    assert unit["Service"]["ExecStart"] == ["/opt/podvm-gpu/bin/podvm-gpu metrics --pod-labels"]
    assert "process-user-data.service" in unit["Unit"]["After"]
    assert "podvm-gpu-metrics.service" in unit["Unit"]["Before"]
    assert unit["Service"]["PrivateNetwork"] == ["yes"]
    assert unit["Install"]["WantedBy"] == ["podvm-gpu-metrics.service"]
    metrics = parse_unit(SYSTEMD / "podvm-gpu-metrics.service")["Unit"]
    assert "podvm-gpu-pod-labels.service" in metrics["After"]  # ordering only, as the test above
    preset = (SYSTEMD / "podvm-gpu.preset").read_text().splitlines()
    assert "enable podvm-gpu-pod-labels.service" in preset


def _make_bundle(out, **env):
    return subprocess.run(["sh", str(SYSTEMD / "make-bundle.sh"), str(out)], capture_output=True,
                          text=True, timeout=60, env={"PATH": os.environ["PATH"], **env})


def test_make_bundle_refuses_a_folder_it_did_not_make_and_keeps_what_is_there(tmp_path):
    """Issue 47 item 4: the script began with ``rm -rf OUTDIR``; a folder with files and no
    marker is refused, untouched."""
    out = tmp_path / "srv-build"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    done = _make_bundle(out, PYTHON="false")
    assert done.returncode != 0
    assert "not a bundle make-bundle.sh made" in done.stderr, done.stderr
    assert (out / "notes.txt").read_text() == "mine\n"


def test_make_bundle_replaces_its_own_earlier_bundle_and_uses_an_empty_folder(tmp_path):
    """The marker the script writes lets it replace its own bundle (Packer re-running on its
    earlier ``bundle_dir``); an empty folder is used. ``PYTHON=false`` ends it at the first pip
    call, after the folder was prepared."""
    out = tmp_path / "bundle"
    out.mkdir()
    _make_bundle(out, PYTHON="false")
    assert (out / ".podvm-gpu-bundle").is_file()
    (out / "old.whl").write_text("")
    _make_bundle(out, PYTHON="false")
    assert not (out / "old.whl").exists() and (out / ".podvm-gpu-bundle").is_file()
