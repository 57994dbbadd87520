"""The words every GPU reader shares: defined here once, used by the nvidia-smi back end
(gpufacts/smi.py), the NVML back end (gpufacts/nvml.py), the steps, check and the exporter.

- :func:`na`: the one N/A rule (``[N/A]``, ``N/A``, ``Not Supported``, nothing);
- :func:`bus_id`: the one bus-id normaliser (NVML's form, as nvidia-smi and DCGM print it);
- :data:`FAILURES`: the one table of what a failure means, with two columns kept apart:
  nvidia-smi's exit status as observed (the real Debian builds, ../shared/nvidia-smi-real.md)
  and NVML's return code (``nvmlReturn_t``, nvml.h) for the NVML back end;
- :func:`failed_call`: the one wording of a failed call (:func:`ended`: the same without the
  call, for a caller that names it in its own words);
- :data:`OK`, :data:`WARN`, :data:`FAIL` and :data:`SCORE`: the one verdict scale (boot ok/warn/
  fail = check pass/warn/fail = 0/10/20, the numbers of DCGM's ``DCGM_HEALTH_RESULT_*``).
"""

from __future__ import annotations

import collections
import re

from podvm_gpu.errors import exit_text, one_line

# --- the verdict scale ----------------------------------------------------------------------

OK, WARN, FAIL = "ok", "warn", "fail"
# a verdict -> the exporter's health value (go-dcgm DCGM_HEALTH_RESULT_PASS/WARN/FAIL)
SCORE = {OK: 0, WARN: 10, FAIL: 20}
# a verdict -> check's row state (podvm_gpu/row.py PASS/WARN/FAIL)
CHECK_STATE = {OK: "pass", WARN: "warn", FAIL: "fail"}


def worst(*verdicts: str) -> str:
    """The worst of ``verdicts`` (:data:`OK` for none)."""
    return max(verdicts, key=SCORE.__getitem__, default=OK)


# --- values ---------------------------------------------------------------------------------

# a value of a GPU the driver wants reset (open-gpu-kernel-modules#1045, after Blackwell's Xid
# 62/45 -> 119 -> 154 loop): the recovery action GPU Reset (gpufacts/judge.py action_of)
GPU_REQUIRES_RESET = "[GPU requires reset]"
GPU_LOST = "[GPU is lost]"  # a --query-gpu/--query-remapped-rows value for a GPU lost after its handle


def na(value: str | None) -> bool:
    """The one N/A rule: True for ``[N/A]``, ``N/A``, ``[Not Supported]``, ``Not Supported``
    (any case) and for nothing at all: a value the GPU or the driver does not offer."""
    return (value or "").strip().strip("[]").strip().lower() in ("n/a", "not supported", "")


def bus_id(address: str) -> str:
    """The one bus-id normaliser: a PCI address in NVML's form, as nvidia-smi prints it and as
    DCGM's ``pci_bus_id`` label has it: 8-digit domain, upper-case hex, function ``.0`` when not
    given (``0000:18:00.0``, ``00000000:18:00.0``, the kernel log's ``0000:18:00`` ->
    ``00000000:18:00.0``). Anything else comes back stripped, as it was: two addresses are
    the same GPU when their normal forms are equal.

    Args:
        address: sysfs's, NVML's or nvidia-smi's form, or the kernel log's (no function).
    """
    address = address.strip()
    head, _, function = address.partition(".")
    parts = head.split(":")
    if len(parts) != 3:
        return address
    try:
        domain, bus, device = (int(p, 16) for p in parts)
        func = int(function or "0", 16)
    except ValueError:
        return address
    return f"{domain:08X}:{bus:02X}:{device:02X}.{func:X}"


def csv_rows(text: str, width: int) -> list[list[str]] | None:
    """The rows of a ``--format=csv,noheader`` answer, ``width`` values each; None when a line
    has another shape (not an answer: an error message)."""
    rows = [[v.strip() for v in line.split(",")] for line in text.splitlines() if line.strip()]
    return rows if rows and all(len(row) == width for row in rows) else None


def csv_value(value: str, label: str = "") -> str:
    """One ``--query-gpu`` value as text: ``[N/A]`` -> ``N/A``; the label the real program puts
    before fabric values (``state  Completed``, ``status Success``; nvidia-smi-real.md) removed."""
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        return value[1:-1].strip()
    if label and re.match(rf"{label}\s", value):
        return value[len(label):].strip()
    return value


# --- what a failure means -------------------------------------------------------------------

class Failure(collections.namedtuple("Failure", "nvml name meaning smi_exit broken")):
    """One row of :data:`FAILURES`.

    Attributes:
        nvml: NVML's return code (``nvmlReturn_t``, nvml.h), what the NVML back end sees.
        name: its name without ``NVML_ERROR_`` (``GPU_IS_LOST``).
        meaning: what it means, in a few words.
        smi_exit: the exit status nvidia-smi was observed to give for it: every real Debian
            build, 535.261.03 to 555.58.02, against the stand-in NVML (tests/fake_nvml)
            returning it from NVML's initialisation (tests/test_real_nvidia_smi.py holds each
            row; nvidia-smi-real.md): the code itself, or 255.
        broken: True when no answer can come after it (the driver, the library or a GPU is
            unusable): a failure wherever it appears after the modules step, never "unread".
    """

    __slots__ = ()


FAILURES = (
    Failure(1, "UNINITIALIZED", "NVML not initialised", 255, False),
    Failure(2, "INVALID_ARGUMENT", "invalid argument (also an option or --query-gpu field "
            "this nvidia-smi does not know)", 2, False),
    Failure(3, "NOT_SUPPORTED", "not supported", 3, False),
    Failure(4, "NO_PERMISSION", "insufficient permissions", 4, False),
    Failure(6, "NOT_FOUND", "not found (no GPU listed)", 6, False),
    Failure(9, "DRIVER_NOT_LOADED", "driver not loaded", 9, True),
    Failure(10, "TIMEOUT", "timed out", 255, False),
    Failure(12, "LIBRARY_NOT_FOUND", "NVML library not found", 12, True),
    Failure(13, "FUNCTION_NOT_FOUND", "NVML function not found (a library older than "
            "nvidia-smi)", 13, False),
    Failure(15, "GPU_IS_LOST", "GPU is lost", 15, True),
    Failure(16, "RESET_REQUIRED", "GPU reset required", 255, True),
    Failure(17, "OPERATING_SYSTEM", "GPU access blocked by the operating system", 17, True),
    Failure(18, "LIB_RM_VERSION_MISMATCH", "driver/library version mismatch", 18, True),
    Failure(22, "VGPU_ECC_NOT_SUPPORTED", "ECC not supported on this vGPU", 255, False),
    Failure(25, "ARGUMENT_VERSION_MISMATCH", "argument version mismatch (a struct version "
            "the library does not know)", 255, False),
    Failure(26, "DEPRECATED", "deprecated", 255, False),
    Failure(27, "NOT_READY", "not ready yet", 255, False),
    Failure(28, "GPU_NOT_FOUND", "GPU not found", 255, False),
    Failure(29, "INVALID_STATE", "invalid state", 255, False),
    Failure(999, "UNKNOWN", "unknown error", 255, False),
)
NVML_RETURN = {f.nvml: f for f in FAILURES}  # NVML's return code -> its row

# nvidia-smi's exit status -> its meaning, from the table's observed column: the status is NVML's
# return code for the codes seen as themselves, 255 for several; usage errors exit 2.
# Everything, errors included, is on stdout.
NVSMI_EXIT = {f.smi_exit: f.meaning for f in FAILURES if f.smi_exit not in (None, 255)}
NVSMI_EXIT[255] = ("unknown error (NVML " + ", ".join(str(f.nvml) for f in FAILURES
                                                       if f.smi_exit == 255)
                   + ", or a foreign library)")
# the exit statuses after which no answer can come: those only broken codes give (255 stands
# for codes that are not, too: never one of them)
NVSMI_BROKEN = tuple(sorted({f.smi_exit for f in FAILURES if f.broken and f.smi_exit != 255}))
# nvidia-smi cannot reach the kernel driver (no module, no /dev/nvidiactl, no permission): every
# subcommand, 535.261.03 as the field's newer drivers, prints "NVIDIA-SMI has failed because it
# couldn't communicate with the NVIDIA driver. ..." (tests/data/nvidia-535.261.03/plain)
NVSMI_NO_DRIVER_RC = 9
NVSMI_USAGE_RC = 2  # an option or a --query-gpu field this nvidia-smi does not offer
NVSMI_NOT_FOUND_RC = 6  # "No devices were found", "No GPU instances found"
NVSMI_GPU_LOST_RC = 15
NOT_A_FIELD = "is not a valid field to query"  # nvidia-smi's words for a field it does not know


def nvml_text(code: int) -> str:
    """``NVML 28 (GPU_NOT_FOUND: GPU not found)``: NVML's return code with its meaning."""
    row = NVML_RETURN.get(code)
    return f"NVML {code}" + (f" ({row.name}: {row.meaning})" if row else "")


def said(output: str, limit: int | None = 160) -> str:
    """What a tool printed, on one line, at most ``limit`` characters (errors.one_line; ``no
    output`` for nothing)."""
    return one_line(output or "", limit) or "no output"


def failed_call(argv: list[str], returncode: int | None, output: str, limit: int = 160) -> str:
    """The one wording of a failed nvidia-smi call: ``nvidia-smi --query-gpu=... exit 2
    (invalid argument ...): Field "x" is not a valid field to query.``: the program and its
    first argument, the exit status with its meaning, what it printed on one line."""
    return f"{' '.join(argv[:2])} {ended(returncode, output, limit)}"


def ended(returncode: int | None, output: str, limit: int | None = 160) -> str:
    """:func:`failed_call`'s wording without the call, for a caller that names the call in its
    own words (``nvidia-smi conf-compute -f exit 15 (GPU is lost): ...``, ``... -srs 0: ...``):
    ``exit 15 (GPU is lost): <what it printed>``, nvidia-smi's status with its meaning
    (:data:`NVSMI_EXIT`; ``killed by SIGKILL`` for a signal, errors.exit_text; ``did not run``
    for None) and what it printed on one line, at most ``limit`` characters (:func:`said`)."""
    if returncode is None or returncode < 0:
        status = "did not run" if returncode is None else exit_text(returncode)
    else:
        status = f"exit {returncode}" + (f" ({NVSMI_EXIT[returncode]})" if returncode in NVSMI_EXIT else "")
    return f"{status}: {said(output, limit)}"


def no_driver(returncode: int | None, output: str) -> str | None:
    """A one-line cause when nvidia-smi exited 9 (it cannot talk to the driver), quoting what it
    printed; None for any other exit. After the modules step this is a failure, never an
    "unknown" state: the driver that boot loaded does not answer."""
    if returncode != NVSMI_NO_DRIVER_RC:
        return None
    return f"nvidia-smi cannot communicate with the NVIDIA driver ({ended(returncode, output, None)})"


def broken(returncode: int | None, output: str) -> str | None:
    """A one-line cause when nvidia-smi's exit status is one of :data:`NVSMI_BROKEN`, quoting
    what it printed (``Unable to determine the device handle for GPU0000:18:00.0: GPU is lost.``
    names the GPU); None for any other status."""
    if returncode == NVSMI_NO_DRIVER_RC:
        return no_driver(returncode, output)
    if returncode not in NVSMI_BROKEN:
        return None
    return f"nvidia-smi {ended(returncode, output, 300)}"
