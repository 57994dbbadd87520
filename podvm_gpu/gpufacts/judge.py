"""Each decision on GPU facts, made once (issue 33): the recovery action, the fabric's health
summary, memory health. Boot (steps), check and the exporter's ``podvm_gpu_health`` family take
their verdict from here, on one scale (gpufacts/words.py: ok/warn/fail = check pass/warn/fail =
0/10/20).

A "reset needed" finding fails, or is a warning with ``health.reset_pending_warns``
(:func:`reset_verdict`): the one place that option is read for a verdict.
"""

from __future__ import annotations

import collections
import re

from podvm_gpu.gpufacts.finding import Finding, finding
from podvm_gpu.gpufacts.words import FAIL, OK, WARN, bus_id, na, worst

# what a finding asks for
FINE, NOTE, RESET, FATAL = "fine", "note", "reset", "fatal"


def reset_verdict(reset_pending_warns: bool) -> str:
    """A GPU reset needed: :data:`FAIL`, or :data:`WARN` with ``health.reset_pending_warns``."""
    return WARN if reset_pending_warns else FAIL


def verdict_of(kind: str, reset_pending_warns: bool) -> str:
    """The verdict of a finding's kind: fine ok, note warn, reset :func:`reset_verdict`, fatal
    fail."""
    if kind == RESET:
        return reset_verdict(reset_pending_warns)
    return {FINE: OK, NOTE: WARN, FATAL: FAIL}[kind]


# --- the confidential-computing mode -------------------------------------------------------

# the multi-GPU mode as read (nvidia-smi conf-compute -mgm; NVML's settings.multiGpuMode)
MGM_NONE, MGM_PPCIE, MGM_NOT_OFFERED = "none", "protected-pcie", "not-offered"


def cc_label(capable: bool, mode: str | None, devtools: bool | None,
             multi_gpu: str | None) -> str | None:
    """The CC mode's one label (``off``, ``on``, ``devtools``, ``ppcie``; metrics'
    ``podvm_gpu_cc_mode``, status, check), ``unsupported`` (not CC capable), or None (unknown:
    never read as off).

    Args:
        capable: False when the GPUs are not CC capable; mode: ``on``, ``off``, another word
            or None; devtools: dev-tools mode or None; multi_gpu: :data:`MGM_NONE`,
            :data:`MGM_PPCIE`, :data:`MGM_NOT_OFFERED`, another word or None.
    """
    if not capable:
        return "unsupported"
    if devtools and mode == "on":
        return "devtools"
    if mode == "on":
        return "on"
    if mode == "off":
        return "ppcie" if multi_gpu == MGM_PPCIE else "off"
    return None


# --- the recovery action -----------------------------------------------------------------

class Action(collections.namedtuple("Action", "number name words kind")):
    """One recovery action: NVML's number (``nvmlDeviceGpuRecoveryAction_t``, field
    ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, driver 565+), its name, the words nvidia-smi may
    print for it (matched case-insensitively, spaces and punctuation ignored) and its kind."""

    __slots__ = ()


NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET = (
    "None", "GPU Reset", "Node Reboot", "Drain P2P", "Drain and Reset")
RECOVER_IMEX, BUS_RESET, SYSTEM_REBOOT = "Recover IMEX Domain", "Bus Reset", "System Reboot"
# The labels NVIDIA documents (nvidia-smi's `GPU Recovery Action`, nvml.h 565+ and
# nvidia-ml-py 13.x for 5-7); NVIDIA/DCGM#263 shows a real nvidia-smi printing "1, Reset".
ACTIONS = (
    Action(0, NONE, ("none",), FINE),
    # "[GPU requires reset]" as a value of any column (open-gpu-kernel-modules#1045)
    Action(1, GPU_RESET, ("gpureset", "reset", "gpurequiresreset"), RESET),
    Action(2, NODE_REBOOT, ("nodereboot", "reboot"), FATAL),
    Action(3, DRAIN_P2P, ("drainp2p",), NOTE),
    Action(4, DRAIN_AND_RESET, ("drainandreset",), RESET),
    Action(5, RECOVER_IMEX, ("recoverimexdomain",), NOTE),
    Action(6, BUS_RESET, ("busreset",), RESET),
    Action(7, SYSTEM_REBOOT, ("systemreboot",), FATAL),
)
ACTION_BY_NUMBER = {a.number: a for a in ACTIONS}
_ACTION_BY_WORD = {word: a for a in ACTIONS for word in a.words}
_NUMBER_AND_WORD = re.compile(r"^\s*(\d+)\s*,\s*(.*)$")


def action_of(value: str | int) -> Action | None:
    """The recovery action NVML's number or nvidia-smi's words name (``GPU Reset``, ``reset``,
    ``1``, ``1, Reset``); None for a value no table knows (N/A, an error text, a word of a
    newer driver: the caller says it verbatim)."""
    if isinstance(value, int):
        return ACTION_BY_NUMBER.get(value)
    text = value.strip()
    m = _NUMBER_AND_WORD.match(text)
    if m:
        return ACTION_BY_NUMBER.get(int(m.group(1))) or action_of(m.group(2))
    if text.isdigit():
        return ACTION_BY_NUMBER.get(int(text))
    return _ACTION_BY_WORD.get("".join(ch for ch in text.lower() if ch.isalnum()))


_ACTION_SAYS = {
    GPU_RESET: "GPU reset needed", DRAIN_AND_RESET: "GPU reset needed",
    BUS_RESET: "GPU reset needed (a bus reset)",
    NODE_REBOOT: "the driver asks for a reboot of the host's node; the GPU is unusable until then",
    SYSTEM_REBOOT: "the driver asks for a reboot of the system; the GPU is unusable until then",
    DRAIN_P2P: "drain peer-to-peer traffic (NVLink/PCIe P2P) before using it across GPUs",
    RECOVER_IMEX: "the IMEX domain needs recovering (nvidia-imex on the domain's nodes)",
}


def action_says(action: Action) -> str:
    """What the action asks for, in words (``GPU reset needed``); ``""`` for None."""
    return _ACTION_SAYS.get(action.name, "")


# --- how to reset a GPU --------------------------------------------------------------------

PERSISTENCED_UNIT = "podvm-gpu-persistenced.service"  # host/daemons.py's transient unit
REPLACE_VM = "in a confidential guest: replace the VM (its GPU is not reset from inside it)"
_BUS_IN = re.compile(r"(?<![0-9A-Fa-f])([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
                     r"(?:\.[0-7])?)(?![0-9A-Fa-f])")


def buses_in(lines) -> list[str]:
    """The GPUs' bus ids (:func:`~podvm_gpu.gpufacts.words.bus_id`'s form) named in ``lines``
    (strings: verdict lines, a kernel record), each once, in order."""
    found: list[str] = []
    for line in lines:
        for m in _BUS_IN.finditer(line):
            bus = bus_id(m.group(1))
            if bus not in found:
                found.append(bus)
    return found


def reset_advice(buses=(), confidential: bool | None = None) -> str:
    """The one sentence every site that advises a GPU reset gives (issue 46 item 6): a reset is
    refused while persistence holds the GPU (``GPU 00000000:1A:00.0: In use by another client``,
    exit 255, until ``nvidia-smi -pm 0``: NVSentinel PR #1692), and a confidential guest's GPU is
    replaced with its VM, not reset.

    Args:
        buses: the GPUs' PCI addresses (any form :func:`bus_id` reads); none: ``<bus id>``.
        confidential: True in a confidential guest (only "replace the VM" is said), False
            outside one, None when not known (both are said).
    """
    if confidential:
        return "replace the VM: a confidential guest's GPU is not reset from inside it"
    targets = [bus_id(bus) for bus in buses] or ["<bus id>"]
    said = (f"reset the GPU: stop {PERSISTENCED_UNIT} (or nvidia-smi -pm 0: a reset is refused "
            "while persistence holds the GPU), then "
            + " and ".join(f"nvidia-smi -r -i {bus}" for bus in dict.fromkeys(targets))
            + " with no process using it, or restart the VM on its host")
    return said if confidential is False else f"{said}; {REPLACE_VM}"


# --- the fabric's health summary ------------------------------------------------------------

# NVML_GPU_FABRIC_HEALTH_SUMMARY_* (nvml.h, 570+): 0 not supported, 1 healthy, 2 unhealthy,
# 3 limited capacity; nvidia-smi 580's fabric.health.summary prints the words.
HEALTH_SUMMARY = {0: "Not Supported", 1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}
_SUMMARY_KIND = {"notsupported": FINE, "healthy": FINE, "unhealthy": FATAL,
                 "limitedcapacity": NOTE}


def _summary_key(value: str) -> str:
    """A summary's letters and digits, lower case, ``NVML_GPU_FABRIC_HEALTH_SUMMARY_`` left out."""
    return "".join(ch for ch in value.lower().removeprefix("nvml_gpu_fabric_health_summary_")
                   if ch.isalnum())


def summary_kind(value: str | int) -> str | None:
    """The kind of a fabric health summary: Healthy or N/A fine, Unhealthy fatal, Limited
    Capacity a note (words case-insensitive, also as ``NVML_GPU_FABRIC_HEALTH_SUMMARY_*`` or
    their numbers); None for a word no table knows (a warning that says it verbatim)."""
    if isinstance(value, int):
        value = HEALTH_SUMMARY.get(value, "")
        if not value:
            return None
    if na(value):
        return FINE
    key = _summary_key(value)
    if key.isdigit():
        return summary_kind(int(key))
    return _SUMMARY_KIND.get(key)


class Detail(collections.namedtuple("Detail", "field shift width words")):
    """One of 580's ``fabric.health.*`` fields: its name without the prefix, its place in NVML's
    health mask (``NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*``/``WIDTH_*``, nvidia-ml-py 13.x) and the
    words it knows (letters only, lower case) -> (NVML's ``NVML_GPU_FABRIC_HEALTH_MASK_*`` value,
    kind, what it says)."""

    __slots__ = ()


def _yes_no(true_kind: str, said: str) -> dict:
    # nvidia-smi's boolean words (Yes/No on 580's remapped rows, True/False in -q)
    return {"yes": (1, true_kind, said), "true": (1, true_kind, said), "no": (2, FINE, ""),
            "false": (2, FINE, "")}


# The meaning of each value is NVML's (nvmlFabricDefs, R580: "Route is unhealthy", "Bandwidth
# degraded", "Route Recovery in progress", "Access Timeout Recovery in progress", "Incorrect
# Configuration - ..."). The verdict: a route unhealthy is fatal, as the summary Unhealthy is (a
# path the GPU's NVLink traffic takes fails; DCGM's NVLink health watch makes it an incident:
# NVIDIA/DCGM testing/python3/tests/test_health.py, test_dcgm_health_check_fabric_health_mask);
# degraded bandwidth (the summary's Limited Capacity), a recovery in progress and a configuration
# finding are notes: the fabric still carries traffic, NVML's summary stays the gate. Values were
# never captured: a word not here is "not understood" (a warning quoting it), never a guess.
HEALTH_DETAIL = (
    Detail("bandwidth", 0, 0x3, {**_yes_no(NOTE, "the NVLink bandwidth is degraded"),
                                 "degraded": (1, NOTE, "the NVLink bandwidth is degraded"),
                                 "notdegraded": (2, FINE, "")}),
    Detail("route_recovery_in_progress", 2, 0x3,
           _yes_no(NOTE, "a fabric route recovery is in progress")),
    Detail("route_unhealthy", 4, 0x3, _yes_no(FATAL, "a fabric route is unhealthy")),
    Detail("access_timeout_recovery", 6, 0x3,
           _yes_no(NOTE, "an access-timeout recovery is in progress")),
    # NVML's names (INCORRECT_SYSGUID, ...) and its documentation's words ("Incorrect
    # Configuration - SysGUID", "Correct Configuration", ...), letters only
    Detail("incorrect_configuration", 8, 0xF, {
        "none": (1, FINE, ""), "correctconfiguration": (1, FINE, ""),
        **{word: (number, NOTE, f"incorrect fabric configuration ({name})")
           for number, words, name in (
               (2, ("incorrectsysguid", "sysguid"), "SysGUID"),
               (3, ("incorrectchassissn", "chassisserialnumber"), "chassis serial number"),
               (4, ("nopartition",), "no partition"),
               (5, ("insufficientnvlinks",), "insufficient NVLinks"),
               (6, ("incompatiblegpufw", "incompatiblegpufirmware"), "incompatible GPU firmware"),
               (7, ("invalidlocation",), "invalid location"),
               (8, ("gpustateinvalid",), "GPU state invalid"))
           for word in (*words, *(f"incorrectconfiguration{w}" for w in words))}}),
    Detail("partition_assigned", 12, 0x3, _yes_no(FINE, "")),
)
_SUMMARY_CODE = {_summary_key(word): code for code, word in HEALTH_SUMMARY.items()}


class FabricHealth(collections.namedtuple("FabricHealth", "findings summary_code mask")):
    """One GPU's fabric health judged: ``findings`` a list of gpufacts/finding.py
    :class:`~podvm_gpu.gpufacts.finding.Finding` (level ``FAIL`` for a fatal one, ``WARN`` for a
    note; kind :data:`FABRIC`, or :data:`FABRIC_UNKNOWN` for a word not understood; none when
    fine), ``summary_code`` NVML's ``NVML_GPU_FABRIC_HEALTH_SUMMARY_*`` of the summary
    (``DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY``) and ``mask`` NVML's health mask built from the detail
    (``DCGM_FI_DEV_FABRIC_HEALTH_MASK``; a field not read is NVML's 0, not supported); each None
    when a word was not understood (a number would claim what was not read)."""

    __slots__ = ()


FABRIC, FABRIC_UNKNOWN = "fabric", "fabric-not-understood"  # the kinds of its findings


def fabric_health(summary: str, detail: dict[str, str] | None,
                  gpu: str | None = None) -> FabricHealth:
    """Judge one GPU's fabric health summary and 580's detail of it, as nvidia-smi printed them.

    Args:
        summary: ``fabric.health.summary`` (``Healthy``, ``Unhealthy``, ``Limited Capacity``,
            ``N/A``); detail: field (:data:`HEALTH_DETAIL` names) -> value, None when not read;
            gpu: the GPU's PCI address (the findings' ``gpu``), None when not known.
    """
    findings: list[Finding] = []

    def found(kind: str, what: str, of: str = FABRIC) -> None:
        findings.append(finding(FAIL if kind == FATAL else WARN, what, gpu=gpu, kind=of))

    kind = summary_kind(summary)
    if kind == FATAL:
        found(FATAL, f"health summary {summary} (fabric.health.summary)")
    elif kind == NOTE:
        found(NOTE, f"fabric health summary {summary}: the NVLink fabric works with less "
                    "bandwidth than it should")
    elif kind is None:
        found(NOTE, f"fabric health summary {summary!r} not understood", FABRIC_UNKNOWN)
    code = 0 if na(summary) else _SUMMARY_CODE.get(_summary_key(summary))
    mask: int | None = 0
    for field in HEALTH_DETAIL:
        value = (detail or {}).get(field.field, "N/A")
        if na(value):
            continue
        known = field.words.get("".join(ch for ch in value.lower() if ch.isalpha()))
        if known is None:
            found(NOTE, f"fabric.health.{field.field} {value!r} not understood", FABRIC_UNKNOWN)
            mask = None
            continue
        if mask is not None:
            mask |= (known[0] & field.width) << field.shift
        if known[1] != FINE:
            found(known[1], f"fabric.health.{field.field} {value}: {known[2]}")
    return FabricHealth(findings, code, mask)


def fabric_state(states, gpus: list[str]) -> tuple[list[str], list, bool]:
    """The GPUs' fabric state judged against the VM's GPUs: the one decision boot's wait
    (steps/fabric/step.py ``wait_for_fabric``) and check's row (``fabricmanager_row``) both act
    on.

    Args:
        states: what the fabric query reported (gpufacts/smi.py ``FabricState``s, from
            ``parse_fabric_rows``).
        gpus: the VM's GPUs' PCI addresses (every one must be Completed/Success, not just the
            ones nvidia-smi happens to list).

    Returns:
        ``(waiting, unhealthy, ready)``: the GPUs (PCI addresses) without fabric
        Completed/Success; the states Completed with another status than Success (a failure
        at once); True when states were reported, every one Completed/Success, and no GPU is
        waiting.
    """
    done = {bus_id(s.gpu) for s in states if s.success}
    waiting = [g for g in gpus if bus_id(g) not in done]
    unhealthy = [s for s in states if s.completed and not s.success]
    return waiting, unhealthy, bool(states) and not waiting and all(s.success for s in states)


# --- memory ---------------------------------------------------------------------------------

def memory_kind(remap_failure: bool | None, remap_pending: bool | None,
                volatile_uncorrectable: int | None, retired_pending: bool | None) -> str:
    """The kind of a GPU's memory health: a failed row remap fatal (the GPU needs replacing);
    a pending remap, a pending page retirement or volatile uncorrectable ECC errors (since the
    driver loaded) a reset; else fine. None in an argument: not read."""
    if remap_failure:
        return FATAL
    if remap_pending or retired_pending or (volatile_uncorrectable or 0) > 0:
        return RESET
    return FINE


# --- one GPU's verdicts, on its facts (either back end) ------------------------------------

def facts_verdicts(facts, reset_pending_warns: bool) -> dict[str, str]:
    """check name -> verdict (:data:`OK`/:data:`WARN`/:data:`FAIL`) for one GPU's facts
    (gpufacts/facts.py ``GpuFacts``, from either back end): the decisions boot's health gate and
    check's rows make, on one scale. ``gpu-lost`` is always there; ``memory``,
    ``recovery-action`` and ``fabric`` only where a value was read (a check never made has no
    verdict).

    Args:
        reset_pending_warns: the config's ``health.reset_pending_warns``.
    """
    out = {"gpu-lost": FAIL if facts.lost.value else OK}
    if facts.lost.value:
        return out
    memory = (facts.remap_failure, facts.remap_pending, facts.ecc_volatile, facts.retired_pending)
    if any(value.ok for value in memory):
        out["memory"] = verdict_of(memory_kind(*(value.value for value in memory)),
                                   reset_pending_warns)
    if facts.recovery_action.ok:
        action = action_of(facts.recovery_action.value)
        out["recovery-action"] = WARN if action is None else verdict_of(action.kind,
                                                                         reset_pending_warns)
    if facts.fabric_state.ok:
        kinds = [FINE if facts.fabric_state.value == "Completed" and facts.fabric_success.value
                 else FATAL]
        if facts.fabric_summary.ok:
            kinds.append(summary_kind(facts.fabric_summary.value) or NOTE)
        out["fabric"] = worst(*(verdict_of(kind, reset_pending_warns) for kind in kinds))
    return out
