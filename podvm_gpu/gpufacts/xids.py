"""The Xid table: what an NVRM Xid record means, in one place (issues 44 and 46). The kernel log's
findings (host/kmsg.py), the watcher's verdicts (watch/verdicts.py) and the metrics take their
Xid knowledge from here; a base module (layer 0 of docs/design.md) so that the host readers may
use it too.

Sources: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) for the fatal and the
application codes; for the NVLink 5 codes 144-150, the driver's own word in the record
(``NVRM: Xid (PCI:0019:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 ...)``,
``... 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (...)``: NVSentinel#748, gpud PRs #1160/#1174);
for follow-ons, the driver's ``caused by previous Xid N`` (open-gpu-kernel-modules#1150:
``NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous
Xid 149``).
"""

from __future__ import annotations

import re

# Xid codes after which a GPU stays unusable until it is reset, from NVIDIA's Xid catalog.
FATAL_XIDS = {48: "double-bit ECC error", 62: "internal micro-controller halt",
              79: "GPU has fallen off the bus", 95: "uncontained ECC error",
              119: "GSP RPC timeout", 120: "GSP error", 140: "unrecovered ECC error"}
# Xid codes of one application's error (a page fault, an illegal instruction, ...): warnings
WARN_XIDS = {13: "graphics engine exception", 31: "GPU memory page fault",
             43: "GPU stopped processing", 63: "ECC page retirement or row remapping recorded",
             64: "ECC page retirement or row remapper recording failure",
             92: "high single-bit ECC error rate"}
# The driver changed a GPU's recovery action (driver 570+): judged by the action it names
# (gpufacts/judge.py ACTIONS, over its hex code: watch/verdicts.py), neither fatal nor a warning here.
RECOVERY_XID = 154
# NVLink 5 Xids (Blackwell): the record's own word decides: ``Fatal`` fatal, ``Nonfatal`` a
# warning, neither word a warning.
WORD_XIDS = range(144, 151)
FATAL_WORD, NONFATAL_WORD = "Fatal", "Nonfatal"
# the code, then the NVLink unit and its word: "149, NETIR_LINK_EVT Fatal XC0 ..."
_WORDED = re.compile(r"Xid \([^)]{1,24}\): \d{1,5}, (?:(?P<unit>[A-Z0-9_]{1,40}) )?"
                     r"(?P<word>Non-?fatal|Fatal)\b", re.I)
_FOLLOW_ON = re.compile(r"caused by previous Xid (\d{1,5})\b", re.I)


def word(code: int, message: str) -> str | None:
    """The severity word of an NVLink 5 Xid record (:data:`FATAL_WORD` or
    :data:`NONFATAL_WORD`, as the driver printed it: ``Fatal``/``Nonfatal``, any case, also
    ``Non-fatal``), or None for another code or a record without one.

    Args:
        code: the record's Xid code; message: the record as the kernel logged it.
    """
    if code not in WORD_XIDS:
        return None
    m = _WORDED.search(message)
    if m is None:
        return None
    return NONFATAL_WORD if m.group("word").lower().startswith("non") else FATAL_WORD


def unit(message: str) -> str | None:
    """The NVLink unit an NVLink 5 record names (``NETIR_LINK_EVT``, ``RLW_RXPIPE``), or None."""
    m = _WORDED.search(message)
    return m.group("unit") if m else None


def fatal(code: int | None, message: str = "") -> bool:
    """Whether the Xid ``code`` in the record ``message`` leaves the GPU unusable until it is
    reset: a code of :data:`FATAL_XIDS`, or an NVLink 5 code (144-150) whose record says
    ``Fatal``. A code whose record has no word (or ``Nonfatal``) is not fatal."""
    if code is None:
        return False
    if code in WORD_XIDS:
        return word(code, message) == FATAL_WORD
    return code in FATAL_XIDS


def label(code: int, message: str = "") -> str | None:
    """The words added to ``Xid N`` in a summary: the catalog's name for a fatal or an
    application code, ``NVLink <unit> <word>`` for an NVLink 5 code with a word; else None."""
    if code in WORD_XIDS:
        said = word(code, message)
        if said is None:
            return None
        named = unit(message)
        return f"NVLink {named + ' ' if named else ''}{said}"
    return FATAL_XIDS.get(code) or WARN_XIDS.get(code)


def follow_on_of(message: str) -> int | None:
    """The earlier Xid a record says caused it (``... caused by previous Xid 149``), or None."""
    if "previous" not in message:
        return None
    m = _FOLLOW_ON.search(message)
    return int(m.group(1)) if m else None


def counted_code(code: int, message: str, seen: set[int]) -> int | None:
    """How an Xid record counts, given the codes ``seen`` before it (updated here): its own
    ``code``, or None for a follow-on of an Xid already seen (counted as that Xid's follow-on,
    neither as a new code nor again as the cause). A follow-on of an Xid never seen counts as
    its own code.

    Args:
        code: the record's code; message: the record; seen: codes of the records before it
            (any GPU: the follow-on of an NVLink error is printed for the GPUs its traffic
            reached), a set this call adds ``code`` to when it counts.
    """
    cause = follow_on_of(message)
    if cause is not None and cause in seen:
        return None
    seen.add(code)
    return code
