"""Why the driver cannot attach a GPU, in the kernel log's words plus the facts those words need.

When the module loads but cannot initialise a GPU, every NVML client fails with its own generic
words ("No devices were found", "nvidia-persistenced failed to initialize. Check syslog for more
details."); the kernel log names the cause (host/kmsg.py, ``ATTACH_KINDS``). This module adds what
the log cannot know: the guest's TEE (host/tee.py), the ``swiotlb=`` of the kernel command line,
and which kernel crypto options the open module's SPDM needs but the kernel lacks.
"""

from __future__ import annotations

import re

from podvm_gpu.gpufacts import kernel
from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root, open_regular
from podvm_gpu.readers import kernel_release

# What the open module's SPDM glue needs of the kernel, else it compiles stubs
# (kernel-open/nvidia/internal_crypt_lib.h of open-gpu-kernel-modules; aleph-im/aleph-vm#1271).
LKCA_OPTIONS = ("CONFIG_CRYPTO_AEAD", "CONFIG_CRYPTO_AKCIPHER", "CONFIG_CRYPTO_SKCIPHER",
                "CONFIG_CRYPTO_HASH", "CONFIG_CRYPTO_HMAC", "CONFIG_CRYPTO_ECDH",
                "CONFIG_CRYPTO_ECDSA", "CONFIG_CRYPTO_RSA", "CONFIG_X509_CERTIFICATE_PARSER")
_CONFIG_GZ_LIMIT = 1 << 20  # a kernel's config is ~250 KiB; more is not a kernel config


def kernel_config(root: Root) -> tuple[str, dict[str, str]] | None:
    """The running kernel's build config, ``(where, {CONFIG_X: "y"|"m"|...})``: from
    ``/boot/config-<release>`` or ``/proc/config.gz`` (CONFIG_IKCONFIG_PROC); None when neither
    can be read."""
    release = kernel_release(root)
    text = root.read_text(f"/boot/config-{release}") if release else None
    where = f"/boot/config-{release}"
    if text is None:
        import gzip  # only on this path: a failure the log explains
        import zlib

        where = "/proc/config.gz"
        try:
            with open_regular(root.resolve(where)) as raw, gzip.open(raw) as data:
                text = data.read(_CONFIG_GZ_LIMIT).decode("utf-8", errors="replace")
        except (OSError, EOFError, ValueError, zlib.error):
            return None
    values = dict(re.findall(r"^(CONFIG_\w+)=(\S+)", text, re.M))
    # "# CONFIG_X is not set" is kconfig's explicit no (issue 28 reads CONFIG_FW_LOADER's)
    values.update({k: "n" for k in re.findall(r"^# (CONFIG_\w+) is not set", text, re.M)})
    return where, values


def lkca_cause(root: Root) -> str:
    """What to do about the module's crypto stubs: the LKCA options not set in the kernel's
    config, or (all set) that the module was built with stubs anyway and must be rebuilt."""
    config = kernel_config(root)
    if config is None:
        return ("the kernel's config is not readable (/boot/config-<release>, /proc/config.gz) to "
                "tell which of " + ", ".join(LKCA_OPTIONS) + " it lacks")
    where, values = config
    unset = [name for name in LKCA_OPTIONS if values.get(name) not in ("y", "m")]
    if unset:
        return f"the kernel lacks {', '.join(unset)} ({where}); build the kernel with them"
    return (f"every option it needs is set ({where}), so the module was built with stubs anyway "
            "(its conftest decided at build time): rebuild it against this kernel's headers")


def swiotlb_setting(root: Root) -> str:
    """The ``swiotlb=`` of ``/proc/cmdline``, or that there is none (the kernel's default)."""
    cmdline = root.read_text("/proc/cmdline") or ""
    m = re.search(r"(?:^|\s)(swiotlb=\S+)", cmdline)
    return f"kernel command line {m.group(1)}" if m else "no swiotlb= on the kernel command line " \
                                                          "(the kernel's default size)"


# The driver's words when the kernel handed it no GSP image (kata-containers#11875: a guest kernel
# built without CONFIG_FW_LOADER; request_firmware() then fails at once whatever the files).
NO_GSP_IMAGE = "No firmware image found"
FIRMWARE_LOADER = "CONFIG_FW_LOADER"
_GSP_SUFFIXES = (".bin", ".bin.xz", ".bin.zst")


def gsp_files(root: Root, version: str | None) -> list[str]:
    """The GSP images of driver ``version`` under ``/lib/firmware/nvidia/<version>/`` (host
    paths, sorted; ``gsp*.bin`` plain or compressed as the kernel's loader reads them)."""
    import os

    if not version:
        return []
    folder = f"/lib/firmware/nvidia/{version}"
    try:
        names = os.listdir(root.resolve(folder))
    except OSError:
        return []
    return sorted(f"{folder}/{n}" for n in names
                  if n.startswith("gsp") and n.endswith(_GSP_SUFFIXES)
                  and os.path.isfile(root.resolve(f"{folder}/{n}")))


def firmware_loader_cause(root: Root, finding) -> str | None:
    """When the driver found no GSP image (``RmFetchGspRmImages: No firmware image found``) while
    the images of the loaded driver's version are in the image: the guest kernel's missing
    firmware loader, with its config's word where readable; None otherwise (then "GSP firmware
    missing" is the right advice: the files are not there).

    Args:
        finding: a ``gsp-firmware`` finding of :func:`podvm_gpu.gpufacts.kernel.findings`.
    """
    from podvm_gpu.readers import kernel_module_version

    if finding.kind != "gsp-firmware" or NO_GSP_IMAGE.lower() not in finding.evidence.lower():
        return None
    version = kernel_module_version(root)
    files = gsp_files(root, version)
    if not files:
        return None
    have = ", ".join(files[:2]) + (f" and {len(files) - 2} more" if len(files) > 2 else "")
    said = (f"the driver found no GSP firmware image (kernel: \"{finding.evidence[:160]}\") "
            f"although the images of driver {version} are there ({have})")
    config = kernel_config(root)
    if config is None:
        return (f"{said}: the guest kernel did not hand them over, as a kernel without a firmware "
                f"loader ({FIRMWARE_LOADER}) does; its config is not readable to confirm "
                "(/boot/config-<release>, /proc/config.gz); build the guest kernel with "
                f"{FIRMWARE_LOADER}=y (kata-containers#11875)")
    where, values = config
    if values.get(FIRMWARE_LOADER) in ("y", "m"):
        return (f"{said}; the kernel's config has {FIRMWARE_LOADER}={values[FIRMWARE_LOADER]} "
                f"({where}): see the kernel log for why the loader refused them")
    if values.get(FIRMWARE_LOADER) == "n":
        return (f"{said}: the guest kernel has no firmware loader (# {FIRMWARE_LOADER} is not "
                f"set, {where}); build it with {FIRMWARE_LOADER}=y (kata-containers#11875)")
    return (f"{said}: the guest kernel did not hand them over, as a kernel without a firmware "
            f"loader ({FIRMWARE_LOADER}) does; {where} does not mention it; build the guest "
            f"kernel with {FIRMWARE_LOADER}=y (kata-containers#11875)")


def attach_cause(root: Root, messages: list[str]) -> str | None:
    """The reason the driver cannot attach a GPU, one line, or None when the log (since the
    driver last loaded) names none.

    Args:
        messages: the kernel log (:func:`podvm_gpu.host.kmsg.read_kernel_log`).
    """
    found = kernel.findings(kmsg.since_driver_load(messages))
    by_kind = {f.kind: f for f in reversed(found)}
    gsp = by_kind.get("gsp-firmware")
    loader = firmware_loader_cause(root, gsp) if gsp is not None else None
    if loader:  # issue 28: before RmInitAdapter's generic failure, which follows it
        return loader
    for kind in kernel.ATTACH_KINDS:
        finding = by_kind.get(kind)
        if finding is None:
            continue
        text = kernel.describe(finding)
        if kind in ("cc-not-enabled", "swiotlb-full", "dma-mapping"):
            from podvm_gpu.host import tee

            guest = tee.detect(root)
            text += f"; guest TEE: {guest.describe()}"
        if kind == "cc-not-enabled" and "cannot-attach" in by_kind:
            text += f"; {by_kind['cannot-attach'].what}"
        if kind in ("swiotlb-full", "dma-mapping"):
            other = by_kind.get("dma-mapping" if kind == "swiotlb-full" else "swiotlb-full")
            if other is not None:
                text += f"; {kernel.describe(other)}"
            text += f"; {swiotlb_setting(root)}: give the guest a larger swiotlb= (bounce " \
                    "buffers carry all device DMA in a confidential guest)"
        if kind == "lkca-stubs":
            text += f"; {lkca_cause(root)}"
        return text
    return None


def image_without_loader(root: Root, release: str) -> str | None:
    """``/boot/config-<release>`` when the image kernel's config says ``# CONFIG_FW_LOADER is
    not set``; None when it has one, does not mention it, or is not in the image (no evidence:
    no claim). Read as a bounded regular file."""
    where = f"/boot/config-{release}"
    text = root.read_text(where)
    if text is None or not re.search(r"^# CONFIG_FW_LOADER is not set\s*$", text, re.M):
        return None
    return where


def loader_row(root: Root, releases: list[str]):
    """check --image's ``firmware`` row failing for the first image kernel whose config says it
    has no firmware loader (:func:`image_without_loader`): the GSP files are there, nothing can
    load them; None when no kernel says so."""
    from podvm_gpu.row import FAIL, Check

    for release in releases:
        where = image_without_loader(root, release)
        if where:
            return Check("firmware", FAIL, f"kernel {release} has no firmware loader (# "
                         f"CONFIG_FW_LOADER is not set, {where}): the driver's GSP firmware can "
                         "never be loaded and every GSP GPU fails to attach",
                         "build the guest kernel with CONFIG_FW_LOADER=y")
    return None


def cannot_attach(root: Root, messages: list[str]) -> str | None:
    """check's ``modules`` row: :func:`attach_cause`, else a GPU the driver cannot attach for its
    firmware or a BAR (issue 28: the row passed while the boot failed on them)."""
    cause = attach_cause(root, messages)
    if cause is None:
        cause = next((kernel.describe(f) for f in reversed(kernel.findings(kmsg.since_driver_load(messages)))
                      if f.kind in ("gsp-firmware", "bar")), None)
    return cause
