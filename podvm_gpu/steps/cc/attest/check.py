"""``podvm-gpu check``'s ``attestation`` rows: from the boot's record (a running VM), from a
fresh run (``check --attest``: it writes nothing and needs the network), and what an image
needs (``check --image``; ``confidential_computing.image_serves`` makes a lack fail)."""

from __future__ import annotations

import json

from podvm_gpu.row import FAIL, NO_GPU, PASS, SKIP, WARN, Check, doc_ref

ROW = "attestation"
NSCQ = "libnvidia-nscq.so.2"  # dlopen()ed by nvattest --device nvswitch (nvattest.md 2.3)
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
             "/lib/x86_64-linux-gnu", "/lib64")
_BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin")
# NVAT's "GPU is neither in CC nor in PPCIe mode" (exit 253): the real nvattest 1.2.2's answer on
# an H200 with CC off, before any evidence is collected (../shared/nvattest.md, "Confirmed with
# the real binary")
NOT_CC_CODE = 509


def _when_it_fails() -> str:
    return doc_ref("operating.md", "When attestation fails")


def record_row(facts) -> Check:
    """The boot's ``attestation`` record (status.json) and the nvattest output it kept: they
    must agree (the claims' SHA-256)."""
    from podvm_gpu.status import read_status

    skip = facts.not_reached("confidential-computing")
    if skip:
        return Check(ROW, SKIP, skip.detail)
    if not facts.gpus:
        return Check(ROW, SKIP, NO_GPU)
    record = (read_status(facts.root) or {}).get("attestation")
    if not isinstance(record, dict):
        return Check(ROW, SKIP, "no attestation in the last boot (CC off or not supported, or "
                     "the boot did not reach it)")
    result, reason = record.get("result"), record.get("reason")
    if result == "off":
        return Check(ROW, WARN, "not attested: confidential_computing.attestation is off",
                     "set it to auto or required in a confidential pod VM")
    if result == "not-run":
        return Check(ROW, WARN, f"not attested: {reason}", "install NVIDIA's nvattest in the "
                     "image (podvm-gpu check --attest runs one now)")
    if result != "passed":
        return Check(ROW, FAIL, f"failed: {reason}", f"see {_when_it_fails()}; podvm-gpu check "
                     "--attest runs a fresh one")
    for run in record.get("runs") or []:
        problem = _kept_problem(facts.root, run)
        if problem:
            return Check(ROW, FAIL, problem, "the file beside status.json changed after the "
                         "boot; podvm-gpu check --attest runs a fresh one")
    devices = record.get("devices") or []
    return Check(ROW, PASS, f"passed: {len(devices)} device(s) attested by nvattest "
                 f"{record.get('nvattest_version') or '(version unknown)'}, local verifier, "
                 f"NVAT {record.get('code')} ({record.get('message')})")


def _kept_problem(root, run: dict) -> str | None:
    from podvm_gpu.host.fs import read_bounded
    from podvm_gpu.steps.cc.attest.verdict import claims_sha256

    path = run.get("output")
    if not path:
        return None
    try:
        doc = json.loads(read_bounded(root / path, 16 << 20))
    except (OSError, ValueError) as err:
        return f"the kept nvattest output {path} is unreadable: {err}"
    claims = doc.get("claims") if isinstance(doc, dict) else None
    if not isinstance(claims, list) or claims_sha256(claims) != run.get("claims_sha256"):
        return f"the kept nvattest output {path} does not match the record's claims_sha256"
    return None


class _Probe:
    """What :func:`podvm_gpu.steps.cc.attest.gate.attest` reads of a BootContext, for check."""

    def __init__(self, facts):
        from podvm_gpu import readers

        self.root, self.config, self.runner = facts.root, facts.config, facts.runner
        self.gpus, self.nvswitches = facts.gpus, facts.nvswitches
        self.driver_version = readers.kernel_module_version(facts.root)
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)


def fresh_row(facts, ppcie: bool = False) -> Check:
    """``check --attest``: a fresh nvattest run, judged as boot judges it; nothing is written
    (no status, no kept output, no ready state)."""
    from podvm_gpu.errors import CommandError
    from podvm_gpu.steps.cc.attest.gate import attest

    if not facts.gpus:
        return Check(ROW, SKIP, NO_GPU)
    if facts.runner.which("nvattest") is None:
        return Check(ROW, FAIL, f"--attest: {facts.runner.why_missing('nvattest')}",
                     "install NVIDIA's nvattest or name it in tools.nvattest")
    probe = _Probe(facts)
    try:
        record = attest(probe, ppcie, write=False)
    except CommandError as err:
        return Check(ROW, FAIL, f"--attest: {err}", f"see {_when_it_fails()}")
    if record["result"] != "passed" and record.get("code") == NOT_CC_CODE:
        # a GPU that is simply not confidential cannot be attested: nothing failed, unless
        # something requires attestation here (issue 35 item 21)
        must = _required(facts)
        if not must:
            return Check(ROW, SKIP, f"--attest: not attested: the GPU is not in CC or Protected "
                         f"PCIe mode (nvattest: NVAT {NOT_CC_CODE}, {record.get('message')})")
        return Check(ROW, FAIL, f"--attest: failed: attestation required ({must}) but the GPU "
                     f"is not in CC or Protected PCIe mode (nvattest: NVAT {NOT_CC_CODE}, "
                     f"{record.get('message')})", "turn CC on for the GPU (the host's VM "
                     "configuration), or lift the requirement")
    if record["result"] != "passed":
        return Check(ROW, FAIL, f"--attest: failed: {record['reason']}",
                     f"see {_when_it_fails()}")
    return Check(ROW, PASS, f"--attest: passed now: {len(record['devices'])} device(s), "
                 f"{record['duration_s']:g} s")


def _required(facts) -> str | None:
    """What requires attestation on this VM, as boot decides it (gate.py): the pod's initdata as
    the last boot read it (status.json ``initdata.attestation_required``), the config's
    ``attestation: required``, or ``auto`` in a confidential guest; None when nothing does."""
    from podvm_gpu.status import read_status
    from podvm_gpu.steps.cc.attest.gate import required_because, tee_guest

    pod = (read_status(facts.root) or {}).get("initdata")
    if isinstance(pod, dict) and pod.get("attestation_required") is True:
        return f'the pod\'s initdata ({pod.get("path")}, data."podvm-gpu.toml" attestation_required)'
    return required_because(facts.config.confidential_computing, tee_guest(facts))


def image_row(image) -> Check:
    """Whether the image has nvattest, and libnvidia-nscq when its config says it serves
    Protected PCIe (``confidential_computing.image_serves_protected_pcie``: the NVSwitches'
    evidence; no other VM needs it): ``warn`` when it lacks them, ``fail`` when
    ``confidential_computing.image_serves`` says it serves confidential GPU VMs."""
    import os

    root, cc = image.root, image.config.confidential_computing
    configured = image.config.tools.get("nvattest")
    paths = [configured] if configured else [f"{d}/nvattest" for d in _BIN_DIRS]
    have_tool = any(os.path.isfile(root / p) and os.access(root / p, os.X_OK) for p in paths)
    ppcie = cc.image_serves_protected_pcie
    have_nscq = not ppcie or any(os.path.exists(root / f"{d}/{NSCQ}") for d in _LIB_DIRS)
    lacks = ([] if have_tool else ["nvattest" + (f" at {configured} (config)" if configured
                                                 else "")]) + \
        ([] if have_nscq else [f"{NSCQ} (Protected PCIe: confidential_computing."
                               "image_serves_protected_pcie is true)"])
    if not lacks:
        return Check(ROW, PASS, f"nvattest and {NSCQ} present" if ppcie else
                     f"nvattest present ({NSCQ} not required: confidential_computing."
                     "image_serves_protected_pcie is false)")
    if cc.attestation == "off":
        return Check(ROW, WARN, f"lacks {', '.join(lacks)}; confidential_computing.attestation "
                     "is off")
    serves = cc.image_serves
    why = "confidential_computing.image_serves is true" if serves else \
        "a warning: confidential_computing.image_serves is false"
    fail = serves and (not have_tool or not have_nscq)
    install = "install " + " and ".join(
        what for what, lacking in (("NVIDIA's nvattest (NVAT CLI)", not have_tool),
                                   ("the driver's libnvidia-nscq", not have_nscq)) if lacking)
    # the hint never asks for the value the config already has (issue 35 item 9): an image
    # that does not say it serves confidential GPU VMs is told how to make the row hold it
    hint = install if serves else (
        f"{install} if the image serves confidential GPU VMs, and set "
        "confidential_computing.image_serves: true so that this row fails until it has them")
    return Check(ROW, FAIL if fail else WARN, f"for confidential GPU VMs the image lacks: "
                 f"{'; '.join(lacks)} ({why}); a confidential guest's boot fails without "
                 "nvattest", hint)
