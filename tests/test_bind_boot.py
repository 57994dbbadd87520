"""The binding at a boot's end (issue 37; docs/interface.md 3.14): a real ``run_boot`` on this
machine (no NVIDIA GPU on its PCI: the CPU fast path) under a temporary root with a TDX
``rtmr3:sha384``, the register being tests/rtmr_fake.py's FakeRegister behind
podvm_gpu/host/rtmr.py's Register seam.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rtmr_fake import FakeRegister
from schemas import assert_status_conforms

import podvm_gpu.boot as boot
from podvm_gpu.boot.run import Run
from podvm_gpu.host import rtmr

LOG = rtmr.EVENTLOG_PATH.lstrip("/")


def tdx_root(tmp_path: Path, register: FakeRegister, monkeypatch) -> Path:
    node = tmp_path / rtmr.RTMR3_PATH.lstrip("/")
    node.parent.mkdir(parents=True)
    node.write_bytes(bytes(48))  # the kernel's file; its value is the fake's
    monkeypatch.setattr(rtmr, "Register", lambda path: register)
    return tmp_path


def status(root: Path) -> dict:
    doc = json.loads((root / "run/podvm-gpu/status.json").read_text())
    assert_status_conforms(doc)
    return doc


def events(root: Path) -> list[dict]:
    data = (root / LOG).read_bytes() if (root / LOG).exists() else b""
    return [json.loads(r.text().split(" ", 2)[2]) for r in rtmr.parse_records(data, False, "l")]


def config(root: Path, text: str) -> None:
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text(text)


def test_a_tdx_cpu_vm_binds_none(tmp_path, monkeypatch):
    """(A rerun's ``same result: nothing appended`` is tests/test_bind.py's: a second boot in
    this process would wait for the first one's lock.)"""
    register = FakeRegister()
    root = tdx_root(tmp_path, register, monkeypatch)
    assert boot.run_boot(str(root)) == 0
    doc = status(root)
    assert doc["state"] == "no-gpu"
    assert doc["binding"]["state"] == "bound" and doc["binding"]["result"] == "none"
    assert doc["binding"]["appended"] is True
    [said] = events(root)
    assert said["result"] == "none" and said["gpus"] == 0 and said["nonce"] is None
    assert register.writes == [(48, 0)] and register.value != bytes(48)
    assert doc["binding"]["digest"] == rtmr.parse_records((root / LOG).read_bytes(), False,
                                                          "l")[0].digest.hex()


def test_a_vm_without_the_register_is_unbound_and_writes_nothing(tmp_path):
    assert boot.run_boot(str(tmp_path)) == 0
    doc = status(tmp_path)
    assert doc["binding"]["state"] == "unbound" and "rtmr3:sha384" in doc["binding"]["reason"]
    assert not (tmp_path / "run/attestation-agent").exists()


def test_bind_required_without_the_register_fails_the_boot(tmp_path):
    config(tmp_path, "confidential_computing:\n  bind: required\n")
    assert boot.run_boot(str(tmp_path)) == 1
    doc = status(tmp_path)
    assert doc["state"] == "failed" and doc["binding"]["state"] == "unbound"
    assert doc["reason"].startswith("confidential-computing: binding required "
                                    "(confidential_computing.bind: required) but no ")


def test_bind_off_writes_nothing_even_in_tdx(tmp_path, monkeypatch):
    register = FakeRegister()
    root = tdx_root(tmp_path, register, monkeypatch)
    config(root, "confidential_computing:\n  bind: 'off'\n")
    assert boot.run_boot(str(root)) == 0
    assert status(root)["binding"]["state"] == "off"
    assert register.writes == [] and not (root / LOG).exists()


def test_a_refused_extend_fails_the_boot_and_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    register = FakeRegister(refuse=True)
    root = tdx_root(tmp_path, register, monkeypatch)
    assert boot.run_boot(str(root)) == 1
    doc = status(root)
    assert doc["state"] == "failed" and doc["binding"]["state"] == "broken"
    assert "confidential-computing: binding broken: extending" in doc["reason"]
    assert (root / LOG).read_bytes() == b""


def test_a_failed_boot_binds_fail(tmp_path, monkeypatch):
    register = FakeRegister()
    root = tdx_root(tmp_path, register, monkeypatch)
    config(root, "budget_s: [not a number]\n")  # the config step fails the boot
    assert boot.run_boot(str(root)) == 1
    doc = status(root)
    assert doc["state"] == "failed" and doc["reason"].startswith("config: ")
    assert doc["binding"]["result"] == "fail" and [e["result"] for e in events(root)] == ["fail"]


def test_the_last_resort_binds_fail_when_the_ending_raised_first(tmp_path, monkeypatch):
    register = FakeRegister()
    root = tdx_root(tmp_path, register, monkeypatch)

    def broken_end(self, state, reason):
        raise RuntimeError("the ending broke before anything")

    monkeypatch.setattr(Run, "end", broken_end)
    assert boot.run_boot(str(root)) == 1
    doc = status(root)
    assert doc["state"] == "failed" and "internal error: RuntimeError" in doc["reason"]
    assert [e["result"] for e in events(root)] == ["fail"]


@pytest.mark.parametrize("mode", ["auto", "required", "off"])
def test_the_config_key_takes_its_three_words(tmp_path, mode):
    from podvm_gpu.config.load import load_config

    path = tmp_path / "c.yaml"
    path.write_text(f"confidential_computing:\n  bind: '{mode}'\n")
    assert load_config(str(path), required=True).confidential_computing.bind == mode


def test_the_metrics_give_the_bindings_state(tmp_path, monkeypatch):
    from podvm_gpu.metrics.families import attestation_families

    root = tdx_root(tmp_path, FakeRegister(), monkeypatch)
    assert boot.run_boot(str(root)) == 0
    [family] = attestation_families(status(root))  # no attestation on a CPU VM: the binding's
    assert family.name == "podvm_gpu_binding_state"
    assert {s.labels["state"]: s.value for s in family.samples} == {
        "bound": 1, "unbound": 0, "broken": 0, "off": 0}
    assert attestation_families({"binding": None}) == []
