"""Step 8, ``confidential-computing``: check the GPUs' CC mode and ready state.

``nvidia-smi conf-compute -f`` gives the mode, ``-grs`` the ready state, ``-srs 1`` sets it. A GPU
without CC support (exit 6, "No CC capable devices found") makes the step ``skipped``; exit 9
(nvidia-smi cannot reach the driver) fails it. Not ready
with ``set_ready_state: true``: set it and check again; with ``false``: ``ok`` with a warning that
the attestation flow is left to set it. A value the agent does not know is never read as off.
``DEVTOOLS`` (nvidia-smi's third CC mode: the GPU's CC firmware paths with its debug interfaces
open, for development only) fails the boot by name unless ``allow_devtools`` accepts it with a
warning. Whether the guest is confidential is read from the kernel's interfaces (host/tee.py:
CPU flags, /sys, /dev), then from its log.
"""

from __future__ import annotations

from podvm_gpu.steps.context import BootContext
from podvm_gpu.errors import CommandError, StepFailed, exit_text, one_line
from podvm_gpu.host import kmsg
from podvm_gpu.readers import nvsmi_no_driver, parse_cc_mode, parse_ready_state
from podvm_gpu.steps import Skipped
from podvm_gpu import readers
from podvm_gpu.check import FAIL, PASS, SKIP, WARN, Check

_CONFIDENTIAL_VM_SIGNS = ("Memory Encryption Features active", "SEV-SNP", "Intel TDX", "tdx: Guest")


def confidential_vm(ctx: BootContext) -> str | None:
    """What says this is a TDX or SEV-SNP guest (host/tee.py, else the kernel log), or None."""
    from podvm_gpu.host import tee

    guest = tee.detect(ctx.root)
    if guest.kind is not None:
        return guest.describe()
    if any(any(sign in m for sign in _CONFIDENTIAL_VM_SIGNS)
           for m in kmsg.read_kernel_log(ctx.root)):
        return "the kernel log"
    return None


def _smi(ctx: BootContext, *args: str):
    command = f"nvidia-smi conf-compute {' '.join(args)}"
    try:
        return ctx.runner.run(["nvidia-smi", "conf-compute", *args], check=False)
    except CommandError as err:
        said = str(err)  # a timeout names the command already; "not found" does not
        raise StepFailed(said if said.startswith(command) else f"{command}: {said}") from err


def _said(done) -> str:
    """``exit N: <what it printed>`` of a finished call, one bounded line."""
    return f"{exit_text(done.returncode)}: {one_line(done.output) or 'no output'}"


def ready_state(ctx: BootContext) -> str:
    """The GPUs' ready state, ``ready`` or ``not-ready``.

    Raises:
        StepFailed: nvidia-smi failed or printed a value the agent does not know.
    """
    done = _smi(ctx, "-grs")
    state = parse_ready_state(done.output)
    if done.returncode != 0 or state not in ("ready", "not-ready"):
        raise StepFailed(f"cannot read the CC ready state (nvidia-smi conf-compute -grs "
                         f"{_said(done)})")
    return state


def run(ctx: BootContext) -> str:
    """Check (and where allowed set) the ready state."""
    done = _smi(ctx, "-f")
    text = done.output
    no_driver = nvsmi_no_driver(done.returncode, text)
    if no_driver:  # not an unknown mode: the driver loaded earlier does not answer
        raise StepFailed(no_driver)
    if "no cc capable" in text.lower():
        raise Skipped("the GPUs do not support confidential computing (No CC capable devices found)")
    mode = parse_cc_mode(text)
    if done.returncode != 0 and mode is None:
        guest = confidential_vm(ctx)
        if guest:
            raise StepFailed(f"cannot read the CC mode on a confidential VM ({guest}; nvidia-smi "
                             f"conf-compute -f {_said(done)})")
        ctx.warn(f"confidential-computing: CC mode unknown (nvidia-smi conf-compute -f "
                 f"{_said(done)}); not a confidential VM, so not required")
        raise Skipped(f"CC mode unknown on a regular VM ({exit_text(done.returncode)})")
    if mode == "off":
        raise Skipped("CC mode is off")
    if mode is None:
        raise StepFailed(f"nvidia-smi conf-compute -f printed no CC status ({_said(done)}); "
                         "not read as off")
    devtools = mode == "devtools"
    if devtools and not ctx.config.confidential_computing.allow_devtools:
        raise StepFailed("CC mode is DEVTOOLS (nvidia-smi conf-compute -f), a development mode "
                         "that is not production confidential computing; set the GPU's CC mode "
                         "to on, or allow it with confidential_computing.allow_devtools")
    if devtools:
        ctx.warn("confidential-computing: CC mode is DEVTOOLS, not production confidential "
                 "computing (allowed by confidential_computing.allow_devtools)")
    elif mode != "on":
        raise StepFailed(f"unknown CC status {one_line(mode, 60)!r} from nvidia-smi "
                         "conf-compute -f (not read as off)")
    label = "CC devtools" if devtools else "CC on"
    state = ready_state(ctx)
    # the hook between the classification and -srs 1 (podvm_gpu/attestation/gate.py): a
    # failure raises, with the ready state set back to not-ready where it was found ready
    from podvm_gpu.attestation.gate import attest_before_ready, tee_guest

    attested = attest_before_ready(ctx, state, tee_guest(ctx, confidential_vm(ctx)))
    said = f"; {attested}" if attested else ""
    if state == "ready":
        return f"{label}, ready state ready{said}"
    if not ctx.config.confidential_computing.set_ready_state:
        ctx.warn("confidential-computing: GPU ready state is not-ready; left for the attestation "
                 "flow to set (set_ready_state: false)")
        return f"{label}, ready state not-ready (left for the attestation flow){said}"
    done = _smi(ctx, "-srs", "1")
    if done.returncode != 0:
        raise StepFailed(f"nvidia-smi conf-compute -srs 1 failed ({_said(done)})")
    state = ready_state(ctx)
    if state != "ready":
        raise StepFailed(f"CC ready state still {state} after nvidia-smi conf-compute -srs 1")
    return f"{label}, ready state set to ready{said}"


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the CC mode query."""
    return [["nvidia-smi", "conf-compute", "-f"]]


# --- podvm-gpu check ----------------------------------------------------------------------

def confidential_computing_row(facts) -> Check:
    skip = facts.not_reached("confidential-computing") or facts.needs_driver("confidential-computing")
    if skip:
        return skip
    done = facts.runner.run(["nvidia-smi", "conf-compute", "-f"], check=False)
    no_driver = readers.nvsmi_no_driver(done.returncode, done.output)
    if no_driver:
        return Check("confidential-computing", FAIL, no_driver,
                     "see the modules and device-nodes checks and the kernel log")
    if "no cc capable" in done.output.lower():
        return Check("confidential-computing", SKIP, "the GPUs do not support CC")
    mode = readers.parse_cc_mode(done.output)
    if mode == "off":
        return Check("confidential-computing", SKIP, "CC mode is off")
    if mode == "devtools" and not facts.config.confidential_computing.allow_devtools:
        return Check("confidential-computing", FAIL, "CC mode is DEVTOOLS, a development mode "
                     "that is not production confidential computing",
                     "set the GPU's CC mode to on, or allow it with "
                     "confidential_computing.allow_devtools")
    if mode not in ("on", "devtools"):
        return Check("confidential-computing", FAIL, f"CC mode unknown ({mode or 'no answer'}, "
                     f"exit {done.returncode})", "run nvidia-smi conf-compute -f by hand")
    label = "CC on" if mode == "on" else "CC devtools (allowed by confidential_computing." \
                                         "allow_devtools: not production CC)"
    grs = facts.runner.run(["nvidia-smi", "conf-compute", "-grs"], check=False)
    state = readers.parse_ready_state(grs.output)
    if state == "ready":
        return Check("confidential-computing", PASS if mode == "on" else WARN,
                     f"{label}, ready state ready")
    if state == "not-ready":
        return Check("confidential-computing", WARN, f"{label}, ready state not-ready",
                     "the attestation flow sets it, or set confidential_computing."
                     "set_ready_state: true in the config")
    return Check("confidential-computing", FAIL, f"{label}, ready state unknown ({state})",
                 "run nvidia-smi conf-compute -grs by hand")


def guest_tee_row(facts) -> Check:
    """The guest's TEE as the kernel's interfaces say it (host/tee.py), what the boot names in a
    confidential guest's reasons; no evidence is ``skip`` (it proves nothing either way)."""
    from podvm_gpu.host import tee

    guest = tee.detect(facts.root)
    if guest.kind is None:
        return Check("guest-tee", SKIP, f"{guest.describe()} (a regular VM, or the attestation "
                     "modules load later)")
    return Check("guest-tee", PASS, guest.describe())


def _attestation_row(facts) -> Check:
    from podvm_gpu.attestation.check import fresh_row, record_row

    return fresh_row(facts) if getattr(facts, "attest", False) else record_row(facts)


def _attestation_image_row(image) -> Check:
    from podvm_gpu.attestation.check import image_row

    return image_row(image)


VM_ROWS = {"guest-tee": guest_tee_row, "confidential-computing": confidential_computing_row,
           "attestation": _attestation_row}
IMAGE_ROWS = {"attestation": _attestation_image_row}
