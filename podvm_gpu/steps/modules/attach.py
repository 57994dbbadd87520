"""Why the driver cannot attach a GPU, in the kernel log's words plus the facts those words need.

When the module loads but cannot initialise a GPU, every NVML client fails with its own generic
words ("No devices were found", "nvidia-persistenced failed to initialize. Check syslog for more
details."); the kernel log names the cause (host/kmsg.py, ``ATTACH_KINDS``). This module adds what
the log cannot know: the guest's TEE (host/tee.py), the ``swiotlb=`` of the kernel command line,
and which kernel crypto options the open module's SPDM needs but the kernel lacks.
"""

from __future__ import annotations

import re

from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root
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

        where = "/proc/config.gz"
        try:
            with open(root.resolve(where), "rb") as raw, gzip.open(raw) as data:
                text = data.read(_CONFIG_GZ_LIMIT).decode("utf-8", errors="replace")
        except (OSError, EOFError, ValueError):
            return None
    values = dict(re.findall(r"^(CONFIG_\w+)=(\S+)", text, re.M))
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


def attach_cause(root: Root, messages: list[str]) -> str | None:
    """The reason the driver cannot attach a GPU, one line, or None when the log (since the
    driver last loaded) names none.

    Args:
        messages: the kernel log (:func:`podvm_gpu.host.kmsg.read_kernel_log`).
    """
    found = kmsg.findings(kmsg.since_driver_load(messages))
    by_kind = {f.kind: f for f in reversed(found)}
    for kind in kmsg.ATTACH_KINDS:
        finding = by_kind.get(kind)
        if finding is None:
            continue
        text = finding.describe()
        if kind in ("cc-not-enabled", "swiotlb-full", "dma-mapping"):
            from podvm_gpu.host import tee

            guest = tee.detect(root)
            text += f"; guest TEE: {guest.describe()}"
        if kind == "cc-not-enabled" and "cannot-attach" in by_kind:
            text += f"; {by_kind['cannot-attach'].summary}"
        if kind in ("swiotlb-full", "dma-mapping"):
            other = by_kind.get("dma-mapping" if kind == "swiotlb-full" else "swiotlb-full")
            if other is not None:
                text += f"; {other.describe()}"
            text += f"; {swiotlb_setting(root)}: give the guest a larger swiotlb= (bounce " \
                    "buffers carry all device DMA in a confidential guest)"
        if kind == "lkca-stubs":
            text += f"; {lkca_cause(root)}"
        return text
    return None
