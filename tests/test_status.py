"""The status file and the unavailable CDI spec (podvm_gpu.status, podvm_gpu.cdi.unavailable,
podvm_gpu.model; contract sections 2 and 4)."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest
import yaml

from podvm_gpu.cdi import SPEC_PATH as CDI_SPEC_PATH
from podvm_gpu.cdi.parse import parse_spec
from podvm_gpu.cdi.unavailable import render_unavailable_spec, write_unavailable_spec
from podvm_gpu.cli import main
from podvm_gpu.host.fs import Root
from podvm_gpu.model import PciDevice, State, Status, Step, StepResult
from podvm_gpu.status import (
    STATUS_PATH,
    StatusFile,
    StatusUnreadable,
    exit_code_for,
    load_status,
    read_status,
    wait_for_final,
)

CONTRACT_KEYS = {"version", "state", "reason", "warnings", "started_at", "finished_at", "gpus",
                 "nvswitches", "driver_version", "nvidia_ctk_version", "cdi", "fabric",
                 "confidential_computing", "steps", "attestation", "initdata", "binding",
                 "attested_gpus"}


@pytest.fixture
def vm_root(tmp_path) -> Root:
    """An empty VM root with the usual ``/var/run -> /run`` link."""
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    os.symlink("/run", tmp_path / "var" / "run")
    return Root(tmp_path)


def status_path(root: Root) -> str:
    return os.path.join(root.path, STATUS_PATH.lstrip("/"))


# --- the document -------------------------------------------------------------------------------

def test_a_new_status_has_every_contract_key_and_state_running():
    doc = Status().to_dict()

    assert set(doc) == CONTRACT_KEYS
    assert doc["version"] == 3 and doc["state"] == "running"
    assert doc["reason"] is None and doc["finished_at"] is None and doc["warnings"] == []


def test_gpus_and_steps_serialise_as_the_contract_shows():
    status = Status()
    status.gpus.append(PciDevice("0000:00:04.0", "10de", "2331", "030200", "nvidia", "H100 PCIe"))
    step = Step("detect", StepResult.OK, "1 GPU(s)")
    step.duration_s = 0.0041234567
    status.steps.append(step)

    doc = json.loads(json.dumps(status.to_dict()))

    assert doc["gpus"] == [{"pci_address": "0000:00:04.0", "vendor_id": "10de",
                            "device_id": "2331", "class_code": "030200", "driver": "nvidia",
                            "name": "H100 PCIe"}]
    assert doc["steps"][0]["name"] == "detect" and doc["steps"][0]["result"] == "ok"
    assert doc["steps"][0]["duration_s"] == pytest.approx(0.004123, abs=1e-6)
    assert doc["steps"][0]["started_at"].endswith("+00:00")


def test_only_running_is_not_final():
    assert [s for s in State.ALL if s not in State.FINAL] == ["running"]


# --- StatusFile -----------------------------------------------------------------------------------

def test_status_is_written_under_run_with_mode_0644(vm_root):
    old = os.umask(0o077)
    try:
        StatusFile(vm_root).write(Status())
    finally:
        os.umask(old)

    path = status_path(vm_root)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert json.load(open(path))["state"] == "running"


def test_status_goes_through_the_var_run_link_into_run(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    os.symlink("/run", tmp_path / "var" / "run")

    StatusFile(Root(tmp_path)).write(Status())

    assert (tmp_path / "run" / "podvm-gpu" / "status.json").is_file()


def test_finish_sets_state_reason_and_time(vm_root):
    status = Status()
    StatusFile(vm_root).finish(status, State.FAILED, "modules: nvidia rejected")

    doc = read_status(vm_root)
    assert doc["state"] == "failed" and doc["reason"] == "modules: nvidia rejected"
    assert doc["finished_at"] is not None


def test_disabled_status_file_writes_nothing(vm_root):
    StatusFile(vm_root, enabled=False).write(Status())

    assert not os.path.exists(status_path(vm_root))


def test_a_symlink_planted_at_the_status_path_is_replaced_not_followed(vm_root):
    """Contract section 2: the status file is written atomically, which replaces whatever is at
    the path; a link planted there must not redirect the write to its target."""
    victim = os.path.join(vm_root.path, "etc", "victim.json")
    os.makedirs(os.path.dirname(victim))
    with open(victim, "w") as f:
        f.write("precious")
    os.makedirs(os.path.dirname(status_path(vm_root)))
    os.symlink("/etc/victim.json", status_path(vm_root))

    StatusFile(vm_root).write(Status())

    assert open(victim).read() == "precious"
    assert not os.path.islink(status_path(vm_root))
    assert json.load(open(status_path(vm_root)))["state"] == "running"


# --- reading it back ------------------------------------------------------------------------------

def test_read_status_is_none_without_a_file(vm_root):
    assert read_status(vm_root) is None


@pytest.mark.parametrize("text", ['{"state": "rea', "[1, 2]", "", "null"])
def test_read_status_is_none_for_a_garbled_file(vm_root, text):
    os.makedirs(os.path.dirname(status_path(vm_root)))
    with open(status_path(vm_root), "w") as f:
        f.write(text)

    assert read_status(vm_root) is None


@pytest.mark.parametrize("doc, code", [
    ({"state": "ready"}, 0), ({"state": "no-gpu"}, 0), ({"state": "failed"}, 1),
    ({"state": "running"}, 3), ({"state": "exploded"}, 3), ({}, 3), (None, 3)])
def test_exit_code_for_each_state(doc, code):
    assert exit_code_for(doc) == code


@contextlib.contextmanager
def boot_in_progress(root: Root):
    """Hold ``boot.lock`` as a live boot does (without it, a ``running`` state is one no boot
    will finish: issue 21 item 3)."""
    path = os.path.join(root.path, "run/podvm-gpu/boot.lock")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def test_wait_for_final_returns_the_last_document_when_time_runs_out(vm_root):
    StatusFile(vm_root).write(Status())
    started = time.monotonic()

    with boot_in_progress(vm_root):
        doc = wait_for_final(vm_root, 0.3, poll_s=0.05)

    assert doc["state"] == "running"
    assert 0.3 <= time.monotonic() - started < 2


def test_wait_for_final_returns_once_another_writer_finishes(vm_root):
    writer = StatusFile(vm_root)
    status = Status()
    writer.write(status)
    timer = threading.Timer(0.2, writer.finish, args=(status, State.NO_GPU, "detect: none"))
    started = time.monotonic()
    timer.start()
    try:
        with boot_in_progress(vm_root):
            doc = wait_for_final(vm_root, 10, poll_s=0.05)
    finally:
        timer.join()

    assert doc["state"] == "no-gpu"
    assert time.monotonic() - started < 2


def test_wait_for_final_with_no_file_at_all_returns_none(vm_root):
    assert wait_for_final(vm_root, 0.1, poll_s=0.05) is None


# --- the unavailable spec -------------------------------------------------------------------------

def test_unavailable_spec_has_the_contract_shape():
    spec = yaml.safe_load(render_unavailable_spec("no-gpu", "detect: no NVIDIA GPU on PCI "
                                                  "(3 devices scanned)"))

    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "nvidia.com/gpu"
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert spec["devices"][0]["containerEdits"] == {"env": [
        "PODVM_GPU_STATE=no-gpu",
        "PODVM_GPU_REASON=detect: no NVIDIA GPU on PCI (3 devices scanned)"]}
    assert "annotations" not in spec  # would need cdiVersion 0.6.0


def test_unavailable_spec_passes_the_products_own_cdi_validation():
    spec = parse_spec(render_unavailable_spec("failed", "cdi: nvidia-ctk failed"),
                      source=CDI_SPEC_PATH)

    assert spec.device_names() == ["unavailable"]


def test_unavailable_reason_is_folded_to_one_line_and_quoting_survives():
    reason = 'modules: nvidia: "kernel: NVRM: x"\n  second line\ttab: {braces} # not a comment'
    spec = yaml.safe_load(render_unavailable_spec("failed", reason))

    env = spec["devices"][0]["containerEdits"]["env"]
    assert env[1] == ('PODVM_GPU_REASON=modules: nvidia: "kernel: NVRM: x" second line tab: '
                      '{braces} # not a comment')


def test_write_unavailable_spec_replaces_an_earlier_spec(vm_root):
    cdi = os.path.join(vm_root.path, "run", "cdi")
    os.makedirs(cdi)
    with open(os.path.join(cdi, "nvidia.yaml"), "w") as f:
        f.write("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n" * 20)

    path = write_unavailable_spec(vm_root, "failed", "modules: boom")

    assert path == os.path.join(cdi, "nvidia.yaml")
    spec = yaml.safe_load(open(path))
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert sorted(os.listdir(cdi)) == ["nvidia.yaml"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_write_unavailable_spec_creates_var_run_cdi(tmp_path):
    path = write_unavailable_spec(Root(tmp_path), "no-gpu", "detect: none")

    assert path == str(tmp_path / "var" / "run" / "cdi" / "nvidia.yaml")
    assert os.path.isfile(path)


# --- a garbled status file: load_status says why, status exits 3 ----------------------------------

GARBLED = {
    "not-json": '{"state": "rea',
    "empty": "",
    "json-list": '["ready"]',
    "json-null": "null",
    "state-missing": '{"version": 1, "reason": null, "warnings": []}',
    "state-unknown": '{"version": 1, "state": "exploded", "reason": null, "warnings": []}',
    "state-not-a-string": '{"version": 1, "state": ["ready"], "reason": null, "warnings": []}',
    "warnings-not-a-list": '{"version": 1, "state": "ready", "reason": null, "warnings": "w"}',
    "reason-not-a-string": '{"version": 1, "state": "failed", "reason": 7, "warnings": []}',
}


def write_raw_status(root: Root, text: str) -> None:
    os.makedirs(os.path.dirname(status_path(root)), exist_ok=True)
    with open(status_path(root), "w") as f:
        f.write(text)


@pytest.mark.parametrize("case", GARBLED)
def test_load_status_raises_status_unreadable_for_a_garbled_file(vm_root, case):
    write_raw_status(vm_root, GARBLED[case])

    with pytest.raises(StatusUnreadable) as err:
        load_status(vm_root)
    assert STATUS_PATH in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", GARBLED)
def test_read_status_is_none_for_every_garbled_file(vm_root, case):
    write_raw_status(vm_root, GARBLED[case])

    assert read_status(vm_root) is None


def test_load_status_is_none_without_a_file(vm_root):
    assert load_status(vm_root) is None


@pytest.mark.parametrize("text", [
    '{"state": "no-gpu"}',  # reason and warnings may be left out
    '{"state": "failed", "reason": "modules: boom", "warnings": ["w"], "extra": 1}',
])
def test_load_status_accepts_a_minimal_or_extended_document(vm_root, text):
    write_raw_status(vm_root, text)

    assert load_status(vm_root) == json.loads(text)


def test_wait_for_final_raises_at_the_timeout_when_the_file_is_garbled(vm_root):
    write_raw_status(vm_root, GARBLED["not-json"])

    with pytest.raises(StatusUnreadable):
        wait_for_final(vm_root, 0.1, poll_s=0.05)


@pytest.mark.parametrize("case", ["not-json", "state-unknown", "state-not-a-string",
                                  "warnings-not-a-list", "reason-not-a-string"])
def test_status_command_says_unreadable_status_file_and_exits_3(vm_root, case, capsys):
    write_raw_status(vm_root, GARBLED[case])

    assert main(["status", "--root", vm_root.path]) == 3
    out = capsys.readouterr().out
    assert out.startswith("unreadable status file: ")
    assert STATUS_PATH in out


def test_status_wait_with_a_garbled_file_exits_3_at_the_timeout_saying_so(vm_root, capsys):
    write_raw_status(vm_root, GARBLED["not-json"])
    started = time.monotonic()

    code = main(["status", "--root", vm_root.path, "--wait", "--timeout", "0.3"])

    assert code == 3
    assert 0.3 <= time.monotonic() - started < 3
    assert capsys.readouterr().out.startswith("unreadable status file: ")


def test_status_json_with_a_garbled_file_still_prints_one_json_document(vm_root, capsys):
    """Contract section 1: with --json the output on stdout is one JSON document, whatever the
    state; a script that parses it must not meet plain text."""
    write_raw_status(vm_root, GARBLED["not-json"])

    assert main(["status", "--root", vm_root.path, "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict) and "state" in doc


def test_a_damaged_status_is_unreadable_or_shown_harmlessly_never_a_traceback(tmp_path):
    """Found by a newcomer: a warning that is not a string, or a lone surrogate (JSON
    ``"\\ud800"``), crashed ``status`` (exit 1 reads as "failed"); a reason with ESC and BEL
    reached the terminal raw. Now: unreadable (exit 3), and control characters shown escaped."""
    import subprocess
    import sys

    status = tmp_path / "run/podvm-gpu/status.json"
    status.parent.mkdir(parents=True)

    def run(doc: str) -> subprocess.CompletedProcess:
        status.write_text(doc)
        return subprocess.run([sys.executable, "-m", "podvm_gpu", "status", "--root", str(tmp_path)],
                              capture_output=True, text=True, timeout=30)

    for doc in ('{"state": "ready", "reason": null, "warnings": ["\\ud800"]}',
                '{"state": "ready", "reason": null, "warnings": [1]}',
                '{"state": "failed", "reason": "\\udfff", "warnings": []}'):
        done = run(doc)
        assert (done.returncode, done.stderr) == (3, ""), (doc, done)
        assert done.stdout.startswith("unreadable status file: "), (doc, done.stdout)
    done = run('{"state": "failed", "reason": "x\\u001b[2J\\u0007\\nfake: ready", "warnings": []}')
    assert done.returncode == 1
    assert done.stdout == "failed: x\\x1b[2J\\x07\\x0afake: ready\n", done.stdout


def test_status_command_shows_the_cc_classification_once_read(vm_root, capsys):
    doc = {"state": "failed", "reason": "confidential-computing: CC off", "warnings": ["w"],
           "confidential_computing": {"mode": "ppcie", "confidential": True}}
    write_raw_status(vm_root, json.dumps(doc))

    assert main(["status", "--root", vm_root.path]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["failed: confidential-computing: CC off",
                     "confidential computing: mode ppcie, confidential", "warning: w"]
    doc["confidential_computing"] = {"mode": "off\x1b[2J", "confidential": False}
    write_raw_status(vm_root, json.dumps(doc))
    main(["status", "--root", vm_root.path])
    assert "confidential computing: mode off\\x1b[2J, not confidential" in capsys.readouterr().out


def test_a_status_without_a_valid_state_lists_the_states_as_words_not_a_python_list(vm_root):
    """Issue 35 item 14: it said (one of ['failed', 'no-gpu', 'ready', 'running'])."""
    write_raw_status(vm_root, '{"state": "bogus"}')
    with pytest.raises(StatusUnreadable) as err:
        load_status(vm_root)
    assert str(err.value).endswith("has no valid state (one of running, ready, no-gpu, failed)")


# --- a ready document must keep the rules that make ready true (issue 35 item 8) ----------------

# The real H200's ready document (driver 580, status version 2) as this agent writes it now: version
# 3 adds nvidia-ctk's version (1.20.0 ran there) and the binding (unbound: no TEE on that VM)
REAL_READY = {**json.loads((Path(__file__).parent / "data/real/h200-580/podvm-gpu-status.json")
                           .read_text()),
              "version": 3, "nvidia_ctk_version": "1.20.0",
              "binding": {"state": "unbound", "result": None, "appended": False, "digest": None,
                          "reason": "no /sys/class/misc/tdx_guest/measurements/rtmr3:sha384",
                          "eventlog": None}}


def ready_with(**changes) -> dict:
    """The real H200's ready document (driver 580) with ``changes`` (a value of ``...``
    removes the key); ``steps_`` replaces one step's fields: ``{index: {field: value}}``."""
    doc = copy.deepcopy(REAL_READY)
    for index, fields in changes.pop("steps_", {}).items():
        doc["steps"][index].update(fields)
    for key, value in changes.items():
        if value is ...:
            del doc[key]
        else:
            doc[key] = value
    return doc


BROKEN_READY = {
    "the-issue": ({"state": "ready", "gpus": "lots", "cdi": 5}, 'gpus is "lots"'),
    "minimal": ({"state": "ready"}, "gpus is missing"),
    "version-1-minimal": ({"version": 1, "state": "ready", "reason": None, "warnings": [],
                           "steps": []}, "gpus is missing"),
    "gpus-empty": (ready_with(gpus=[]), "gpus is []"),
    "gpu-not-an-object": (ready_with(gpus=[5]), "gpus[0] is 5"),
    "gpu-address-not-text": (ready_with(gpus=[{**REAL_READY["gpus"][0], "pci_address": 4}]),
                             "gpus[0]"),
    "cdi-a-number": (ready_with(cdi=5), "cdi is 5"),
    "cdi-null": (ready_with(cdi=None), "cdi is missing or null"),
    "cdi-devices-a-number": (ready_with(cdi={**REAL_READY["cdi"], "devices": 5}), "cdi is"),
    "cdi-without-all": (ready_with(cdi={**REAL_READY["cdi"], "devices": ["0"]}),
                        'cdi.devices ["0"] lack 0 or all'),
    "steps-missing": (ready_with(steps=...), "steps is missing"),
    "a-step-left-out": (ready_with(steps=REAL_READY["steps"][:-1]), "its steps are"),
    "a-step-failed": (ready_with(steps_={2: {"result": "failed"}}), 'step modules is "failed"'),
    "cdi-step-skipped": (ready_with(steps_={8: {"result": "skipped"}}), 'step cdi is "skipped"'),
    "step-duration-text": (ready_with(steps_={3: {"duration_s": "fast"}}),
                           "step versions is"),
    "driver-version-null": (ready_with(driver_version=None), "driver_version is missing"),
    "driver-version-empty": (ready_with(driver_version=""), "driver_version is empty"),
    "not-finished": (ready_with(finished_at=None), "finished_at is missing"),
    "a-reason": (ready_with(reason="cdi: boom"), 'reason is "cdi: boom", not null'),
}


def test_the_real_ready_document_and_a_version_1_one_are_ready(vm_root):
    from schemas import problems

    assert REAL_READY["state"] == "ready" and problems(REAL_READY) == []
    write_raw_status(vm_root, json.dumps(REAL_READY))
    assert load_status(vm_root) == REAL_READY
    version_1 = ready_with(version=1, fabric=..., attestation=..., initdata=...,
                           confidential_computing=..., nvidia_ctk_version=..., binding=...)
    write_raw_status(vm_root, json.dumps(version_1))
    assert load_status(vm_root) == version_1


@pytest.mark.parametrize("case", BROKEN_READY)
def test_a_ready_document_that_breaks_the_ready_rules_is_unreadable_saying_why(vm_root, case):
    """Issue 35 item 8: readers took any document with a valid state, reason and warnings, so a
    hand-edited ``{"state": "ready", "gpus": "lots", "cdi": 5}`` was ready (status exit 0,
    check's row pass, metrics ready=1). Each broken document also fails the schema: the rules
    coded in status.py are the schema's (jsonschema is a test-only dependency)."""
    from schemas import problems

    doc, why = BROKEN_READY[case]
    assert problems(doc), "the schema accepts it: not a broken ready document"
    write_raw_status(vm_root, json.dumps(doc))
    with pytest.raises(StatusUnreadable) as err:
        load_status(vm_root)
    assert f"{STATUS_PATH} says ready, but {why}" in str(err.value), str(err.value)
    assert read_status(vm_root) is None


def test_the_issues_ready_document_is_unreadable_to_status_and_check(vm_root, capsys):
    write_raw_status(vm_root, json.dumps(BROKEN_READY["the-issue"][0]))

    assert main(["status", "--root", vm_root.path]) == 3
    out = capsys.readouterr().out
    assert out.startswith("unreadable status file: /run/podvm-gpu/status.json says ready, but "
                          'gpus is "lots"'), out
    assert main(["status", "--json", "--root", vm_root.path]) == 3
    from schemas import STATUS_OUTPUT_SCHEMA, problems

    printed = json.loads(capsys.readouterr().out)
    assert printed["state"] is None and problems(printed, STATUS_OUTPUT_SCHEMA) == [], printed

    from podvm_gpu.check.vm import status_row

    class Facts:
        root = vm_root

    row = status_row(Facts())
    assert (row.result, row.detail.split(": ", 1)[0]) == ("fail", "unreadable"), row
