"""Step 8, ``confidential-computing``: classify the GPUs' CC state, enforce it, and set the ready
state where allowed.

1. Read: ``nvidia-smi conf-compute -f``, ``-d``, ``-e``, ``-mgm`` (query.py), one
   :class:`~podvm_gpu.steps.cc.classify.CcAnswers`, recorded in the status
   (``confidential_computing``).
2. Decide (classify.decide, the same for ``podvm-gpu check``): a lost GPU, an unknown CC status
   and dev-tools mode fail (dev-tools: unless ``allow_devtools``); CC on, or CC off with Protected
   PCIe, is a confidential GPU; anything else fails in a confidential guest (host/tee.py's
   evidence; the kernel log alone only warns) unless ``allow_cc_off``, and is ``skipped`` on a
   regular VM.
3. The ready state (``-grs``): ready is ``ok``; not ready with ``set_ready_state: false`` is
   ``ok`` with a warning (the attestation flow sets it); a dev-tools GPU's is never set.
4. Before ``-srs 1``: wait until the fabricmanager step has succeeded (it runs beside this step;
   the GPUs and NVSwitches of a fabric are attested and made ready together), then
   :func:`before_ready_state`, the hook where attestation goes (issue 26: the GPU set is read
   right before nvattest, issue 45), then :func:`same_gpus` (the GPU set read again must be
   the one attested, issue 45), then :func:`bind_pass` (an attestation that passed is bound
   into TDX RTMR3, issue 37), then ``-srs 1`` and ``-grs`` again.

``-srs 1`` never runs for a dev-tools GPU nor for one that is not confidential.
"""

from __future__ import annotations

from podvm_gpu.errors import StepFailed
from podvm_gpu.gpufacts import judge, words
from podvm_gpu.steps import Skipped
from podvm_gpu.steps.cc import classify
from podvm_gpu.steps.cc.query import conf_compute, guest, read_finding, ready_state, wait_for_fabric
from podvm_gpu.steps.cc.rows import IMAGE_ROWS, VM_ROWS
from podvm_gpu.steps.context import BootContext

__all__ = ["run", "plan", "plan_notes", "before_ready_state", "same_gpus", "bind_pass", "VM_ROWS",
           "IMAGE_ROWS"]


def before_ready_state(ctx: BootContext, finding: classify.CcAnswers, state: str = "not-ready",
                       tee: str | None = None) -> str:
    """The hook between the classification and ``nvidia-smi conf-compute -srs 1``: the
    attestation (issue 26; podvm_gpu/steps/cc/attest/gate.py, docs/interface.md 3.12), after the
    fabricmanager step succeeded (waited for only when an attestation runs; ``-srs 1`` waits
    for it anyway).

    Called for every GPU the classification accepted (confidential, or dev-tools allowed by
    the config), whatever the ready state found (``state``: a re-run finds it ``ready`` and
    attests again) and whatever ``set_ready_state`` says. Protected PCIe attests the
    NVSwitches too, with the same nonce.

    Args:
        ctx: the boot's context.
        finding: the classification this boot made.
        state: the ready state found, ``ready`` or ``not-ready``.
        tee: the confidential guest as host/tee.py describes it, or None.

    Returns:
        What the step's message adds (``""`` when nothing was attested).

    Raises:
        StepFailed: the attestation failed, or was required and nvattest is unusable (the
            ready state found ``ready`` was set back to not-ready first).
    """
    from podvm_gpu.steps.cc import identity
    from podvm_gpu.steps.cc.attest.gate import attest_before_ready

    def before_run():  # the fabric first, then the GPU set the evidence must cover (issue 45)
        wait_for_fabric(ctx)
        try:
            ctx.gpus_before_attestation = identity.read(ctx.runner, "before nvattest", ctx.root)
        except StepFailed as err:
            ctx.status.attestation = {"result": "failed", "reason": str(err)}
            raise

    return attest_before_ready(ctx, state, tee, ppcie=finding.multi_gpu == judge.MGM_PPCIE,
                               before_run=before_run)


def same_gpus(ctx: BootContext, state: str) -> str:
    """After an attestation that passed, before the binding's ``pass`` and ``-srs 1``: the GPU
    set read again must be the one read before nvattest, and the evidence must cover it
    (podvm_gpu/steps/cc/identity.py, issue 45; after the fabric wait, which ran before
    nvattest).

    Returns:
        What the step's message adds (``""`` when no attestation passed).

    Raises:
        StepFailed: a GPU changed (named: bus id, UUID, what changed), or the read failed; a
            ready state found ``ready`` is set back to not-ready first.
    """
    attestation = ctx.status.attestation
    before = getattr(ctx, "gpus_before_attestation", None)
    if not (isinstance(attestation, dict) and attestation.get("result") == "passed") \
            or before is None:
        return ""
    from podvm_gpu.steps.cc import identity

    wait_for_fabric(ctx)  # ended before nvattest ran: the same answer, at once
    return identity.confirm(ctx, before, state)


def bind_pass(ctx: BootContext, state: str) -> str:
    """After an attestation that passed, before ``-srs 1``: bind ``pass`` into RTMR3 with its
    event in the attestation-agent's log (podvm_gpu/steps/cc/bind.py, docs/interface.md 3.14).

    Returns:
        What the step's message adds (``""`` when nothing passed, or nothing was bound).

    Raises:
        StepFailed: the binding is broken, or required and impossible (a ready state found
            ``ready`` is set back to not-ready first, as for a failed attestation).
    """
    attestation = ctx.status.attestation
    if not (isinstance(attestation, dict) and attestation.get("result") == "passed"):
        return ""
    from podvm_gpu.steps.cc import bind
    from podvm_gpu.steps.cc.attest.gate import _unready

    ctx.status.binding, failure = bind.for_boot(ctx.root, ctx.status,
                                                ctx.config.confidential_computing.bind, bind.PASS)
    if failure:
        raise StepFailed(f"{failure}{_unready(ctx, state)}")
    binding = ctx.status.binding
    if binding["state"] != bind.BOUND:
        return ""
    return "; pass bound into RTMR3" if binding["appended"] else "; pass already bound into RTMR3"


def run(ctx: BootContext) -> str:
    """Classify, enforce, and check (where allowed set) the ready state (module docstring).

    Raises:
        StepFailed: the decision failed, or a ready-state query or setting failed.
        Skipped: not a confidential GPU on a regular VM (or accepted by ``allow_cc_off``).
    """
    finding = read_finding(ctx)
    ctx.status.confidential_computing = finding
    tee, hint = guest(ctx.root)
    if hint:
        ctx.warn(f"confidential-computing: {hint}")
    cfg = ctx.config.confidential_computing
    verdict = classify.decide(finding, tee, cfg.allow_devtools, cfg.allow_cc_off)
    for line in verdict.warnings:
        ctx.warn(f"confidential-computing: {line}")
    if verdict.outcome == classify.FAIL:
        raise StepFailed(f"{verdict.reason}; {verdict.fix}")
    if verdict.outcome == classify.SKIP:
        from podvm_gpu.steps.cc.attest.gate import attestation_demanded

        demanded = attestation_demanded(ctx)  # required: ready means attested, no less
        if demanded:
            ctx.status.attestation = {"result": "failed", "reason": f"{verdict.reason}: not "
                                      "confidential, so nvattest cannot attest them"}
            raise StepFailed(f"attestation required ({demanded}) but {verdict.reason}: a GPU "
                             "that is not confidential cannot be attested")
        if tee and cfg.allow_cc_off:  # a confidential guest accepting a GPU that is not
            ctx.warn("confidential-computing: the GPUs are not attested: not confidential, "
                     "accepted by confidential_computing.allow_cc_off")
            ctx.status.attestation = {"result": "not-run", "reason": "the GPUs are not "
                                      "confidential (confidential_computing.allow_cc_off)"}
        raise Skipped(verdict.reason)
    label = verdict.reason
    from podvm_gpu.steps.cc import multigpu

    failure, warning = multigpu.judge_gpus(finding, ctx.gpus, tee, cfg)
    if failure:  # before nvattest and the ready state (issue 45)
        raise StepFailed(f"{failure}; {multigpu.FIX}")
    if warning:
        ctx.warn(f"confidential-computing: {warning}")
    state = ready_state(ctx)
    attested = before_ready_state(ctx, finding, state, tee)
    same = same_gpus(ctx, state)
    bound = bind_pass(ctx, state)
    said = (f"; {attested}" if attested else "") + same + bound
    if state == "ready":
        return f"{label}, ready state ready{said}"
    if verdict.outcome == classify.DEVTOOLS:
        return f"{label}, ready state not-ready (never set for a dev-tools GPU){said}"
    if not cfg.set_ready_state:
        ctx.warn("confidential-computing: GPU ready state is not-ready; left for the attestation "
                 "flow to set (set_ready_state: false)")
        return f"{label}, ready state not-ready (left for the attestation flow){said}"
    waited = wait_for_fabric(ctx)
    done = conf_compute(ctx, "-srs", "1")
    if done.returncode != 0:
        raise StepFailed(f"nvidia-smi conf-compute -srs 1 failed "
                         f"({words.ended(done.returncode, done.output)})")
    state = ready_state(ctx)
    if state != "ready":
        raise StepFailed(f"CC ready state still {state} after nvidia-smi conf-compute -srs 1")
    return f"{label}, ready state set to ready{waited}{said}"


NONCE_PLACEHOLDER = "<fresh nonce: 32 random bytes, hex>"


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the CC queries, the ready state's query, the attestation's calls
    (docs/interface.md 3.12) and ``-srs 1``, in the order the step makes them. What runs after
    the queries depends on their answers (a GPU that is not confidential ends the step before
    it, a ready state found ready skips ``-srs 1``): :func:`plan_notes` says so. The
    attestation (between two reads of the GPU set, issue 45) is listed unless the config turns
    it off, or nvattest is not installed and nothing requires it (a regular VM: the boot
    warns); its nonce, fresh in each boot, is :data:`NONCE_PLACEHOLDER`. ``-srs 1`` only with
    ``set_ready_state: true``."""
    from podvm_gpu.gpufacts.smi import conf_compute_argv, identity_argv

    argvs = [conf_compute_argv(query) for query in classify.QUERIES]
    argvs.append(conf_compute_argv("-grs"))
    if _plans_attestation(ctx):
        from podvm_gpu.steps.cc.attest import run as nvattest

        argvs.append(identity_argv())  # the GPU set before nvattest and after it (issue 45)
        argvs.append(["nvattest", "--log-level", "info", "version"])
        argvs.append(nvattest.command("gpu", NONCE_PLACEHOLDER, ctx.config.confidential_computing,
                                      ctx.root))
        argvs.append(identity_argv())
    if ctx.config.confidential_computing.set_ready_state:
        argvs += [conf_compute_argv("-srs", "1"), conf_compute_argv("-grs")]
    return argvs


def plan_notes(ctx: BootContext) -> list[str]:
    """``boot --dry-run``: what the plan of :func:`plan` cannot know before the queries run."""
    cc = ctx.config.confidential_computing
    notes = ["confidential-computing: the calls after nvidia-smi conf-compute -grs run only for "
             "GPUs the queries find confidential (CC on, or Protected PCIe; dev-tools with "
             "allow_devtools)" + ("; -srs 1 only when the ready state is found not-ready "
                                  "(never for a dev-tools GPU)" if cc.set_ready_state else "")]
    if _plans_attestation(ctx) and ctx.nvswitches:
        notes.append("confidential-computing: in Protected PCIe mode (known only at run time, "
                     "from nvidia-smi conf-compute -mgm) a second run attests the NVSwitches "
                     "with the same nonce: nvattest attest --device nvswitch ... (the same "
                     "options)")
    if cc.attestation != "off" and not _plans_attestation(ctx):
        notes.append("confidential-computing: nvattest is not installed: a boot on this VM "
                     "does not attest the GPUs (a warning), unless the pod's initdata requires "
                     "it (read at boot only): then it fails closed")
    return notes


def _plans_attestation(ctx: BootContext) -> bool:
    """Whether a boot would run nvattest for confidential GPUs (attest/gate.py's policy; the
    pod's initdata is read at boot only)."""
    from podvm_gpu.steps.cc.attest.gate import required_because, tee_guest

    cc = ctx.config.confidential_computing
    if cc.attestation == "off":
        return False
    return ctx.runner.which("nvattest") is not None or \
        required_because(cc, tee_guest(ctx)) is not None
