"""The GPUs made ready are the GPUs attested (issue 45; podvm_gpu/steps/cc/identity.py): the GPU set
read before nvattest and again before the ready state, the evidence's count and ueids, and the
step's order (the binding's ``pass`` only after the second read matched)."""

from __future__ import annotations

import time

import pytest

from podvm_gpu.config.load import parse_config
from podvm_gpu.errors import StepFailed
from podvm_gpu.gpufacts import smi
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Completed
from podvm_gpu.model import Status
from podvm_gpu.steps.cc import identity, step
from podvm_gpu.steps.context import BootContext

A = "GPU-3f6c1a2e-7b4d-4e8a-9c1f-0d2e4b6a8c00"
B = "GPU-3f6c1a2e-7b4d-4e8a-9c1f-0d2e4b6a8c01"
ROWS = f"0, 00000000:18:00.0, {A}\n1, 00000000:2A:00.0, {B}\n"


def gpu(index, bus, uuid, ueid=None):
    return identity.GpuIdentity(index, bus, uuid, ueid)


def test_the_identity_query_is_one_every_build_answers():
    assert smi.identity_argv() == ["nvidia-smi", "--query-gpu=index,pci.bus_id,uuid",
                                   "--format=csv,noheader"]
    assert smi.parse_identities(ROWS) == [(0, "00000000:18:00.0", A), (1, "00000000:2A:00.0", B)]


@pytest.mark.parametrize("text", ["", "No devices were found\n", f"0, [N/A], {A}\n",
                                  "0, 00000000:18:00.0, [GPU is lost]\n", f"x, 00000000:18:00.0, {A}\n",
                                  "0, 00000000:18:00.0\n"])
def test_an_answer_without_every_identity_is_none(text):
    assert smi.parse_identities(text) is None


class Runner:
    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def run(self, argv, check=False, **_):
        self.calls.append(argv)
        rc, out = self.answers.pop(0)
        return Completed(argv, rc, out, "", 0.0)


def test_read_normalises_and_refuses_a_failed_or_doubled_answer():
    assert identity.read(Runner((0, ROWS)), "before nvattest") == [
        gpu(0, "00000000:18:00.0", A), gpu(1, "00000000:2A:00.0", B)]
    with pytest.raises(StepFailed, match=r"before nvattest \(nvidia-smi --query-gpu=index,"
                                         r"pci.bus_id,uuid exit 6 \(not found \(no GPU "
                                         r"listed\)\): No devices were found"):
        identity.read(Runner((6, "No devices were found\n")), "before nvattest")
    with pytest.raises(StepFailed, match=f"lists uuid {A} twice"):
        identity.read(Runner((0, f"0, 00000000:18:00.0, {A}\n1, 00000000:2A:00.0, {A}\n")), "now")


def test_changed_names_the_gpu_and_what_changed():
    before = [gpu(0, "00000000:18:00.0", A), gpu(1, "00000000:2A:00.0", B)]
    assert identity.changed(before, list(before)) is None
    assert identity.changed(before, [before[0], gpu(1, "00000000:2A:00.0", "GPU-new")]) == \
        f"GPU 00000000:2A:00.0 ({B}): UUID now GPU-new"
    assert identity.changed(before, before[:1]) == f"GPU 00000000:2A:00.0 ({B}) is gone"
    assert identity.changed(before[:1], before) == f"GPU 00000000:2A:00.0 ({B}) appeared, not attested"
    assert identity.changed(before, [gpu(1, "00000000:18:00.0", A), gpu(0, "00000000:2A:00.0", B)]) \
        == f"GPU 00000000:18:00.0 ({A}): index 0 now 1"


def test_the_evidence_must_hold_one_claim_per_gpu_and_distinct_ueids():
    before = [gpu(0, "00000000:18:00.0", A), gpu(1, "00000000:2A:00.0", B)]
    claims = [{"type": "gpu", "ueid": "111"}, {"type": "gpu", "ueid": "222"}]
    kept = identity.with_ueids(before, claims)
    assert [g.ueid for g in kept] == ["111", "222"]
    assert identity.evidence_failure(kept, claims) is None
    assert "1 GPU claim(s), nvidia-smi listed 2" in identity.evidence_failure(kept, claims[:1])
    same = [{"type": "gpu", "ueid": "111"}, {"type": "gpu", "ueid": "111"}]
    assert "give the same ueid" in identity.evidence_failure(identity.with_ueids(before, same), same)
    switches = claims + [{"type": "nvswitch", "ueid": "9"}]  # NVSwitch claims are not GPUs
    assert identity.evidence_failure(identity.with_ueids(before, switches), switches) is None


GRS_NOT_READY = "\nConfidential Compute GPUs Ready state: not-ready\n\n"
CC = {"-f": "CC status: ON\n", "-d": "DevTools Mode: OFF\n", "-e": "CC Environment: PRODUCTION\n",
      "-mgm": "Multi-GPU Mode: None\n"}


class StepRunner:
    """conf-compute from a table, the identity query from a list of answers (one per read)."""

    def __init__(self, reads):
        self.reads, self.calls, self.ready = list(reads), [], False

    def run(self, argv, check=False, **_):
        self.calls.append(argv)
        if argv == smi.identity_argv():
            return Completed(argv, 0, self.reads.pop(0), "", 0.0)
        if argv[2:] == ["-srs", "1"]:
            self.ready = True
            return Completed(argv, 0, "", "", 0.0)
        if argv[2] == "-grs":
            text = GRS_NOT_READY.replace("not-ready", "ready") if self.ready else GRS_NOT_READY
            return Completed(argv, 0, text, "", 0.0)
        return Completed(argv, 0, CC[argv[2]], "", 0.0)


def run_step(tmp_path, monkeypatch, reads):
    """One GPU, a TDX guest; nvattest replaced by a passing record (the gate is tested in
    test_attestation_gate.py); the binding recorded in order."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu tdx_guest\n")
    ctx = BootContext(Root(str(tmp_path)), parse_config("confidential_computing: {set_ready_state: "
                                                        "true}\n", "c.yaml"),
                      StepRunner(reads), Status(), time.monotonic() + 60)
    order = []

    def attest(ctx, state, guest, ppcie=False, before_run=None):
        before_run()
        order.append("nvattest")
        ctx.status.attestation = {"result": "passed", "reason": None,
                                  "devices": [{"type": "gpu", "index": 0, "ueid": "4711"}]}
        return "attested (1 device, nvattest local verifier)"

    def bind(ctx, state):
        order.append("bind pass")
        return ""

    from podvm_gpu.steps.cc.attest import gate

    monkeypatch.setattr(gate, "attest_before_ready", attest)
    monkeypatch.setattr(step, "bind_pass", bind)
    return ctx, order


def test_the_same_gpu_is_bound_and_made_ready_and_its_identity_kept(tmp_path, monkeypatch):
    one = f"0, 00000000:18:00.0, {A}\n"
    ctx, order = run_step(tmp_path, monkeypatch, [one, one])

    message = step.run(ctx)

    assert "the same 1 GPU as attested" in message and "set to ready" in message
    reads = [i for i, argv in enumerate(ctx.runner.calls) if argv == smi.identity_argv()]
    srs = ctx.runner.calls.index(["nvidia-smi", "conf-compute", "-srs", "1"])
    assert len(reads) == 2 and reads[1] < srs
    assert order == ["nvattest", "bind pass"]
    assert ctx.status.attested_gpus == [{"index": 0, "bus_id": "00000000:18:00.0", "uuid": A,
                                         "ueid": "4711"}]
    assert ctx.attested_gpus == [gpu(0, "00000000:18:00.0", A, "4711")]
    assert ctx.status.to_dict()["attested_gpus"] == ctx.status.attested_gpus


def test_a_uuid_changed_after_nvattest_fails_before_the_binding_and_srs(tmp_path, monkeypatch):
    ctx, order = run_step(tmp_path, monkeypatch, [f"0, 00000000:18:00.0, {A}\n",
                                                  f"0, 00000000:18:00.0, {B}\n"])

    with pytest.raises(StepFailed, match=f"attestation failed: the GPUs changed after the "
                                         rf"attestation: GPU 00000000:18:00.0 \({A}\): UUID now {B}"):
        step.run(ctx)

    assert order == ["nvattest"]  # no pass bound: the boot's end binds fail
    assert ["nvidia-smi", "conf-compute", "-srs", "1"] not in ctx.runner.calls
    assert ctx.status.attestation["result"] == "failed"
    assert "UUID now" in ctx.status.attestation["reason"]
