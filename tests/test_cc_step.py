"""The confidential-computing step's run() with nvidia-smi's answers given in-process: where
``-srs 1`` runs and where it never does, and the hook for attestation (issue 26) between the
classification and ``-srs 1`` (podvm_gpu/steps/cc/step.py)."""

from __future__ import annotations

import time

import pytest

from podvm_gpu.config.load import parse_config
from podvm_gpu.errors import StepFailed
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Completed
from podvm_gpu.model import Status
from podvm_gpu.steps import Skipped
from podvm_gpu.steps.cc import step
from podvm_gpu.steps.context import BootContext

GRS_NOT_READY = "\nConfidential Compute GPUs Ready state: not-ready\n\n"
GRS_READY = "\nConfidential Compute GPUs Ready state: ready\n\n"


class FakeRunner:
    """nvidia-smi conf-compute answered from a table (the real program's words); -srs 1 makes
    -grs answer ready, as the real one does."""

    def __init__(self, answers: dict):
        self.answers, self.calls = dict(answers), []

    def run(self, argv, check=False, **_):
        self.calls.append(argv[2:])
        if argv[2:] == ["-srs", "1"]:
            self.answers["-grs"] = (0, GRS_READY)
            return Completed(argv, 0, "", "", 0.0)
        rc, out = self.answers[argv[2]]
        return Completed(argv, rc, out, "", 0.0)


def context(tmp_path, answers: dict, config: str = "confidential_computing: {set_ready_state: true}\n",
            cpu_flag: str = "") -> BootContext:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(f"processor\t: 0\nflags\t\t: fpu {cpu_flag}\n")
    ctx = BootContext(Root(str(tmp_path)), parse_config(config, "config.yaml"), FakeRunner(answers),
                      Status(), time.monotonic() + 60)
    return ctx


def smi(f="ON", d="OFF", e="PRODUCTION", mgm="None", grs=GRS_NOT_READY):
    return {"-f": (0, f"CC status: {f}\n"), "-d": (0, f"DevTools Mode: {d}\n"),
            "-e": (0, f"CC Environment: {e}\n"), "-mgm": (0, f"Multi-GPU Mode: {mgm}\n"),
            "-grs": (0, grs)}


def test_a_confidential_gpu_passes_the_hook_then_gets_srs(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(step, "before_ready_state",
                        lambda ctx, finding, state, tee: seen.append(finding) or "")
    ctx = context(tmp_path, smi(f="OFF", mgm="Protected PCIe"), cpu_flag="tdx_guest")

    message = step.run(ctx)

    assert [f.label for f in seen] == ["ppcie"]
    assert ["-srs", "1"] in ctx.runner.calls and "set to ready" in message
    assert ctx.status.confidential_computing is seen[0]


def test_the_hook_raising_keeps_the_ready_state_unset(tmp_path, monkeypatch):
    def refuse(ctx, finding, state, tee):
        raise StepFailed("attestation failed")

    monkeypatch.setattr(step, "before_ready_state", refuse)
    ctx = context(tmp_path, smi(), cpu_flag="tdx_guest")

    with pytest.raises(StepFailed, match="attestation failed"):
        step.run(ctx)
    assert ["-srs", "1"] not in ctx.runner.calls


@pytest.mark.parametrize("answers, config, flag, ends", [
    (smi(d="ON"), "confidential_computing: {set_ready_state: true}\n", "", StepFailed),
    (smi(d="ON"), "confidential_computing: {set_ready_state: true, allow_devtools: true}\n", "", None),
    (smi(f="OFF"), "confidential_computing: {set_ready_state: true}\n", "sev_snp", StepFailed),
    (smi(f="OFF"), "confidential_computing: {set_ready_state: true, allow_cc_off: true}\n", "sev_snp",
     Skipped),
    (smi(f="OFF"), "confidential_computing: {set_ready_state: true}\n", "", Skipped),
], ids=["dev-tools", "dev-tools-allowed", "cc-off-in-snp", "cc-off-allowed", "cc-off-regular-vm"])
def test_srs_never_runs_for_a_dev_tools_or_non_confidential_gpu(tmp_path, monkeypatch, answers, config,
                                                                 flag, ends):
    called = []
    monkeypatch.setattr(step, "before_ready_state",
                        lambda ctx, finding, state, tee: called.append(state) or "")
    ctx = context(tmp_path, answers, config, flag)
    if ends is None:
        assert "never set for a dev-tools GPU" in step.run(ctx)
    else:
        with pytest.raises(ends):
            step.run(ctx)
    assert ["-srs", "1"] not in ctx.runner.calls
    # issue 26: a dev-tools GPU the config allows is attested too (its ready state never set);
    # a GPU the classification refused or skipped never reaches the hook
    assert called == (["not-ready"] if ends is None else [])


@pytest.mark.parametrize("config", [
    "confidential_computing: {attestation: required}\n",
    "confidential_computing: {attestation: required, allow_cc_off: true}\n"])
def test_attestation_required_fails_a_gpu_that_is_not_confidential(tmp_path, config):
    """Issue 26: with attestation required, ready means attested; a CC-off GPU (skipped on a
    regular VM, or accepted by allow_cc_off in a guest) cannot be attested, so the step fails."""
    ctx = context(tmp_path, smi(f="OFF"), config, "sev_snp" if "allow_cc_off" in config else "")

    with pytest.raises(StepFailed, match=r"attestation required \(confidential_computing."
                                         r"attestation: required\) but .*cannot be attested"):
        step.run(ctx)
    assert ctx.status.attestation["result"] == "failed"
    assert ["-srs", "1"] not in ctx.runner.calls
