"""``boot --dry-run`` lists the attestation's calls (issue 26, docs/interface.md 3.9 and 3.12):
``nvattest attest --device gpu --verifier local --nonce <fresh> --format json`` with the
config's options, where a boot would run it; the NVSwitches' run in Protected PCIe, known only
at run time, in a note; ``-srs 1`` only with ``set_ready_state: true``. The trees are umockdev
device trees (tests/data); nothing runs and nothing is written."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

NONCE = "<fresh nonce: 32 random bytes, hex>"
SRS = ["nvidia-smi", "conf-compute", "-srs", "1"]


def dry_run(podvm, root: Path, path: str, tree: str = "h100-pcie", config: str | None = None,
            json_out: bool = True):
    if config is not None:
        (root / "etc/podvm-gpu").mkdir(parents=True, exist_ok=True)
        (root / "etc/podvm-gpu/config.yaml").write_text(config)
    done = podvm(["boot", "--dry-run", *(["--json"] if json_out else []), "--root", str(root)],
                 tree=tree, env={"PATH": path})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if json_out else done.stdout


def with_nvattest(tmp_path: Path) -> str:
    """A PATH folder with an ``nvattest`` (never run by a dry run: only found)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / "nvattest"
    tool.write_text("#!/bin/sh\necho ran >> \"$0.ran\"\nexit 99\n")
    tool.chmod(0o755)
    return str(folder)


def nvattest_calls(doc: dict) -> list[list[str]]:
    return [c for c in doc["commands"] if c[0] == "nvattest"]


def test_an_installed_nvattest_is_listed_with_a_fresh_nonce_before_srs_1(tmp_path, podvm):
    path = with_nvattest(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    doc = dry_run(podvm, root, path)

    commands = doc["commands"]
    attest = ["nvattest", "attest", "--device", "gpu", "--verifier", "local", "--nonce", NONCE,
              "--format", "json"]
    assert nvattest_calls(doc) == [["nvattest", "--log-level", "info", "version"], attest]
    grs = commands.index(["nvidia-smi", "conf-compute", "-grs"])
    assert commands.index(["nvidia-smi", "conf-compute", "-mgm"]) < grs < \
        commands.index(attest) < commands.index(SRS)  # the step's own order
    assert any("only for GPUs the queries find confidential" in n for n in doc["notes"])
    assert not any("nvswitch" in n for n in doc["notes"])  # no NVSwitch on PCI: no PPCIe
    assert not (Path(path) / "nvattest.ran").exists()  # listed, never run


def test_the_configured_options_are_passed_and_srs_1_only_with_set_ready_state(tmp_path, podvm,
                                                                            empty_path):
    """attestation: required lists the call even where nvattest is missing (the boot fails
    closed there, naming it); the policy and RIM folder as host paths under the root."""
    root = tmp_path / "root"
    config = ("confidential_computing:\n  attestation: required\n  set_ready_state: false\n"
              "  relying_party_policy: /etc/podvm-gpu/policy.rego\n"
              "  rim_dir: /usr/share/podvm-gpu/rims\n"
              "  rim_url: https://rim.example/\n  ocsp_url: https://ocsp.example/\n")
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/policy.rego").write_text("package policy\n")
    (root / "usr/share/podvm-gpu/rims").mkdir(parents=True)
    doc = dry_run(podvm, root, empty_path, config=config)

    assert nvattest_calls(doc)[-1] == [
        "nvattest", "attest", "--device", "gpu", "--verifier", "local", "--nonce", NONCE,
        "--format", "json", "--relying-party-policy", f"{root}/etc/podvm-gpu/policy.rego",
        "--rim-store", "dir", "--rim-dir", f"{root}/usr/share/podvm-gpu/rims",
        "--rim-url", "https://rim.example/", "--ocsp-url", "https://ocsp.example/"]
    assert SRS not in doc["commands"]


@pytest.mark.parametrize("config, said", [
    (None, "nvattest is not installed"),
    ("confidential_computing: {attestation: 'off'}\n", None),
], ids=["auto-without-nvattest", "off"])
def test_no_attestation_is_listed_where_a_boot_would_run_none(tmp_path, podvm, empty_path,
                                                              config, said):
    root = tmp_path / "root"
    root.mkdir()
    doc = dry_run(podvm, root, empty_path, config=config)

    assert nvattest_calls(doc) == []
    assert SRS in doc["commands"]  # set_ready_state's default: true
    assert any(said in n for n in doc["notes"]) if said else \
        not any("nvattest" in n for n in doc["notes"])


def test_the_nvswitch_run_is_a_note_where_nvswitches_are_on_pci(tmp_path, podvm):
    """Protected PCIe is read at run time (conf-compute -mgm): the dry run says so in a note,
    in the text output as a shell comment after the commands."""
    path = with_nvattest(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    doc = dry_run(podvm, root, path, tree="hgx-h200-8gpu-4nvswitch")
    text = dry_run(podvm, root, path, tree="hgx-h200-8gpu-4nvswitch", json_out=False)

    assert all(c[3] == "gpu" for c in nvattest_calls(doc) if c[1] == "attest")
    note = next(n for n in doc["notes"] if "--device nvswitch" in n)
    assert "Protected PCIe" in note and "known only at run time" in note and "same nonce" in note
    lines = text.splitlines()
    assert f"# {note}" in lines
    first_note = next(i for i, line in enumerate(lines) if line.startswith("# "))
    assert lines[:first_note] == [shlex.join(c) for c in doc["commands"]]  # the commands first
    assert all(line.startswith("# ") for line in lines[first_note:])


@pytest.mark.parametrize("register, config, said", [
    (False, None, "binding: nothing is bound: no /sys/class/misc/tdx_guest/measurements/"
                  "rtmr3:sha384 (a kernel before 6.16, not a TDX guest"),
    (False, "confidential_computing: {bind: required}\n", "; confidential_computing.bind: "
                                                         "required: a boot here ends failed"),
    (True, "confidential_computing: {bind: 'off'}\n", "binding: off (confidential_computing."
                                                      "bind: off): the boot's result is not "
                                                      "bound into RTMR3"),
    (True, None, "binding: at its end the boot binds its result into RTMR3: one podvm-gpu "
                 "GpuAttestation event (result pass after an attestation that passed, fail "
                 "when the boot ends failed, else none) appended to /run/attestation-agent/"
                 "eventlog, its digest extended into /sys/class/misc/tdx_guest/measurements/"
                 "rtmr3:sha384"),
])
def test_the_dry_run_says_what_the_boot_would_bind_into_rtmr3(tmp_path, podvm, empty_path,
                                                              register, config, said):
    """Issue 37's binding happens at a boot's end, not in a step: the dry run said nothing of
    it. A note says what would be bound and where, or why nothing is; nothing is written."""
    root = tmp_path / "root"
    node = root / "sys/class/misc/tdx_guest/measurements/rtmr3:sha384"
    node.parent.mkdir(parents=True)
    if register:
        node.write_bytes(bytes(48))
    doc = dry_run(podvm, root, empty_path, config=config)
    notes = [n for n in doc["notes"] if n.startswith("binding: ")]
    assert len(notes) == 1 and said in notes[0], doc["notes"]
    assert not (root / "run").exists() and (not register or node.read_bytes() == bytes(48))
