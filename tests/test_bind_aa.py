"""Who writes the binding's event once the attestation-agent runs (issue 43 item 3): through its
``ExtendRuntimeMeasurement`` when its socket answers, directly when nobody listens or its event
log is off, never when it refuses. A stand-in agent (tests/aa_standin.py) listens on the
agent's socket path under a temporary root; the register is tests/rtmr_fake.py's.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from aa_standin import AAWriter, StandIn
from rtmr_fake import FakeRegister, aael, ccel, replayed, tagged

from podvm_gpu.host import aa, rtmr
from podvm_gpu.host.fs import Root
from podvm_gpu.model import PciDevice
from podvm_gpu.steps.cc import bind

FIRMWARE = b"something the firmware measured into rtmr3"


def body(result: str = "pass") -> str:
    return bind.content(result, 1, 0, "on", "ab" * 32, "cd" * 32)


class NoDirectExtend:
    """The register as bind() sees it when the agent must write: reads pass through, a direct
    extend is a test failure."""

    def __init__(self, register: FakeRegister):
        self.register = register

    def read(self) -> bytes:
        return self.register.read()

    def extend(self, data: bytes) -> int:
        raise AssertionError("podvm-gpu extended RTMR3 itself while the agent runs")


def booted(tmp_path, with_pass: bool = True):
    """A root as the boot leaves it before AA starts: the CCEL, AA's log with the boot's own
    pass (written directly) and the register they replay to."""
    root = Root(tmp_path)
    path = tmp_path / rtmr.CCEL_PATH.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_bytes(ccel([(4, 0x0D, FIRMWARE)]))
    register = FakeRegister(replayed([hashlib.sha384(FIRMWARE).digest()]))
    if with_pass:
        assert bind.bind(root, "pass", body(), register)["appended"] is True
    return root, register


def log_path(tmp_path) -> str:
    return str(tmp_path / rtmr.EVENTLOG_PATH.lstrip("/"))


def socket_path(tmp_path) -> str:
    return str(tmp_path / aa.SOCKET_PATH.lstrip("/"))


def replays(tmp_path, register) -> bool:
    records = rtmr.parse_records(open(log_path(tmp_path), "rb").read(), False, "AAEL")
    firmware = rtmr.parse_records(ccel([(4, 0x0D, FIRMWARE)]), True, "CCEL")
    return rtmr.replay(firmware + records) == register.value


def test_with_the_agent_answering_ok_it_writes_and_podvm_gpu_writes_neither(tmp_path):
    root, register = booted(tmp_path)
    before = open(log_path(tmp_path), "rb").read()
    with StandIn(socket_path(tmp_path), "ok") as agent:
        got = bind.bind(root, "fail", body("fail"), NoDirectExtend(register))
    assert got["state"] == "bound" and got["result"] == "fail"
    assert "attestation-agent" in got["reason"]
    assert open(log_path(tmp_path), "rb").read() == before  # the stand-in wrote nothing either
    [call] = agent.requests
    assert (call["service"], call["method"], call["stream"], call["type"]) == \
        (aa.SERVICE, aa.METHOD, 1, 1)
    fields = call["fields"]
    assert [fields[n][0].decode() for n in (1, 2, 3)] == [bind.DOMAIN, "GpuAttestation",
                                                          body("fail")]
    assert 4 not in fields  # RegisterIndex never sent: 3 or 4 would land in RTMR1
    assert call["timeout_nano"] > 0
    assert got["digest"] == hashlib.sha384(tagged(f"{bind.DOMAIN} GpuAttestation {body('fail')}")).hexdigest()


def test_the_agent_not_enabled_means_the_direct_write(tmp_path):
    root, register = booted(tmp_path)
    with StandIn(socket_path(tmp_path), "not_enabled") as agent:
        got = bind.bind(root, "fail", body("fail"), register)
    assert len(agent.requests) == 1
    assert got["state"] == "bound" and got["appended"] is True and got["reason"] is None
    assert len(register.writes) == 2  # the boot's pass, then this fail, both direct
    assert bind.last_result(rtmr.parse_records(open(log_path(tmp_path), "rb").read(), False,
                                               "AAEL")) == "fail"
    assert replays(tmp_path, register)


def test_nobody_on_the_socket_means_the_direct_write(tmp_path):
    root, register = booted(tmp_path)
    with StandIn(socket_path(tmp_path), "ok"):
        pass  # the agent stopped: its socket file stays, nobody listens (ECONNREFUSED)
    assert os.path.exists(socket_path(tmp_path))
    got = bind.bind(root, "fail", body("fail"), register)
    assert got["appended"] is True and len(register.writes) == 2 and replays(tmp_path, register)


@pytest.mark.parametrize("answer, said", [
    ("not_supported", "answered ExtendRuntimeMeasurement with NOT_SUPPORTED"),
    ("error", "ttrpc status 13: .ERROR:attestation-agent. AA extend runtime measurement failed"),
    ("close", "closed the connection"),
    ("hang", "did not answer ExtendRuntimeMeasurement in time"),
])
def test_the_agent_refusing_is_broken_naming_it_and_nothing_is_written(tmp_path, monkeypatch,
                                                                       answer, said):
    monkeypatch.setattr(aa, "TIMEOUT_S", 0.5)
    root, register = booted(tmp_path)
    before = open(log_path(tmp_path), "rb").read()
    with StandIn(socket_path(tmp_path), answer):
        with pytest.raises(bind.AgentRefused, match=said) as err:
            bind.bind(root, "fail", body("fail"), NoDirectExtend(register))
    assert "attestation-agent" in str(err.value)
    assert open(log_path(tmp_path), "rb").read() == before and len(register.writes) == 1
    assert replays(tmp_path, register)  # the bound pass stands, the log still replays


class _Status:
    gpus = [PciDevice("0000:1b:00.0", "10de", "2335", "030200", "nvidia", "H200")]
    nvswitches, attestation, confidential_computing = [], {}, None


@pytest.mark.parametrize("mode, fails", [("auto", False), ("required", True)])
def test_the_agent_refusing_fails_the_boot_only_when_binding_is_required(tmp_path, mode, fails):
    root, register = booted(tmp_path)
    with StandIn(socket_path(tmp_path), "not_supported"):
        got, failure = bind.for_boot(root, _Status(), mode, "fail", NoDirectExtend(register))
    assert got["state"] == "broken" and "attestation-agent" in got["reason"]
    assert (failure is not None) == fails
    if fails:
        assert failure.startswith("binding broken: the attestation-agent answered")


def test_a_broken_log_still_fails_the_boot_in_auto(tmp_path):
    root, register = booted(tmp_path)
    register.value = hashlib.sha384(b"an extend nobody logged").digest()
    got, failure = bind.for_boot(root, _Status(), "auto", "fail", register)
    assert got["state"] == "broken" and failure.startswith("binding broken:")


def test_the_agents_writer_and_a_rerun_keep_a_log_that_parses(tmp_path):
    """AA on guest-components b74cb38d writes at the offset it remembered when it started
    (extend, then write). A rerun after AA started goes through AA: the log still parses and
    replays after AA's next event of its own."""
    root, register = booted(tmp_path)
    writer = AAWriter(log_path(tmp_path), register)  # AA starts after the boot
    try:
        with StandIn(socket_path(tmp_path), "ok", writer):
            got = bind.bind(root, "fail", body("fail"), NoDirectExtend(register))
            writer("github.com/confidential-containers", "PullImage", '{"image":"x"}')
    finally:
        writer.close()
    assert got["state"] == "bound"
    records = rtmr.parse_records(open(log_path(tmp_path), "rb").read(), False, "AAEL")
    assert [r.text().split(" ")[0] for r in records] == [
        bind.DOMAIN, bind.DOMAIN, "github.com/confidential-containers"]
    assert bind.last_result(records) == "fail"
    assert replays(tmp_path, register)


def test_the_direct_write_behind_the_agents_back_is_what_breaks_the_log(tmp_path):
    """The same story with the old direct append (the control: this test's writer does
    overwrite what was appended behind its back)."""
    root, register = booted(tmp_path)
    writer = AAWriter(log_path(tmp_path), register)
    try:
        bind.bind(root, "fail", body("fail"), register)  # no socket: a direct append
        writer("github.com/confidential-containers", "PullImage", '{"image":"x"}')
    finally:
        writer.close()
    with pytest.raises(rtmr.LogError):  # AA's record over the fail's head, its tail after
        rtmr.parse_records(open(log_path(tmp_path), "rb").read(), False, "AAEL")


def test_the_watchers_revocation_goes_through_the_agent(tmp_path):
    from podvm_gpu.ending import revoke

    root, register = booted(tmp_path)
    doc = {"binding": bind.record("bound", "pass", None, True, "00"), "gpus": [{}],
           "nvswitches": [], "attestation": None, "confidential_computing": None}
    writer = AAWriter(log_path(tmp_path), FakeRegister(register.value))  # the real register
    try:
        with StandIn(socket_path(tmp_path), "ok", writer) as agent:
            # the watcher's bind() finds the register under the root: give it the file's
            path = tmp_path / rtmr.RTMR3_PATH.lstrip("/")
            path.parent.mkdir(parents=True)
            path.write_bytes(register.value)
            assert revoke(root, doc) is None
    finally:
        writer.close()
    assert doc["binding"]["state"] == "bound" and doc["binding"]["result"] == "fail"
    assert len(agent.requests) == 1
    assert json.loads(agent.requests[0]["fields"][3][0])["result"] == "fail"
    assert path.read_bytes() == register.value  # podvm-gpu did not extend the file itself


def test_the_watchers_revocation_is_the_binding_s_own_event(tmp_path):
    """Issue 44 item 2: the watcher's fail event is bind.py's (for_boot's content from
    status.json's document), not one rebuilt beside it: the GPUs' identities, architecture,
    multi-GPU mode and the attested record's digest, as a failed boot's."""
    from podvm_gpu.ending import revoke

    root, register = booted(tmp_path)
    attested = [{"index": 0, "bus_id": "00000000:18:00.0", "uuid": "GPU-1", "ueid": None}]
    attestation = {"nonce": "ab" * 32, "nvattest_version": "1.1.0", "devices": [],
                   "runs": [{"device": "gpu", "code": 0, "claims_sha256": "00"}]}
    doc = {"binding": bind.record("bound", "pass", None, True, "00"),
           "gpus": [{"pci_address": "0000:18:00.0", "device_id": "2335"}], "nvswitches": [],
           "attestation": attestation, "attested_gpus": attested,
           "confidential_computing": {"mode": "on", "multi_gpu_mode": "none"}}
    writer = AAWriter(log_path(tmp_path), FakeRegister(register.value))
    try:
        with StandIn(socket_path(tmp_path), "ok", writer) as agent:
            path = tmp_path / rtmr.RTMR3_PATH.lstrip("/")
            path.parent.mkdir(parents=True)
            path.write_bytes(register.value)
            assert revoke(root, doc) is None
    finally:
        writer.close()
    said = json.loads(agent.requests[0]["fields"][3][0])
    record = bind.canonical(bind.attested_record(attestation, attested))
    assert said == json.loads(bind.content(
        "fail", 1, 0, "on", "ab" * 32, hashlib.sha256(record.encode()).hexdigest(),
        devices=[{"bus_id": "00000000:18:00.0", "uuid": "GPU-1"}], architecture="Hopper",
        multi_gpu_mode="none"))
    assert doc["binding"]["result"] == "fail"


# ---- the crash window (issue 43 item 5) and `podvm-gpu binding`


def killed_between_append_and_extend(tmp_path):
    """A child binds pass with an extend that SIGKILLs it: the record is fsynced, RTMR3 never
    saw it. Returns the root and the register file (under the root) the child used."""
    import signal
    import subprocess
    import sys

    root, register = booted(tmp_path, with_pass=False)
    reg = tmp_path / rtmr.RTMR3_PATH.lstrip("/")
    reg.parent.mkdir(parents=True)
    reg.write_bytes(register.value)
    child = (
        "import os, signal, sys\n"
        "from podvm_gpu.host import rtmr\n"
        "from podvm_gpu.host.fs import Root\n"
        "from podvm_gpu.steps.cc import bind\n"
        "rtmr.Register.extend = lambda self, d: os.kill(os.getpid(), signal.SIGKILL)\n"
        "bind.bind(Root(sys.argv[1]), 'pass', sys.argv[2])\n")
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path), body()], timeout=60)
    assert done.returncode == -signal.SIGKILL
    return root, reg


def test_a_kill_between_the_fsync_and_the_extend_is_repaired(tmp_path):
    from podvm_gpu.steps.cc.writer import repair

    root, reg = killed_between_append_and_extend(tmp_path)
    value = reg.read_bytes()
    records = rtmr.parse_records(open(log_path(tmp_path), "rb").read(), False, "AAEL")
    assert bind.last_result(records) == "pass"  # logged, never extended
    firmware = rtmr.parse_records(ccel([(4, 0x0D, FIRMWARE)]), True, "CCEL")
    assert rtmr.replay(firmware + records) != value
    said = repair(root, bind._read_log, bind.is_ours)
    assert said.startswith("binding repaired: 1 podvm-gpu record(s)")
    assert os.path.getsize(log_path(tmp_path)) == 0
    assert rtmr.replay(firmware) == value
    assert repair(root, bind._read_log, bind.is_ours) is None  # nothing left to repair
    # and a bind after it is no longer blamed on "something extended RTMR3"
    got = bind.bind(root, "pass", body(), FakeRegister(value))
    assert got["state"] == "bound" and got["appended"] is True


def test_no_repair_while_the_agent_answers_nor_of_another_domains_record(tmp_path):
    from podvm_gpu.steps.cc.writer import RepairError, repair

    root, reg = killed_between_append_and_extend(tmp_path)
    before = open(log_path(tmp_path), "rb").read()
    with StandIn(socket_path(tmp_path), "ok"):
        with pytest.raises(RepairError, match="attestation-agent answers"):
            repair(root, bind._read_log, bind.is_ours)
    assert open(log_path(tmp_path), "rb").read() == before
    with open(log_path(tmp_path), "ab") as f:  # another domain's record after ours
        f.write(aael(["other.example op x"]))
    with pytest.raises(RepairError, match="without logging"):
        repair(root, bind._read_log, bind.is_ours)


def test_the_binding_command_prints_the_records_and_the_replay(tmp_path, capsys):
    from podvm_gpu.cli import main

    root, reg = killed_between_append_and_extend(tmp_path)
    assert main(["binding", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "1 podvm-gpu record(s)" in out and "MISMATCH" in out and "pass" in out
    assert main(["binding", "--repair", "--json", "--root", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["repaired"].startswith("binding repaired") and doc["matches"] is True
    assert doc["records"] == [] and doc["register"] == reg.read_bytes().hex()
