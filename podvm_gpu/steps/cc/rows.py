"""``podvm-gpu check`` rows of the confidential-computing step: ``guest-tee``,
``confidential-computing`` (the same classification and decision as boot, classify.py, and
the same multi-GPU rule, multigpu.py) and
``attestation-agent-ordering`` (on a VM and in an image)."""

from __future__ import annotations

from podvm_gpu import units
from podvm_gpu.gpufacts import ask, words
from podvm_gpu.host import tee
from podvm_gpu.row import FAIL, PASS, SKIP, WARN, Check
from podvm_gpu.steps.cc import classify, multigpu
from podvm_gpu.steps.cc.query import answers, guest

CC_ROW = "confidential-computing"
ORDER_ROW = "attestation-agent-ordering"


def confidential_computing_row(facts) -> Check:
    """The CC classification and decision of boot, boot's multi-GPU rule (multigpu.py: a
    failure fails the row, an accepted set-up warns), then the ready state (read, never set)."""
    skip = facts.not_reached(CC_ROW) or facts.needs_driver(CC_ROW)
    if skip:
        return skip
    found = answers(lambda query: ask.conf_compute(facts.runner, query))
    finding = classify.from_smi(found)
    where, hint = guest(facts.root)
    cfg = facts.config.confidential_computing
    verdict = classify.decide(finding, where, cfg.allow_devtools, cfg.allow_cc_off)
    notes = "; ".join(verdict.warnings + ([hint] if hint else []))
    if verdict.outcome == classify.FAIL:
        return Check(CC_ROW, FAIL, verdict.reason, verdict.fix)
    if verdict.outcome == classify.SKIP:
        return Check(CC_ROW, WARN if verdict.warnings else SKIP,
                     verdict.reason + (f"; {notes}" if notes and verdict.warnings else ""))
    label = verdict.reason if verdict.outcome == classify.CONFIDENTIAL else \
        "CC devtools (allowed by confidential_computing.allow_devtools: not production CC)"
    failure, warning = multigpu.judge_gpus(finding, facts.gpus, where, cfg)  # boot's rule
    if failure:
        return Check(CC_ROW, FAIL, failure, multigpu.FIX)
    notes = "; ".join(filter(None, [notes, warning]))
    state, grs = ask.ready_state(facts.runner)
    level = PASS if verdict.outcome == classify.CONFIDENTIAL and not verdict.warnings \
        and not warning else WARN
    extra = f"; {notes}" if notes else ""
    if state == "ready":
        return Check(CC_ROW, level, f"{label}, ready state ready{extra}")
    if state == "not-ready":
        return Check(CC_ROW, WARN, f"{label}, ready state not-ready{extra}",
                     "the attestation flow sets it, or set confidential_computing."
                     "set_ready_state: true in the config")
    return Check(CC_ROW, FAIL, f"{label}, ready state unknown (nvidia-smi conf-compute -grs "
                 f"{words.ended(grs.returncode, grs.output)})",
                 "run nvidia-smi conf-compute -grs by hand")


def guest_tee_row(facts) -> Check:
    """The guest's TEE as the kernel's interfaces say it (host/tee.py), what the boot names in a
    confidential guest's reasons; no evidence is ``skip`` (it proves nothing either way)."""
    found = tee.detect(facts.root)
    if found.kind is None:
        _where, hint = guest(facts.root)
        return Check("guest-tee", SKIP, f"{found.describe()} (a regular VM, or the attestation "
                     "modules load later)" + (f"; {hint}" if hint else ""))
    return Check("guest-tee", PASS, found.describe())


def attestation_agent_ordering(root) -> Check:
    """An installed attestation-agent.service starts after podvm-gpu.service (its drop-in's
    ``After=``, or the agent's ``Before=``); ``skip`` when none is installed."""
    ok, how = units.ordered_before(root, units.ATTESTATION_UNIT)
    if units.unit_file(root, units.ATTESTATION_UNIT) is None:
        return Check(ORDER_ROW, SKIP, f"no {units.ATTESTATION_UNIT} installed ({how})")
    if not ok:
        return Check(ORDER_ROW, FAIL, f"{how}: attestation-agent may find no GPU, or be the "
                     "first NVML client before nvidia-persistenced",
                     f"install the drop-in {units.ATTESTATION_UNIT}.d/10-podvm-gpu.conf "
                     "(systemd/install-podvm-gpu.sh does)")
    return Check(ORDER_ROW, PASS, how)


def attestation_row(facts) -> Check:
    """The GPUs' attestation (podvm_gpu/steps/cc/attest/check.py): the boot's record, or with
    ``check --attest`` a fresh run."""
    from podvm_gpu.steps.cc.attest.check import fresh_row, record_row

    return fresh_row(facts) if getattr(facts, "attest", False) else record_row(facts)


def attestation_image_row(image) -> Check:
    """What the image needs to attest (podvm_gpu/steps/cc/attest/check.py)."""
    from podvm_gpu.steps.cc.attest.check import image_row

    return image_row(image)


def binding_row(facts) -> Check:
    """The GPUs' verdict bound into TDX RTMR3 (podvm_gpu/steps/cc/bind.py)."""
    from podvm_gpu.steps.cc.bind import binding_row as row

    return row(facts)


VM_ROWS = {"guest-tee": guest_tee_row, CC_ROW: confidential_computing_row,
           "attestation": attestation_row, "binding": binding_row,
           ORDER_ROW: lambda facts: attestation_agent_ordering(facts.root)}
IMAGE_ROWS = {"attestation": attestation_image_row,
              ORDER_ROW: lambda image: attestation_agent_ordering(image.root)}
