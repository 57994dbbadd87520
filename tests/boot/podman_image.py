"""The podman test image: the boot-test rootfs plus Debian 12's podman, for qemu boots in which
the kata-agent stand-in starts a container with ``podman run --device nvidia.com/gpu=all``.

A variant of its own (tests/boot/image.py ``Variant``), so the base image's cache stays valid:
``podman`` (4.3.1, with crun and conmon; the real Go CDI library) and ``busybox-static``, whose
``/bin/busybox`` is the container image's only file. The image is imported into the rootfs's
container storage (vfs, as ``/etc/containers/storage.conf`` says) once per test session, in
nspawn, so a boot only runs the container.
"""

from __future__ import annotations

from pathlib import Path

from boot import image

PODMAN_PACKAGES = ("podman", "busybox-static")
PODMAN = image.Variant("podman", "podman-rootfs-", (*image.PACKAGES, *PODMAN_PACKAGES))
IMAGE_NAME = "localhost/podvm-gpu-test:1"


def podman_rootfs() -> Path:
    """The cached podman rootfs; built when the cache lacks it."""
    return image.variant_rootfs(PODMAN)


HOOK_LOG = "/var/log/nvidia-cdi-hook.log"
# The toolkit's CDI hook, which the spec's createContainer hooks name (/usr/bin/nvidia-cdi-hook:
# a hook's path is not under the driver root). The stand-in records each call and succeeds.
HOOK = f"""#!/bin/sh
# stand-in for the NVIDIA Container Toolkit's nvidia-cdi-hook (podman boot tests)
echo "$*" >> {HOOK_LOG}
exit 0
"""
STORAGE_CONF = """# podman boot tests: vfs, no overlay module or fuse needed; the image is tiny
[storage]
driver = "vfs"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
"""


def add_podman(rootfs: Path) -> None:
    """Make ``rootfs`` (a view of :func:`podman_rootfs` with the agent installed) ready for
    podman boots: vfs storage, the local image imported (its only file the image's own
    busybox-static), the hook stand-in."""
    conf = rootfs / "etc/containers/storage.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(STORAGE_CONF)
    hook = rootfs / "usr/bin/nvidia-cdi-hook"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    done = image.nspawn(rootfs, "/bin/sh", "-c",
                        "set -e; mkdir -p /tmp/img/bin; cp /bin/busybox /tmp/img/bin/; "
                        "tar -C /tmp/img -cf /tmp/img.tar bin; "
                        f"podman --events-backend none import /tmp/img.tar {IMAGE_NAME} >/dev/null; "
                        "rm -rf /tmp/img /tmp/img.tar; podman --events-backend none images",
                        timeout=300)
    assert done.returncode == 0 and IMAGE_NAME.split("/", 1)[1].split(":")[0] in done.stdout, (
        f"podman import in the image failed:\n{done.stdout}\n{done.stderr}")


def run_containers(rootfs: Path, *requests: str, probe_module: str = "") -> None:
    """Have the kata-agent stand-in run ``podman run --device REQUEST`` for each request after
    the agent's unit (and ``modprobe PROBE_MODULE`` first, when given)."""
    dropin = rootfs / "etc/systemd/system/kata-agent.service.d/70-podman.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# podman boot tests: the stand-in starts containers as kata-agent would", "[Service]",
             f"Environment=\"KATA_STANDIN_PODMAN={' '.join(requests)}\""]
    if probe_module:
        lines.append(f"Environment=KATA_STANDIN_MODPROBE={probe_module}")
    dropin.write_text("\n".join(lines) + "\n")


def probe_modules(rootfs: Path, module: str) -> None:
    """Have the kata-agent stand-in read kernel.modules_disabled and ``modprobe MODULE``."""
    dropin = rootfs / "etc/systemd/system/kata-agent.service.d/70-modprobe.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("# module lock boot tests: a module loaded after the agent's unit\n"
                      f"[Service]\nEnvironment=KATA_STANDIN_MODPROBE={module}\n")
