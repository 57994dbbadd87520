"""``podvm-gpu check --image`` on image roots (contract section 6): it passes on an image that
has what the agent needs, and fails naming the file when a kernel lacks the nvidia module or the
module's version differs from the user-space driver's.

The image is a directory made like the Packer null build's: the stand-ins of the NVIDIA packages
(tests/boot/nvidia_image.py: real ELF modules with a ``.modinfo`` version, the user-space driver,
the commands) and the agent's units as the installer lays them out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from boot.nvidia_image import VERSION, add_nvidia_driver, depmod, kernel_module

REPO = Path(__file__).resolve().parents[1]


def make_image(root: Path, version: str = VERSION) -> Path:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/sbin").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    modprobe = root / "usr/sbin/modprobe"
    modprobe.write_text("#!/bin/sh\nexit 0\n")
    modprobe.chmod(0o755)
    add_nvidia_driver(root, version)
    units = root / "usr/lib/systemd/system"
    (units / "kata-agent.service.d").mkdir(parents=True)
    shutil.copy(REPO / "systemd/podvm-gpu.service", units)
    shutil.copy(REPO / "systemd/podvm-gpu-watch.service", units)
    shutil.copy(REPO / "systemd/kata-agent.service.d/10-podvm-gpu.conf",
                units / "kata-agent.service.d")
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "podvm-gpu.service").symlink_to("/usr/lib/systemd/system/podvm-gpu.service")
    (wants / "podvm-gpu-watch.service").symlink_to("/usr/lib/systemd/system/podvm-gpu-watch.service")
    return root


def check_image(root: Path) -> tuple[int, dict[str, dict]]:
    # PATH without modinfo: the version is read from the module's .modinfo section itself
    env = {**os.environ, "PATH": str(root / "usr/bin")}
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", "--image", "--root",
                           str(root), "--json"], capture_output=True, text=True, env=env,
                          timeout=60, cwd=REPO)
    doc = json.loads(done.stdout)
    return done.returncode, {c["name"]: c for c in doc["checks"]}


def test_an_image_with_driver_units_and_tools_passes(tmp_path):
    code, checks = check_image(make_image(tmp_path))
    assert code == 0, checks
    assert {name: c["result"] for name, c in checks.items()} == {
        "unit": "pass", "kata-agent-ordering": "pass", "kata-agent-cdi": "skip",
        "tools": "pass", "modules": "pass", "module-flavour": "pass",
        "versions": "pass", "firmware": "pass", "module-compression": "pass",
        "cdi-refresh-units": "pass", "early-gpu-clients": "pass", "watch": "pass", "trust": "pass", "fabric": "skip",
        "attestation-agent-ordering": "skip", "config-compiled": "skip", "attestation": "warn",
        "toolkit": "skip"}  # stand-in binaries no dpkg package lists: versions unknown
    assert VERSION in checks["versions"]["detail"]
    assert f"nvidia/{VERSION}/gsp_ga10x.bin" in checks["firmware"]["detail"]


def test_an_image_without_the_watch_unit_warns_that_a_gpu_failing_after_boot_stays(tmp_path):
    root = make_image(tmp_path)
    (root / "etc/systemd/system/multi-user.target.wants/podvm-gpu-watch.service").unlink()
    code, checks = check_image(root)
    assert code == 0
    assert checks["watch"]["result"] == "warn"
    assert "not enabled" in checks["watch"]["detail"]
    (root / "usr/lib/systemd/system/podvm-gpu-watch.service").unlink()
    assert "not installed" in check_image(root)[1]["watch"]["detail"]


def test_missing_gsp_firmware_fails_naming_the_file_the_module_asks_for(tmp_path):
    root = make_image(tmp_path)
    (root / f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin").unlink()
    code, checks = check_image(root)
    assert code == 1
    assert checks["firmware"]["result"] == "fail"
    assert f"nvidia/{VERSION}/gsp_ga10x.bin" in checks["firmware"]["detail"]
    assert "/updates/dkms/nvidia.ko" in checks["firmware"]["detail"]


def test_compressed_firmware_counts(tmp_path):
    """The kernel's loader reads .xz and .zst firmware (CONFIG_FW_LOADER_COMPRESS)."""
    root = make_image(tmp_path)
    plain = root / f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"
    plain.rename(plain.with_name(plain.name + ".zst"))
    code, checks = check_image(root)
    assert checks["firmware"]["result"] == "pass", checks["firmware"]


def test_a_kernel_without_the_nvidia_module_fails_naming_its_folder(tmp_path):
    root = make_image(tmp_path)
    (root / "boot/vmlinuz-6.1.0-newer-amd64").write_bytes(b"")
    code, checks = check_image(root)
    assert code == 1
    assert checks["modules"]["result"] == "fail"
    assert "/lib/modules/6.1.0-newer-amd64" in checks["modules"]["detail"]
    assert checks["modules"]["hint"]


def test_modules_of_another_version_than_user_space_fail_naming_the_module_file(tmp_path):
    root = make_image(tmp_path)
    lib = root / "usr/lib/x86_64-linux-gnu"
    (lib / "libnvidia-ml.so.1").unlink()
    (lib / "libnvidia-ml.so.550.90.07").write_bytes(b"")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.90.07")
    code, checks = check_image(root)
    assert code == 1
    versions = checks["versions"]
    assert versions["result"] == "fail"
    assert "/updates/dkms/nvidia.ko" in versions["detail"]
    assert VERSION in versions["detail"] and "550.90.07" in versions["detail"]


def test_enabled_refresh_units_fail_the_image(tmp_path):
    root = make_image(tmp_path)
    unit = root / "usr/lib/systemd/system/nvidia-cdi-refresh.path"
    unit.write_text("[Path]\nPathChanged=/lib/modules\n[Install]\nWantedBy=multi-user.target\n")
    (root / "etc/systemd/system/multi-user.target.wants/nvidia-cdi-refresh.path").symlink_to(
        "/usr/lib/systemd/system/nvidia-cdi-refresh.path")
    code, checks = check_image(root)
    assert code == 1
    assert checks["cdi-refresh-units"]["result"] == "fail"


def test_a_modules_load_file_loading_nvidia_drm_fails_an_image_serving_confidential_vms(tmp_path):
    # issue 46: systemd-modules-load loads the driver before the agent's persistenced
    root = make_image(tmp_path)
    (root / "etc/modules-load.d").mkdir(parents=True)
    (root / "etc/modules-load.d/nvidia-drm.conf").write_text("# KMS\nnvidia-drm\n")
    code, checks = check_image(root)
    assert checks["early-gpu-clients"]["result"] == "warn"
    assert "/etc/modules-load.d/nvidia-drm.conf loads nvidia_drm" in \
        checks["early-gpu-clients"]["detail"]
    config = root / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("confidential_computing:\n  image_serves: true\n")
    code, checks = check_image(root)
    assert code == 1 and checks["early-gpu-clients"]["result"] == "fail"


def test_a_config_others_may_write_fails_the_image_and_one_owned_by_the_builder_warns(tmp_path):
    """Boot refuses both (it runs the tools a config names as root); at build time a file of an
    unprivileged builder is its own until the image is packed, so ownership only warns."""
    root = make_image(tmp_path)
    config = root / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("tools: {nvidia-ctk: /usr/bin/nvidia-ctk}\n")
    config.chmod(0o644)
    os.chown(config, 1000, 1000)

    code, checks = check_image(root)
    assert code == 0 and checks["trust"]["result"] == "warn", checks["trust"]
    assert "/etc/podvm-gpu/config.yaml: it is owned by uid 1000" in checks["trust"]["detail"]

    (root / "usr/bin/nvidia-ctk").chmod(0o777)
    code, checks = check_image(root)
    assert code == 1 and checks["trust"]["result"] == "fail", checks["trust"]
    assert "/usr/bin/nvidia-ctk: it is writable by group or others (mode 0777)" in \
        checks["trust"]["detail"]


def test_a_module_that_modules_dep_does_not_list_fails_asking_for_depmod(tmp_path):
    """kmod looks modules up in modules.dep: a module installed after the last depmod is not
    found by modprobe (as Debian's real kmod 30 shows, tests/test_kmod.py)."""
    root = make_image(tmp_path)
    kernel = next((root / "lib/modules").iterdir())
    (kernel / "modules.dep").write_text("kernel/drivers/net/virtio_net.ko:\n")
    code, checks = check_image(root)
    assert code == 1
    assert "is not in modules.dep" in checks["modules"]["detail"], checks["modules"]
    assert checks["modules"]["hint"] == f"run depmod {kernel.name} in the image"


def test_a_module_whose_modinfo_cannot_be_read_is_not_a_pass(tmp_path):
    """Found by a newcomer: without ``modinfo`` on the checking machine, a module the agent
    could not read (garbage, or compressed in a way Python cannot open) passed ``firmware`` as
    "asks for no firmware files", and ``versions`` hinted at a driver rebuild. Both now say the
    file could not be read."""
    root = make_image(tmp_path)
    module = next(root.glob("lib/modules/*/updates/dkms/nvidia.ko"))
    module.write_bytes(b"\x7fELF not really a module")
    code, checks = check_image(root)
    assert code == 1
    assert checks["firmware"]["result"] == "fail", checks["firmware"]
    assert "cannot read the .modinfo of " in checks["firmware"]["detail"], checks["firmware"]
    assert checks["versions"]["result"] == "fail", checks["versions"]
    assert checks["versions"]["detail"].startswith("cannot read the version of module "), checks["versions"]
    assert "modinfo" in checks["versions"]["hint"]


def test_an_xz_compressed_module_is_read_without_modinfo(tmp_path):
    """Distribution kernels compress their modules (``.ko.xz``); the agent reads them itself
    when the checking machine has no ``modinfo``."""
    import lzma

    root = make_image(tmp_path)
    module = next(root.glob("lib/modules/*/updates/dkms/nvidia.ko"))
    module.with_name("nvidia.ko.xz").write_bytes(lzma.compress(module.read_bytes()))
    module.unlink()
    depmod(root, module.parents[2].name)  # as DKMS does after installing modules
    code, checks = check_image(root)
    assert checks["modules"]["result"] == "pass", checks["modules"]
    assert checks["versions"]["result"] == "pass", checks["versions"]
    assert checks["firmware"]["result"] == "pass" and "gsp" in checks["firmware"]["detail"], checks
    assert code == 0, checks


# --- module-compression: the xz check type each kernel's decompressor takes --------------------

# The module-compression lines of the real kernel configs of Debian 13 (6.12.117+deb13-cloud-amd64)
# and Debian 12 (6.1.0-50-cloud-amd64), as their /boot/config-<release> have them.
DEBIAN13_CONFIG = """CONFIG_MODULE_COMPRESS=y
# CONFIG_MODULE_COMPRESS_GZIP is not set
CONFIG_MODULE_COMPRESS_XZ=y
# CONFIG_MODULE_COMPRESS_ZSTD is not set
CONFIG_MODULE_COMPRESS_ALL=y
CONFIG_MODULE_DECOMPRESS=y
CONFIG_XZ_DEC=y
"""
DEBIAN12_CONFIG = """CONFIG_MODULE_COMPRESS_NONE=y
# CONFIG_MODULE_COMPRESS_GZIP is not set
# CONFIG_MODULE_COMPRESS_XZ is not set
# CONFIG_MODULE_COMPRESS_ZSTD is not set
CONFIG_XZ_DEC=y
"""
# What `xz --check=...` takes and what `xz --list` then calls it.
XZ_CHECKS = {"none": "None", "crc32": "CRC32", "crc64": "CRC64", "sha256": "SHA-256"}


def xz_modules(root: Path, check: str, kernel: str | None = None) -> list[Path]:
    """Compress the image's nvidia modules with the real xz, ``--check=check``, as a DKMS or
    akmods build does (``nvidia.ko`` -> ``nvidia.ko.xz``)."""
    modules = sorted(root.glob(f"lib/modules/{kernel or '*'}/updates/dkms/nvidia*.ko"))
    subprocess.run(["xz", f"--check={check}", "-T1", *map(str, modules)], check=True, timeout=60)
    made = [m.with_name(m.name + ".xz") for m in modules]
    listed = subprocess.run(["xz", "--robot", "--list", str(made[0])], capture_output=True,
                            text=True, check=True).stdout
    assert f"\t{XZ_CHECKS[check]}\t" in listed, listed  # the real xz wrote that check type
    for release in sorted({m.parents[2].name for m in made}):
        depmod(root, release)  # as the build does after installing modules
    return made


def two_kernel_image(root: Path) -> Path:
    """An image with a Debian 13 kernel (in-kernel xz decompression) and a Debian 12 one."""
    (root / "boot").mkdir(parents=True)
    for release, config in (("6.12.117+deb13-cloud-amd64", DEBIAN13_CONFIG),
                            ("6.1.0-50-cloud-amd64", DEBIAN12_CONFIG)):
        (root / f"boot/vmlinuz-{release}").write_bytes(b"")
        (root / f"boot/config-{release}").write_text(config)
    return make_image(root)


@pytest.mark.parametrize("check, result", [("crc64", "fail"), ("sha256", "fail"),
                                           ("crc32", "pass"), ("none", "pass")])
def test_an_xz_check_type_the_kernel_does_not_take_fails_where_the_kernel_decompresses(
        tmp_path, check, result):
    """ublue-os/akmods#318: user-space xz's default CRC64 makes the in-kernel decompressor of a
    CONFIG_MODULE_DECOMPRESS kernel fail with status 6; Debian 12's 6.1 lets kmod decompress."""
    root = two_kernel_image(tmp_path)
    xz_modules(root, check)
    code, checks = check_image(root)
    row = checks["module-compression"]
    assert row["result"] == result, row
    if result == "fail":
        assert code == 1
        assert row["detail"].startswith("kernel 6.12.117+deb13-cloud-amd64: /lib/modules/6.12.117+"
                                        "deb13-cloud-amd64/updates/dkms/nvidia"), row
        assert f"has xz check {XZ_CHECKS[check]}" in row["detail"]
        assert "CONFIG_MODULE_DECOMPRESS=y" in row["detail"] and "status 6" in row["detail"]
        assert "6.1.0-50" not in row["detail"], "Debian 12's kernel decompresses in user space"
        assert "--check=crc32" in row["hint"] and "zstd" in row["hint"]
    else:
        assert f"check {XZ_CHECKS[check]}" in row["detail"], row
        assert code == 0, checks


def test_crc64_is_fine_on_a_kernel_whose_kmod_decompresses_in_user_space(tmp_path):
    root = two_kernel_image(tmp_path)
    xz_modules(root, "crc64", kernel="6.1.0-50-cloud-amd64")
    code, checks = check_image(root)
    row = checks["module-compression"]
    assert row["result"] == "pass", row
    assert "6.1.0-50-cloud-amd64: " in row["detail"] and "CRC64" in row["detail"]
    assert "fine there" in row["detail"] and "user space" in row["detail"]


def test_crc64_without_the_kernels_config_is_a_warning(tmp_path):
    root = make_image(tmp_path)
    xz_modules(root, "crc64")
    code, checks = check_image(root)
    row = checks["module-compression"]
    assert row["result"] == "warn", row
    assert "CRC64" in row["detail"] and "no /boot/config-6.1.0-podvm-amd64" in row["detail"]
    assert "--check=crc32" in row["hint"]


def test_a_ko_xz_that_is_not_an_xz_stream_fails(tmp_path):
    root = two_kernel_image(tmp_path)
    module = next(root.glob("lib/modules/6.12*/updates/dkms/nvidia.ko"))
    module.with_name("nvidia.ko.xz").write_bytes(module.read_bytes())  # named .xz, not xz
    module.unlink()
    code, checks = check_image(root)
    row = checks["module-compression"]
    assert row["result"] == "fail" and "nvidia.ko.xz: not an xz stream" in row["detail"], row


@pytest.mark.slow
def test_a_real_debian_13_kernel_and_its_own_modules():
    """The real Debian 13 rootfs the boot tests use (tests/boot/image.py ``TRIXIE_BASE``: waited
    for on its build lock, or built, as every other image test does; issue 29 item 29: this test
    once skipped when it ran before the image existed): its kernel decompresses xz in the
    kernel, and its own modules (kbuild's) carry CRC32."""
    from boot import image

    from podvm_gpu.host.fs import Root
    from podvm_gpu.steps.modules import modcompress

    rootfs = image.variant_rootfs(image.TRIXIE_BASE)
    configs = sorted(rootfs.glob("boot/config-6.12*"))
    assert configs, f"no Debian 13 kernel config in {rootfs}/boot"
    config = configs[0]
    root = Root(str(rootfs))
    release = config.name.removeprefix("config-")
    in_kernel, why = modcompress.kernel_decompresses_xz(root, release)
    assert in_kernel is True, why
    module = next(config.parents[1].glob(f"lib/modules/{release}/kernel/drivers/net/dummy.ko.xz"))
    assert modcompress.xz_check(str(module)) == 0x01  # CRC32


def test_the_xz_header_is_read_as_the_format_says(tmp_path):
    """Twelve bytes: magic, stream flags (check ID in the low nibble), their CRC32."""
    from podvm_gpu.steps.modules import modcompress

    plain = tmp_path / "m.ko"
    plain.write_bytes(b"\0" * 100)
    subprocess.run(["xz", "--check=sha256", str(plain)], check=True)
    made = tmp_path / "m.ko.xz"
    assert modcompress.xz_check(str(made)) == 0x0A
    data = bytearray(made.read_bytes())
    data[7] ^= 0x01  # the check ID changed, the header's CRC32 not
    made.write_bytes(bytes(data))
    assert "CRC32 does not match" in modcompress.xz_check(str(made))
    made.write_bytes(bytes(data[:7]))
    assert "not an xz stream" in modcompress.xz_check(str(made))


IB_MODULES = {"mlx5_core": "drivers/net/ethernet/mellanox/mlx5/core",
              "mlx5_ib": "drivers/infiniband/hw/mlx5", "ib_umad": "drivers/infiniband/core"}


def add_nvlink5(root: Path, fm_version: str = VERSION, nvlsm: bool = True) -> Path:
    """What an NVLink 5 VM needs beyond the driver: the IB modules for every kernel, nvlsm and
    its config, nv-fabricmanager and its dpkg record (the version the row reads)."""
    for kernel in (k.name.removeprefix("vmlinuz-") for k in (root / "boot").glob("vmlinuz-*")):
        for name, folder in IB_MODULES.items():
            path = root / f"lib/modules/{kernel}/kernel/{folder}/{name}.ko"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(kernel_module(name, kernel))
        depmod(root, kernel)  # as the kernel package does
    tools = ["nv-fabricmanager"] + (["nvlsm"] if nvlsm else [])
    for tool in tools:
        path = root / "usr/bin" / tool
        path.write_text("#!/bin/sh\nexit 1\n")
        path.chmod(0o755)
    conf = root / "usr/share/nvidia/nvlsm/nvlsm.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("log_flags 0x03\n")
    dpkg = root / "var/lib/dpkg/status"
    dpkg.parent.mkdir(parents=True, exist_ok=True)
    dpkg.write_text("Package: kmod\nStatus: install ok installed\nVersion: 30+20221128-1\n\n"
                    f"Package: nvidia-fabricmanager-{fm_version.split('.')[0]}\n"
                    f"Status: install ok installed\nVersion: {fm_version}-1\n")
    return root


def serving_nvlink5(root: Path) -> Path:
    config = root / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("nvlink5:\n  image_serves: true\n")
    return root


def test_an_image_for_nvlink5_vms_passes_the_fabric_row(tmp_path):
    code, checks = check_image(add_nvlink5(make_image(tmp_path)))
    assert checks["fabric"]["result"] == "pass", checks["fabric"]
    assert "mlx5_core, mlx5_ib, ib_umad" in checks["fabric"]["detail"]
    assert f"nv-fabricmanager {VERSION}" in checks["fabric"]["detail"]


def test_an_image_without_nvlink5_parts_skips_naming_them_unless_it_says_it_serves_them(tmp_path):
    # issue 35 item 9: a warn whose advice was "nothing to do" on every default image
    code, checks = check_image(make_image(tmp_path / "plain"))
    row = checks["fabric"]
    assert (code, row["result"]) == (0, "skip"), row
    for lacking in ("mlx5_core, mlx5_ib, ib_umad for kernel", "nvlsm", "nv-fabricmanager",
                    "image_serves is false"):
        assert lacking in row["detail"], row
    code, checks = check_image(serving_nvlink5(make_image(tmp_path / "serving")))
    assert (code, checks["fabric"]["result"]) == (1, "fail"), checks["fabric"]
    assert "image_serves is true" in checks["fabric"]["detail"]


@pytest.mark.parametrize("change, lacking", [
    ({"fm_version": "550.90.07"}, f"the fabric manager of driver {VERSION} (nv-fabricmanager is 550.90.07)"),
    ({"nvlsm": False}, "nvlsm (the nvlsm package"),
])
def test_an_image_serving_nvlink5_fails_on_each_missing_part(tmp_path, change, lacking):
    code, checks = check_image(serving_nvlink5(add_nvlink5(make_image(tmp_path), **change)))
    assert (code, checks["fabric"]["result"]) == (1, "fail"), checks["fabric"]
    assert lacking in checks["fabric"]["detail"]


def test_an_ib_module_one_kernel_lacks_is_named_with_that_kernel(tmp_path):
    root = make_image(tmp_path)
    (root / "boot/vmlinuz-6.12.0-other").write_bytes(b"")
    add_nvlink5(root)
    shutil.rmtree(root / "lib/modules/6.12.0-other/kernel/drivers/infiniband")
    depmod(root, "6.12.0-other")  # the index says what is there (kmod reads nothing else)
    code, checks = check_image(serving_nvlink5(root))
    assert checks["fabric"]["result"] == "fail"
    assert "IB module(s) mlx5_ib, ib_umad for kernel 6.12.0-other" in checks["fabric"]["detail"]


def test_the_fabric_row_s_hint_never_asks_for_the_default_it_already_has(tmp_path):
    # issue 29 item 19: the warning's hint said "set nvlink5.image_serves: false", the default
    code, checks = check_image(make_image(tmp_path / "plain"))
    hint = checks["fabric"]["hint"]
    assert "image_serves: false" not in hint, hint
    assert hint.startswith("for an image that serves NVLink 5 VMs (HGX B200/B300), install")
    assert "set nvlink5.image_serves: true so that this row fails until it has them" in hint
    code, checks = check_image(serving_nvlink5(make_image(tmp_path / "serving")))
    assert checks["fabric"]["hint"].startswith("install the IB modules for every kernel")
    assert "image_serves" not in checks["fabric"]["hint"]


def test_the_fabric_row_never_says_driver_question_mark_without_a_user_space_driver(tmp_path):
    root = make_image(tmp_path)
    for lib in (root / "usr/lib/x86_64-linux-gnu").glob("libnvidia-ml.so*"):
        lib.unlink()
    code, checks = check_image(root)
    detail = checks["fabric"]["detail"]
    assert "driver ?" not in detail, detail
    assert "nv-fabricmanager (the fabric manager of the user-space driver's release; the image " \
           "has no libnvidia-ml.so.1 to tell which)" in detail


def test_attestation_row_warns_without_nvattest_and_fails_when_the_image_serves_cc(tmp_path):
    """check --image's attestation row (podvm_gpu/steps/cc/attest/check.py): nvattest and, for
    Protected PCIe, libnvidia-nscq.so.2; confidential_computing.image_serves makes a lack fail."""
    root = make_image(tmp_path)
    code, checks = check_image(root)
    assert checks["attestation"]["result"] == "warn"
    assert "nvattest" in checks["attestation"]["detail"]
    # issue 35 item 9: the hint asked for image_serves: false, which the image already had
    hint = checks["attestation"]["hint"]
    assert "image_serves: false" not in hint, hint
    assert "set confidential_computing.image_serves: true so that this row fails" in hint
    config = root / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("confidential_computing: {image_serves: true}\n")
    code, checks = check_image(root)
    assert code == 1 and checks["attestation"]["result"] == "fail"
    assert "confidential_computing.image_serves is true" in checks["attestation"]["detail"]
    tool = root / "usr/bin/nvattest"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
    (root / "usr/lib/x86_64-linux-gnu/libnvidia-nscq.so.2").write_text("")
    code, checks = check_image(root)
    assert checks["attestation"]["result"] == "pass", checks["attestation"]


def test_libnvidia_nscq_is_required_only_by_an_image_that_serves_protected_pcie(tmp_path):
    """Issue 37 item 7: libnvidia-nscq is the NVSwitches' evidence, needed in Protected PCIe
    only; the image's config says so (confidential_computing.image_serves_protected_pcie)."""
    root = make_image(tmp_path)
    tool = root / "usr/bin/nvattest"
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    config = root / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("confidential_computing: {image_serves: true}\n")
    code, checks = check_image(root)
    assert checks["attestation"]["result"] == "pass", checks["attestation"]
    assert "image_serves_protected_pcie is false" in checks["attestation"]["detail"]
    config.write_text("confidential_computing: {image_serves: true, "
                      "image_serves_protected_pcie: true}\n")
    code, checks = check_image(root)
    assert code == 1 and checks["attestation"]["result"] == "fail"
    assert "libnvidia-nscq.so.2 (Protected PCIe: confidential_computing." \
           "image_serves_protected_pcie is true)" in checks["attestation"]["detail"]


def test_an_image_kernel_without_a_firmware_loader_fails_the_firmware_row(tmp_path):
    """Issue 28, kata-containers#11875: the GSP files are there, but the image's kernel was built
    without CONFIG_FW_LOADER, so the driver never gets them."""
    from boot.nvidia_image import KERNEL

    root = make_image(tmp_path)
    config = root / f"boot/config-{KERNEL}"
    config.write_text("CONFIG_MODULES=y\n# CONFIG_FW_LOADER is not set\n")
    code, checks = check_image(root)
    assert code == 1
    assert checks["firmware"]["result"] == "fail"
    assert f"kernel {KERNEL} has no firmware loader" in checks["firmware"]["detail"]
    assert f"/boot/config-{KERNEL}" in checks["firmware"]["detail"]
    config.write_text("CONFIG_MODULES=y\nCONFIG_FW_LOADER=y\n")
    code, checks = check_image(root)
    assert checks["firmware"]["result"] == "pass", checks["firmware"]


def test_an_image_without_any_kernel_or_module_skips_module_compression(tmp_path):
    """Issue 47 item 12: it passed ("no nvidia module is xz-compressed") as if it had looked."""
    root = tmp_path / "empty"
    (root / "usr/bin").mkdir(parents=True)
    _, checks = check_image(root)
    assert checks["module-compression"]["result"] == "skip", checks["module-compression"]
    assert checks["firmware"]["result"] == "skip"
