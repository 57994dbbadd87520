"""Read-only facts about the driver and its daemons (podvm_gpu.readers).

File readers run against a real temp root laid out as the field cases lay theirs out
(tests/data/cases: C08 for /proc/devices and the information file, C09 for a libnvidia-ml.so.1
outside the loader's directories); the nvidia-smi parsers against texts shaped like the tool's.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import yaml
from smi_facts import parse_fabric

from podvm_gpu import readers
from podvm_gpu.host.fs import Root

CASES = Path(__file__).resolve().parent / "data" / "cases"


def case(case_id: str) -> dict:
    (path,) = CASES.glob(f"{case_id}-*.yaml")
    return yaml.safe_load(path.read_text())


def build_root(path: Path, files: dict, symlinks: dict | None = None) -> Root:
    """Lay out a case's ``files`` (text, or ``{content, mode}``) and ``symlinks`` under ``path``."""
    for rel, spec in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(spec, dict):
            target.write_text(spec.get("content", ""))
            target.chmod(int(str(spec.get("mode", "0644")), 8))
        else:
            target.write_text(spec)
    for rel, link in (symlinks or {}).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link, path / rel)
    return Root(path)


def write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


# --- /proc and /sys -----------------------------------------------------------------------------

def test_char_majors_reads_only_the_character_part_c08(tmp_path):
    root = build_root(tmp_path, case("C08")["files"])

    majors = readers.char_majors(root)

    assert majors["nvidia-uvm"] == 510
    assert "nvidia" not in majors  # C08: the module registered no control device
    assert majors["watchdog"] == 253
    assert "device-mapper" not in majors and "virtblk" not in majors  # block devices


def test_char_majors_reads_the_nvidia_lines(tmp_path):
    write(tmp_path, "proc/devices", "Character devices:\n  1 mem\n195 nvidia\n"
          "195 nvidia-modeset\n510 nvidia-uvm\n511 nvidia-nvlink\n\nBlock devices:\n"
          "195 not-a-char\n")

    majors = readers.char_majors(Root(tmp_path))

    assert majors["nvidia"] == 195
    assert majors["nvidia-uvm"] == 510
    assert "not-a-char" not in majors


def test_gpu_minor_from_an_information_file_with_tabs_c08(tmp_path):
    root = build_root(tmp_path, case("C08")["files"])

    assert readers.gpu_minor(root, "0000:00:05.0") == 0
    assert readers.gpu_minor(root, "0000:00:05.0".upper()) == 0  # the driver's folder is lowercase


def test_gpu_minor_reads_a_two_digit_minor(tmp_path):
    write(tmp_path, "proc/driver/nvidia/gpus/0000:db:00.0/information",
          "Model: \t\t NVIDIA H200\nBus Location: \t 0000:db:00.0\nDevice Minor: \t 7\n")
    write(tmp_path, "proc/driver/nvidia/gpus/0000:dc:00.0/information",
          "Model: \t\t NVIDIA H200\nDevice Minor: \t 12\n")

    assert readers.gpu_minor(Root(tmp_path), "0000:db:00.0") == 7
    assert readers.gpu_minor(Root(tmp_path), "0000:dc:00.0") == 12


def test_gpu_minor_is_none_without_the_information_file(tmp_path):
    assert readers.gpu_minor(Root(tmp_path), "0000:00:04.0") is None


def test_kernel_module_version_from_sys_module(tmp_path):
    write(tmp_path, "sys/module/nvidia/version", "550.54.15\n")

    assert readers.kernel_module_version(Root(tmp_path)) == "550.54.15"


def test_kernel_module_version_falls_back_to_the_nvrm_banner_c08(tmp_path):
    files = dict(case("C08")["files"])
    files.pop("sys/module/nvidia/version")
    files["proc/driver/nvidia/version"] = files["proc/driver/nvidia/version"].replace(
        "550.54.15", "535.183.01")

    assert readers.kernel_module_version(build_root(tmp_path, files)) == "535.183.01"


def test_kernel_module_version_is_none_without_the_module(tmp_path):
    assert readers.kernel_module_version(Root(tmp_path)) is None


def test_module_loaded_from_proc_modules_or_live_initstate_c08(tmp_path):
    root = build_root(tmp_path, case("C08")["files"])
    (tmp_path / "proc" / "modules").write_text("virtio_net 77824 0 - Live 0x0\n")

    assert readers.module_loaded(root, "nvidia_uvm")  # sys/module/nvidia_uvm/initstate: live
    assert not readers.module_loaded(root, "nvidia")
    assert not readers.module_loaded(root, "nouveau")


def test_kernel_release_is_read_from_proc(tmp_path):
    write(tmp_path, "proc/sys/kernel/osrelease", "6.8.0-1015-example\n")

    assert readers.kernel_release(Root(tmp_path)) == "6.8.0-1015-example"
    assert readers.kernel_release(Root(tmp_path / "none")) == ""


def test_module_kernels_finds_compressed_modules(tmp_path):
    write(tmp_path, "lib/modules/6.8.0-1/updates/dkms/nvidia.ko.zst", "")
    write(tmp_path, "lib/modules/6.8.0-2/kernel/drivers/net/virtio_net.ko", "")
    write(tmp_path, "lib/modules/6.8.0-3/extra/nvidia-uvm.ko", "")

    assert readers.module_kernels(Root(tmp_path)) == ["6.8.0-1"]


def test_modprobe_overrides_name_file_and_line(tmp_path):
    write(tmp_path, "etc/modprobe.d/nvidia.conf",
          "# comment\noptions nvidia NVreg_EnableGpuFirmware=1\ninstall nvidia /bin/true\n")
    write(tmp_path, "lib/modprobe.d/blacklist.conf", "blacklist nvidia-uvm  # old\n")

    assert readers.modprobe_overrides(Root(tmp_path), "nvidia") == \
        ["/etc/modprobe.d/nvidia.conf: install nvidia /bin/true"]
    assert readers.modprobe_overrides(Root(tmp_path), "nvidia_uvm") == \
        ["/lib/modprobe.d/blacklist.conf: blacklist nvidia-uvm"]


# --- where the loader finds libnvidia-ml.so.1 ---------------------------------------------------

def test_loader_dirs_follow_ld_so_conf_includes_before_the_defaults_c09(tmp_path):
    root = build_root(tmp_path, case("C09")["files"], case("C09")["symlinks"])

    dirs = readers.loader_dirs(root)

    assert dirs[0] == "/usr/local/lib64"
    assert "/usr/lib/x86_64-linux-gnu" in dirs and "/usr/lib64" in dirs
    assert "/usr/lib64/nvidia" not in dirs
    assert len(dirs) == len(set(dirs))


def test_loader_dirs_resolve_a_relative_include_against_etc(tmp_path):
    write(tmp_path, "etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
    write(tmp_path, "etc/ld.so.conf.d/nvidia.conf", "/usr/lib64/nvidia/\n")
    write(tmp_path, "etc/ld.so.conf.d/x.conf", "include /etc/ld.so.conf\n/opt/x  # loop above\n")

    dirs = readers.loader_dirs(Root(tmp_path))

    assert dirs[:2] == ["/usr/lib64/nvidia", "/opt/x"]


def test_find_nvml_in_the_multiarch_folder_reads_the_version_from_the_target(tmp_path):
    root = build_root(tmp_path, case("C25")["files"], case("C25")["symlinks"])

    lib = readers.find_nvml(root)

    assert lib.path == "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    assert lib.target == "libnvidia-ml.so.525.85.12"
    assert lib.version == "525.85.12"


def test_find_nvml_through_a_merged_usr_lib_link(tmp_path):
    write(tmp_path, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", "")
    os.symlink("libnvidia-ml.so.550.54.15",
               tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    os.symlink("/usr/lib", tmp_path / "lib")  # absolute: must stay inside the root

    lib = readers.find_nvml(Root(tmp_path))

    assert lib.version == "550.54.15"


def test_nvml_outside_the_loaders_folders_is_found_elsewhere_c09(tmp_path):
    root = build_root(tmp_path, case("C09")["files"], case("C09")["symlinks"])

    assert readers.find_nvml(root) is None
    lib = readers.find_nvml_elsewhere(root)
    assert lib.path == "/usr/lib64/nvidia/libnvidia-ml.so.1"
    assert lib.version == "550.90.07"


def test_nvml_in_an_ld_so_conf_folder_is_found_by_the_loader_search(tmp_path):
    files = dict(case("C09")["files"])
    files["etc/ld.so.conf.d/nvidia.conf"] = "/usr/lib64/nvidia\n"
    root = build_root(tmp_path, files, case("C09")["symlinks"])

    assert readers.find_nvml(root).path == "/usr/lib64/nvidia/libnvidia-ml.so.1"


def test_no_nvml_anywhere(tmp_path):
    (tmp_path / "usr" / "lib").mkdir(parents=True)

    assert readers.find_nvml(Root(tmp_path)) is None
    assert readers.find_nvml_elsewhere(Root(tmp_path)) is None


def test_version_in_finds_the_first_driver_version():
    assert readers.version_in("Fabric Manager version is : 550.54.15\n") == "550.54.15"
    assert readers.version_in("no version") is None


# --- daemons ------------------------------------------------------------------------------------

def daemon_root(tmp_path: Path, pid_text: str, comm: str | None) -> Root:
    write(tmp_path, "var/run/nvidia-persistenced/nvidia-persistenced.pid", pid_text)
    if comm is not None:
        write(tmp_path, "proc/4242/comm", comm)
    return Root(tmp_path)


def test_daemon_pid_when_pid_file_and_comm_agree(tmp_path):
    root = daemon_root(tmp_path, "4242\n", "nvidia-persiste\n")  # comm holds 15 characters

    assert readers.daemon_pid(root, readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM) == 4242


def test_daemon_pid_is_read_from_the_roots_proc_through_var_run_link(tmp_path):
    write(tmp_path, "run/nvidia-persistenced/nvidia-persistenced.pid", "4242\n")
    (tmp_path / "var").mkdir()
    os.symlink("/run", tmp_path / "var" / "run")
    write(tmp_path, "proc/4242/comm", "nvidia-persiste\n")

    assert readers.daemon_pid(Root(tmp_path), readers.PERSISTENCED_PID,
                              readers.PERSISTENCED_COMM) == 4242


def test_daemon_pid_is_none_when_the_pid_is_gone(tmp_path):
    root = daemon_root(tmp_path, "4242\n", None)

    assert readers.daemon_pid(root, readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM) is None


def test_daemon_pid_is_none_for_a_garbled_pid_file(tmp_path):
    root = daemon_root(tmp_path, "42x\n", "nvidia-persiste\n")

    assert readers.daemon_pid(root, readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM) is None


@pytest.mark.parametrize("other", ["sshd", "nvidia-smi"])
def test_daemon_pid_is_none_when_the_pid_now_belongs_to_another_program(tmp_path, other):
    root = daemon_root(tmp_path, "4242\n", other + "\n")

    assert readers.daemon_pid(root, readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM) is None


@pytest.mark.parametrize("other", ["nvidia", "nv"])
def test_daemon_pid_is_none_when_the_pid_belongs_to_a_program_whose_name_is_a_prefix(
        tmp_path, other):
    """A stale pid file whose pid was reused by, say, ``nvidia`` (comm "nvidia") must not read
    as a running nvidia-persistenced: the contract wants comm to *be* the daemon."""
    root = daemon_root(tmp_path, "4242\n", other + "\n")

    assert readers.daemon_pid(root, readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM) is None


# --- nvidia-smi -q: the Fabric section -----------------------------------------------------------

SMI_Q_HEAD = """\

==============NVSMI LOG==============

Timestamp                                 : Mon Nov 30 06:00:00 2026
Driver Version                            : 550.54.15
CUDA Version                              : 12.4

Attached GPUs                             : {count}
"""

SMI_Q_GPU = """\
GPU {pci}
    Product Name                          : NVIDIA H200
    Product Brand                         : NVIDIA
    Display Mode                          : Disabled
    Persistence Mode                      : Enabled
    Addressing Mode                       : None
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    Accounting Mode                       : Disabled
    Driver Model
        Current                           : N/A
        Pending                           : N/A
    GPU UUID                              : GPU-{uuid}
    GPU Reset Status
        Reset Required                    : No
        Drain and Reset Recommended       : No
    Virtualization Mode                   : Pass-Through
    Performance State                     : P0
    Fabric
        State                             : {state}
        Status                            : {status}
        CliqueId                          : 32766
        ClusterUUID                       : 5ab2c3d4-0000-4000-8000-00000000c1a5
        Health
            Bandwidth                     : Full
            Route Recovery in progress    : False
            Route Unhealthy               : False
            Access Timeout Recovery       : False
    Processes                             : None
    Conf Compute Protected Memory Usage
        Total                             : 0 MiB
        Used                              : 0 MiB
        Free                              : 0 MiB
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : No
        Remapping Failure Occurred        : No
"""

PCIS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"]


def smi_q(states: list[tuple[str, str]]) -> str:
    text = SMI_Q_HEAD.format(count=len(states))
    for i, (state, status) in enumerate(states):
        text += "\n" + SMI_Q_GPU.format(pci=PCIS[i], uuid=f"{i:08x}-0000-4000-8000-000000000000",
                                        state=state, status=status)
    return text


def test_parse_fabric_reads_every_gpu_completed_success():
    states = parse_fabric(smi_q([("Completed", "Success")] * 4))

    assert [s.gpu for s in states] == PCIS
    assert all(s.success and s.completed and s.supported for s in states)


def test_parse_fabric_keeps_each_gpus_own_state():
    states = parse_fabric(smi_q([("Completed", "Success"), ("In Progress", "N/A"),
                                         ("Completed", "Failure"), ("Not Started", "N/A")]))

    assert [(s.state, s.status) for s in states] == [
        ("Completed", "Success"), ("In Progress", "N/A"), ("Completed", "Failure"),
        ("Not Started", "N/A")]
    assert [s.success for s in states] == [True, False, False, False]
    assert states[2].completed and not states[2].success


def test_parse_fabric_na_state_is_not_supported():
    states = parse_fabric(smi_q([("N/A", "N/A")] * 2))

    assert len(states) == 2
    assert not any(s.supported for s in states)
    assert not any(s.success for s in states)


def test_parse_fabric_is_not_confused_by_other_state_and_status_labels():
    text = textwrap.dedent("""\
        GPU 00000000:18:00.0
            Performance State                     : P0
            GPU Reset Status
                Reset Required                    : No
            Clocks Event Reasons
                State                             : Active
                Status                            : Throttled
            Fabric
                State                             : In Progress
                Status                            : N/A
            Temperature
                State                             : Completed
                Status                            : Success
        GPU 00000000:2A:00.0
            Clocks Event Reasons
                State                             : Completed
                Status                            : Success
        """)

    states = parse_fabric(text)

    assert [(s.gpu, s.state, s.status) for s in states] == [
        ("00000000:18:00.0", "In Progress", "N/A")]


def test_parse_fabric_of_the_fabric_only_query():
    text = textwrap.dedent("""\

        ==============NVSMI LOG==============

        Timestamp                                 : Mon Nov 30 06:00:00 2026
        Driver Version                            : 550.54.15
        CUDA Version                              : 12.4

        Attached GPUs                             : 2
        GPU 00000000:18:00.0
            Fabric
                State                             : Completed
                Status                            : Success

        GPU 00000000:2A:00.0
            Fabric
                State                             : Completed
                Status                            : Success
        """)

    states = parse_fabric(text)

    assert [s.gpu for s in states] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert all(s.success for s in states)


def test_parse_fabric_of_nothing_is_empty():
    assert parse_fabric("") == []
    assert parse_fabric("No devices were found\n") == []




def test_a_device_minor_with_more_than_digits_is_no_minor(tmp_path):
    """Found by hypothesis (tests/reliability/test_properties.py): ``Device Minor:0A`` read as
    minor 0 would make the node of another GPU."""
    from podvm_gpu.host.fs import Root
    from podvm_gpu.readers import gpu_minor

    info = tmp_path / "proc/driver/nvidia/gpus/0000:00:04.0/information"
    info.parent.mkdir(parents=True)
    for text, minor in (("Device Minor:0A\n", None), ("Device Minor: \t 7\n", 7),
                        ("Device Minor: 3 \nGPU Excluded: No\n", 3), ("Device Minor: 12x\n", None)):
        info.write_text(text)
        assert gpu_minor(Root(str(tmp_path)), "0000:00:04.0") == minor, text
