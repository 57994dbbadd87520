"""The GPUs' confidential-computing classification: one value that boot, check, status and metrics
share, and the one decision made from it.

What a finding holds comes from four queries, each judged by its exit status before its words
(nvidia-smi 535.261.03 to 555.58.02, ../shared/nvidia-smi-real.md; NVML's
``nvmlSystemGetConfComputeState`` and ``nvmlSystemGetConfComputeSettings`` for the exporter):

- ``conf-compute -f``: ``CC status: ON|OFF``, the CC feature (the only words it has: dev-tools
  mode is never shown here);
- ``conf-compute -d``: ``DevTools Mode: ON|OFF``, the GPU's CC firmware with its debug
  interfaces open, for development only;
- ``conf-compute -e``: ``CC Environment: UNAVAILABLE|INTERNAL|PRODUCTION``;
- ``conf-compute -mgm`` (550 and later): ``Multi-GPU Mode: None|Protected PCIe``; 535 answers
  ``Option "-mgm" is not recognized.`` with exit 2: no multi-GPU mode, never a failure.

Exit 15 (``NVML_ERROR_GPU_IS_LOST``) is a lost GPU, even where the words say ``No CC capable
devices found.``; exit 6 with those words is a GPU without CC; exit 9 is a driver that does not
answer. 535 prints ``CC status: OFF`` / ``CC Environment: UNAVAILABLE`` with exit 0 when its CC
query fails, so on 535 an OFF with an UNAVAILABLE environment does not prove CC is off.

The decision (:func:`decide`, issue 25), in this order: a driver that does not answer or a lost
GPU fails; an unknown CC status fails (never read as off); dev-tools on fails unless
``allow_devtools``; CC on, or CC off with Protected PCIe, is a confidential GPU (an unreadable
``-d``/``-e`` then fails closed in a confidential guest and warns elsewhere); anything else is
not confidential: it fails in a confidential guest (host/tee.py's evidence) unless
``allow_cc_off``, and is ``skipped`` on a regular VM.

Plain classes, no ``dataclasses``: ``podvm-gpu metrics`` imports this module, and
``import dataclasses`` costs its start-up several milliseconds (readers.py says the same).
"""

from __future__ import annotations

from podvm_gpu.gpufacts import ask, judge, words
from podvm_gpu.gpufacts.smi import smi_unrecognized_option

# The queries, by their short option (the shared cases answer these and the long forms).
QUERIES = ("-f", "-d", "-e", "-mgm")
NOT_CAPABLE_TEXT = "no cc capable devices found"

# decide() outcomes
FAIL, SKIP, CONFIDENTIAL, DEVTOOLS = "fail", "skip", "confidential", "devtools"

FIX_HOST = ("set the GPU's CC mode on the host (NVIDIA gpu-admin-tools: --set-cc-mode=on, or "
            "--set-ppcie-mode=on for Protected PCIe on HGX), or accept it with "
            "confidential_computing.allow_cc_off: true")


class CcAnswers:
    """What the GPUs' CC queries said.

    Attributes:
        mode: ``on``, ``off``, another value as printed (lowercased), or None (unreadable).
        devtools: dev-tools mode, True/False, or None (unreadable).
        environment: ``PRODUCTION``, ``INTERNAL``, ``UNAVAILABLE``, or None (unreadable).
        multi_gpu: judge.MGM_NONE, judge.MGM_PPCIE, judge.MGM_NOT_OFFERED (535), another
            value, or None (unreadable).
        capable: False when the GPUs are not CC capable (``No CC capable devices found.``,
            exit 6).
        lost: what was said of a lost GPU (exit 15), or None.
        no_driver: what was said when the driver did not answer (exit 9), or None.
        unreadable: query (``-f``, ``-d``, ...) -> ``exit N: words`` for each one that failed.
    """

    __slots__ = ("mode", "devtools", "environment", "multi_gpu", "capable", "lost", "no_driver",
                 "unreadable")

    def __init__(self, mode=None, devtools=None, environment=None, multi_gpu=None,
                 capable=True, lost=None, no_driver=None, unreadable=None):
        self.mode, self.devtools, self.environment = mode, devtools, environment
        self.multi_gpu, self.capable, self.lost, self.no_driver = multi_gpu, capable, lost, no_driver
        self.unreadable: dict[str, str] = dict(unreadable or {})

    @property
    def confidential(self) -> bool:
        """CC on, or CC off with Protected PCIe (the 8-GPU HGX multi-GPU mode)."""
        return self.capable and (self.mode == "on" or (self.mode == "off"
                                                       and self.multi_gpu == judge.MGM_PPCIE))

    @property
    def label(self) -> str | None:
        """``off``, ``on``, ``devtools``, ``ppcie`` (metrics' ``podvm_gpu_cc_mode``, status,
        check), ``unsupported`` (not CC capable), or None (unknown): the one labelling
        (gpufacts/judge.py ``cc_label``), which the NVML back end uses too."""
        return judge.cc_label(self.capable, self.mode, self.devtools, self.multi_gpu)

    @property
    def off_unproven(self) -> bool:
        """CC OFF with environment UNAVAILABLE from an nvidia-smi that may be 535 (no ``-mgm``,
        or ``-mgm`` unreadable): what 535 prints when its CC query fails. 550 and later print
        ``Failed to display ...`` with the error's exit status instead, so there the words
        mean what they say."""
        return (self.mode == "off" and self.environment == "UNAVAILABLE"
                and self.multi_gpu in (judge.MGM_NOT_OFFERED, None))

    def _words(self) -> list[str]:
        mgm = {judge.MGM_NONE: "None", judge.MGM_PPCIE: "Protected PCIe",
               judge.MGM_NOT_OFFERED: "not offered by this nvidia-smi"}.get(
            self.multi_gpu or "", self.multi_gpu)
        devtools = "unreadable" if self.devtools is None else "ON" if self.devtools else "OFF"
        return [f"CC status: {(self.mode or 'unreadable').upper()}",
                f"DevTools Mode: {devtools}",
                f"CC Environment: {self.environment or 'unreadable'}",
                f"Multi-GPU Mode: {mgm or 'unreadable'}"]

    def mode_words(self) -> str:
        """``CC status: OFF, Multi-GPU Mode: None``: the two answers that make the mode."""
        words = self._words()
        return f"{words[0]}, {words[3]}"

    def describe(self) -> str:
        """``CC status: ON, DevTools Mode: OFF, CC Environment: PRODUCTION, Multi-GPU Mode:
        None``, in nvidia-smi's words, ``unreadable`` for a query that failed."""
        if not self.capable:
            return "No CC capable devices found."
        return ", ".join(self._words())

    def to_dict(self) -> dict:
        """The status document's ``confidential_computing`` object (docs/interface.md 4.1)."""
        return {"mode": self.label, "cc_status": self.mode, "devtools": self.devtools,
                "environment": self.environment, "multi_gpu_mode": self.multi_gpu,
                "confidential": self.confidential, "unreadable": dict(self.unreadable)}


def from_smi(answers: dict) -> CcAnswers:
    """The finding from nvidia-smi's answers, each judged by its exit status first.

    Args:
        answers: query (:data:`QUERIES`) -> ``(returncode, stdout + stderr)``; a query left
            out is unreadable (``not asked``).
    """
    finding = CcAnswers()
    for query in QUERIES:
        rc, text = answers.get(query, (None, "not asked"))
        lowered = (text or "").lower()
        if rc == words.NVSMI_NO_DRIVER_RC:
            finding.no_driver = finding.no_driver or words.ended(rc, text)
            continue
        if rc == words.NVSMI_GPU_LOST_RC:
            finding.lost = finding.lost or f"nvidia-smi conf-compute {query} {words.ended(rc, text)}"
            continue
        if query == "-mgm" and rc == words.NVSMI_USAGE_RC and smi_unrecognized_option(text):
            finding.multi_gpu = judge.MGM_NOT_OFFERED
            continue
        if rc == words.NVSMI_NOT_FOUND_RC and NOT_CAPABLE_TEXT in lowered:
            finding.capable = False
            continue
        value = None
        if rc == 0:
            value = ask.cc_value(query, text)
        if value is None:
            finding.unreadable[query] = words.ended(rc, text)
            continue
        setattr(finding, {"-f": "mode", "-d": "devtools", "-e": "environment",
                          "-mgm": "multi_gpu"}[query], value)
    return finding


class CcDecision:
    """What :func:`decide` made of a finding.

    Attributes:
        outcome: :data:`FAIL`, :data:`SKIP`, :data:`CONFIDENTIAL` (go on to the ready state)
            or :data:`DEVTOOLS` (allowed dev-tools: read the ready state, never set it).
        reason: the one-line cause (a failure's or a skip's message).
        fix: what to do (failures), or ``""``.
        warnings: lines for the status's warnings.
    """

    __slots__ = ("outcome", "reason", "fix", "warnings")

    def __init__(self, outcome: str, reason: str, fix: str = "", warnings=None):
        self.outcome, self.reason, self.fix = outcome, reason, fix
        self.warnings: list[str] = list(warnings or [])


def decide(finding: CcAnswers, guest: str | None, allow_devtools: bool = False,
           allow_cc_off: bool = False) -> CcDecision:
    """The decision on a finding (module docstring; docs/interface.md 3.2).

    Args:
        finding: what the queries said.
        guest: the confidential guest as host/tee.py describes it (``Intel TDX (/proc/cpuinfo
            flag tdx_guest)``), or None for a regular VM (no evidence; the kernel log alone
            never makes one).
        allow_devtools, allow_cc_off: the config keys of ``confidential_computing``.
    """
    where = f"in a confidential guest, {guest}" if guest else "on a regular VM"
    if finding.no_driver:
        return CcDecision(FAIL, "nvidia-smi cannot communicate with the NVIDIA driver "
                          f"({finding.no_driver})", "see the modules and device-nodes checks")
    if finding.lost:
        return CcDecision(FAIL, f"a GPU is lost ({finding.lost})",
                          "the GPU fell off the bus or hung: see the kernel log (Xid 79); reboot "
                          "the VM, and replace the GPU if it happens again")
    if finding.mode not in (None, "on", "off"):
        return CcDecision(FAIL, f"unknown CC status {finding.mode.upper()[:40]!r} from nvidia-smi "
                          "conf-compute -f (not read as off)", "run nvidia-smi conf-compute -f by hand")
    if finding.devtools:
        if not allow_devtools:
            return CcDecision(FAIL, "DevTools Mode: ON (nvidia-smi conf-compute -d): the GPU's CC "
                              "runs with its debug interfaces open, a development mode that is not "
                              "production confidential computing",
                              "set the GPU's CC mode to on (not devtools) on the host, or allow it "
                              "with confidential_computing.allow_devtools")
        return CcDecision(DEVTOOLS, "CC devtools", warnings=[
            "DevTools Mode: ON, not production confidential computing (allowed by "
            "confidential_computing.allow_devtools); the agent never sets its ready state"])
    if finding.capable and finding.mode is None:
        why = finding.unreadable.get("-f", "no answer")
        if guest:
            return CcDecision(FAIL, f"cannot read the CC mode {where} (nvidia-smi conf-compute "
                              f"-f {why})", "run nvidia-smi conf-compute -f by hand")
        return CcDecision(SKIP, f"CC mode unknown on a regular VM ({why.split(':')[0]})", warnings=[
            f"CC mode unknown (nvidia-smi conf-compute -f {why}); not a confidential guest, "
            "so not required"])
    if finding.confidential:
        return _confidential(finding, guest, where)
    return _not_confidential(finding, guest, where, allow_cc_off)


def _confidential(finding: CcAnswers, guest: str | None, where: str) -> CcDecision:
    warnings = []
    for query, what in (("-d", "the dev-tools mode"), ("-e", "the CC environment")):
        if query in finding.unreadable:
            line = (f"cannot read {what} of a confidential GPU (nvidia-smi conf-compute {query} "
                    f"{finding.unreadable[query]})")
            if guest:
                return CcDecision(FAIL, f"{line} {where}: fails closed",
                                  f"run nvidia-smi conf-compute {query} by hand")
            warnings.append(f"{line}; not a confidential guest, so not required")
    if finding.environment not in (None, "PRODUCTION"):
        warnings.append(f"CC Environment: {finding.environment}, not PRODUCTION")
    if finding.mode == "on" and "-mgm" in finding.unreadable:
        warnings.append(f"cannot read the multi-GPU mode (nvidia-smi conf-compute -mgm "
                        f"{finding.unreadable['-mgm']})")
    label = "CC on" if finding.mode == "on" else "CC off, Multi-GPU Mode: Protected PCIe"
    return CcDecision(CONFIDENTIAL, label, warnings=warnings)


def _not_confidential(finding: CcAnswers, guest: str | None, where: str,
                      allow_cc_off: bool) -> CcDecision:
    if not finding.capable:
        what = "the GPUs do not support confidential computing (No CC capable devices found.)"
    else:
        what = f"the GPUs' CC mode is off ({finding.mode_words()})"
    notes = []
    if finding.off_unproven:
        notes.append("CC off is not proven: nvidia-smi 535 prints CC status: OFF and CC "
                     "Environment: UNAVAILABLE also when its CC query fails")
    if finding.capable and "-mgm" in finding.unreadable:
        notes.append("Protected PCIe is not ruled out: nvidia-smi conf-compute -mgm "
                     + finding.unreadable["-mgm"])
    note = f" ({'; '.join(notes)})" if notes else ""
    if guest and not allow_cc_off:
        return CcDecision(FAIL, f"{what} {where}: the GPUs' traffic would cross PCIe in "
                          f"clear{note}", FIX_HOST)
    if guest:
        return CcDecision(SKIP, f"{what}{note}; accepted by confidential_computing.allow_cc_off",
                          warnings=[f"{what} {where}: not confidential, accepted by "
                                    f"confidential_computing.allow_cc_off{note}"])
    if not finding.capable:
        return CcDecision(SKIP, "the GPUs do not support confidential computing (No CC capable "
                          "devices found)")
    return CcDecision(SKIP, f"CC mode is off{note}", warnings=[f"CC mode is off{note}"] if notes else [])
