"""Which trusted execution environment this guest runs in, from the kernel's own interfaces.

Read under the root (contract section 1), so tests drive it with files in a fake root. The
evidence, strongest first:

- ``/proc/cpuinfo`` flags: ``tdx_guest`` (arch/x86/include/asm/cpufeatures.h,
  X86_FEATURE_TDX_GUEST, set by tdx_early_init) and ``sev_snp`` (X86_FEATURE_SEV_SNP);
- ``/sys/bus/platform/devices/sev-guest``: the platform device an SNP guest's kernel registers
  for the sev-guest driver (arch/x86/coco/sev);
- ``/dev/tdx_guest`` and ``/dev/sev-guest``, or their ``/sys/devices/virtual/misc/`` entries:
  the attestation devices of drivers/virt/coco/tdx-guest and sev-guest. Their modules may load
  after the agent starts, so their absence proves nothing.

NVRC (NVIDIA/nvrc) asked CPUID before its commit 5a22dcc; the kernel's flags say the same
without an instruction Python cannot issue. Nothing here proves a guest is *not* confidential:
``kind`` None means "no evidence".
"""

from __future__ import annotations

from podvm_gpu.host.fs import Root

TDX, SEV_SNP = "tdx", "sev-snp"
NAMES = {TDX: "Intel TDX", SEV_SNP: "AMD SEV-SNP"}
_FLAGS = {"tdx_guest": TDX, "sev_snp": SEV_SNP}
_PATHS = (("/sys/bus/platform/devices/sev-guest", SEV_SNP),
          ("/dev/tdx_guest", TDX), ("/sys/devices/virtual/misc/tdx_guest", TDX),
          ("/dev/sev-guest", SEV_SNP), ("/sys/devices/virtual/misc/sev-guest", SEV_SNP))


class Tee:
    """What the kernel says about the guest's TEE.

    Attributes:
        kind: ``tdx``, ``sev-snp`` or None (no evidence either way).
        evidence: where it was read, e.g. ``["/proc/cpuinfo flag tdx_guest"]``.
    """

    __slots__ = ("kind", "evidence")

    def __init__(self, kind: str | None, evidence: list[str]):
        self.kind, self.evidence = kind, evidence

    @property
    def name(self) -> str:
        """``Intel TDX``, ``AMD SEV-SNP``, or ``unknown``."""
        return NAMES.get(self.kind or "", "unknown")

    def describe(self) -> str:
        """``Intel TDX (/proc/cpuinfo flag tdx_guest)``, or ``no TEE evidence``."""
        if self.kind is None:
            return "no TEE evidence in /proc/cpuinfo, /sys or /dev"
        return f"{self.name} ({', '.join(self.evidence)})"


def cpu_flags(root: Root) -> set[str]:
    """The first ``flags`` line of ``/proc/cpuinfo`` (every CPU lists the same), as a set."""
    for line in (root.read_text("/proc/cpuinfo") or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return set()


def detect(root: Root) -> Tee:
    """The guest's TEE from the flags, then /sys and /dev (see the module docstring)."""
    flags = cpu_flags(root)
    for flag, kind in _FLAGS.items():
        if flag in flags:
            return Tee(kind, [f"/proc/cpuinfo flag {flag}"])
    for path, kind in _PATHS:
        if root.exists(path):
            return Tee(kind, [path])
    return Tee(None, [])
