"""The GPU verdict bound into RTMR3 (issue 37): the AAEL record's bytes, the replay of the
firmware's and AA's logs, and podvm_gpu/steps/cc/bind.py's write: exactly, or not at all.

The register is tests/rtmr_fake.py's FakeRegister (the kernel's rules in Python); the logs are
files under a temporary root.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rtmr_fake import FakeRegister, aael, ccel, replayed, tagged

from podvm_gpu.host import rtmr
from podvm_gpu.host.fs import Root
from podvm_gpu.model import Status
from podvm_gpu.steps.cc import bind

KNOWN_TEXT = "coco.com some-operation some-content"
# Trustee's test data, recomputed (issue 37): the tagged event and its SHA-384
KNOWN_TAGGED_B64 = "TEVBQSQAAABjb2NvLmNvbSBzb21lLW9wZXJhdGlvbiBzb21lLWNvbnRlbnQ="
KNOWN_DIGEST = ("2330183d89750c6a374ac9827d33a33636e7876733544584c8ccc88df0df87ea"
                "da37e5d71d0773502234c2b5fbc7448e")


def test_the_tagged_event_and_its_digest_are_the_known_answer():
    event = rtmr.tagged_event("coco.com", "some-operation", "some-content")
    # re-derived here: the tag's bytes, the length, the text
    assert event == b"LEAA" + struct.pack("<I", len(KNOWN_TEXT)) + KNOWN_TEXT.encode()
    assert event == tagged(KNOWN_TEXT)
    assert base64.b64encode(event).decode() == KNOWN_TAGGED_B64
    assert len(event) == 44
    assert rtmr.digest(event).hex() == KNOWN_DIGEST == hashlib.sha384(event).hexdigest()


def test_the_entry_is_the_tcg2_record_of_the_issue():
    event = tagged(KNOWN_TEXT)
    entry = rtmr.entry(event)
    assert entry[:14] == struct.pack("<IIIH", 4, 6, 1, 0x000C)
    assert entry[14:62].hex() == KNOWN_DIGEST
    assert entry[62:66] == struct.pack("<I", 44) and entry[66:] == event
    [back] = rtmr.parse_records(entry, False, "log")
    assert (back.index, back.type, back.digest.hex(), back.text()) == (4, 6, KNOWN_DIGEST, KNOWN_TEXT)


@pytest.mark.parametrize("domain, operation, content", [
    ("a b", "op", "c"), ("dom", "", "c"), ("dom", "o\tp", "c"), ("dom", "op", "line\nbreak")])
def test_an_event_the_aael_rules_refuse_is_not_built(domain, operation, content):
    with pytest.raises(ValueError):
        rtmr.tagged_event(domain, operation, content)


def test_the_replay_of_a_ccel_and_aa_log_skips_other_registers_and_no_action():
    firmware = ccel([(1, 0x80000001, b"rtmr0"), (4, 0x0D, b"kernel cmdline to rtmr3"),
                     (4, 3, b"no action: not extended"), (2, 5, b"rtmr1")])
    records = rtmr.parse_records(firmware, True, "CCEL")
    assert [(r.index, r.type) for r in records] == [(1, 0x80000001), (4, 0x0D), (4, 3), (2, 5)]
    ours = rtmr.parse_records(aael(["x y z"]), False, "AAEL")
    want = replayed([hashlib.sha384(b"kernel cmdline to rtmr3").digest(),
                     hashlib.sha384(tagged("x y z")).digest()])
    assert rtmr.replay(records + ours) == want


def test_a_log_cut_short_is_an_error_naming_it():
    data = aael(["a b c"])
    with pytest.raises(rtmr.LogError, match="AAEL: .*cut short"):
        rtmr.parse_records(data[:-3], False, "AAEL")


def test_the_fake_register_keeps_the_kernels_rules():
    register = FakeRegister()
    with pytest.raises(OSError) as err:
        register.write(bytes(47))
    assert err.value.errno == 22
    with pytest.raises(OSError):
        register.write(bytes(48), offset=1)
    assert register.value == bytes(48)
    assert register.write(b"\x01" * 48) == 48
    assert register.value == hashlib.sha384(bytes(48) + b"\x01" * 48).digest()


# ---- bind: a root with the logs, the fake register


def world(tmp_path, firmware: bytes | None = None, log: bytes | None = None):
    root = Root(tmp_path)
    if firmware is not None:
        path = tmp_path / rtmr.CCEL_PATH.lstrip("/")
        path.parent.mkdir(parents=True)
        path.write_bytes(firmware)
    if log is not None:
        path = tmp_path / rtmr.EVENTLOG_PATH.lstrip("/")
        path.parent.mkdir(parents=True)
        path.write_bytes(log)
    return root


def log_bytes(tmp_path) -> bytes:
    return (tmp_path / rtmr.EVENTLOG_PATH.lstrip("/")).read_bytes()


GPU = {"bus_id": "00000000:1B:00.0", "uuid": "GPU-4a3c1f0e-7d2b-4c59-9e1a-2b6f0d8c3e71"}


def body(result: str = "pass") -> str:
    return bind.content(result, 1, 0, "on", "ab" * 32, "cd" * 32, devices=[GPU],
                        architecture="Hopper", multi_gpu_mode="none")


def test_bind_appends_one_entry_and_extends_rtmr3_with_its_digest(tmp_path):
    firmware = ccel([(4, 0x0D, b"something the firmware measured into rtmr3")])
    earlier = aael(["github.com/confidential-containers PullImage {}"])
    start = replayed([hashlib.sha384(b"something the firmware measured into rtmr3").digest(),
                      hashlib.sha384(tagged("github.com/confidential-containers PullImage {}")).digest()])
    register = FakeRegister(start)
    root = world(tmp_path, firmware, earlier)
    got = bind.bind(root, "pass", body(), register)
    assert got["state"] == "bound" and got["appended"] is True and got["result"] == "pass"
    assert register.writes == [(48, 0)]  # one write of 48 bytes at offset 0
    data = log_bytes(tmp_path)
    assert data[:len(earlier)] == earlier  # appended, never rewritten
    records = rtmr.parse_records(data, False, "AAEL")
    assert records[-1].text() == f"{bind.DOMAIN} GpuAttestation {body()}"
    assert register.value == hashlib.sha384(start + records[-1].digest).digest()
    assert got["digest"] == records[-1].digest.hex()
    # a relying party's replay of both logs gives the register
    assert rtmr.replay(rtmr.parse_records(firmware, True, "CCEL") + records) == register.value
    assert not os.path.exists(tmp_path / "run/attestation-agent" / rtmr.WAL_NAME)
    assert oct(os.stat(tmp_path / rtmr.EVENTLOG_PATH.lstrip("/")).st_mode & 0o777) == "0o644"


# issue 43 item 6, issue 45 item 2: the domain a URI, the content version 2 naming the GPUs
KNOWN_DOMAIN = "urn:uuid:393acf0b-2e7d-4084-a54e-933012df6af5"
KNOWN_CONTENT = ('{"architecture":"Hopper","cc_mode":"on","devices":[{"bus_id":"00000000:1B:00.0",'
                 '"uuid":"GPU-4a3c1f0e-7d2b-4c59-9e1a-2b6f0d8c3e71"}],"gpus":1,'
                 '"multi_gpu_mode":"none","nonce":"' + "ab" * 32 + '","nvswitches":0,'
                 '"record_sha256":"' + "cd" * 32 + '","result":"pass","version":2}')
# SHA-384 of the tagged event of that text (checked with openssl dgst -sha384)
KNOWN_V2_DIGEST = ("1cf33868c37462f62bac0d5c8b0f6211cb2f4b7b53daac2e16685a6b2974713c"
                   "aeb3253b2f0324359c88b271d903af23")


def test_the_content_is_one_canonical_ascii_json_line_of_version_2():
    text = body()
    assert text == KNOWN_CONTENT
    assert json.loads(text)["result"] == "pass"
    assert (bind.DOMAIN, bind.OPERATION, bind.CONTENT_VERSION) == (KNOWN_DOMAIN, "GpuAttestation", 2)
    event = rtmr.tagged_event(bind.DOMAIN, bind.OPERATION, text)
    assert event[8:] == f"{KNOWN_DOMAIN} GpuAttestation {KNOWN_CONTENT}".encode("ascii")
    assert rtmr.digest(event).hex() == KNOWN_V2_DIGEST


def test_the_domain_is_a_uri_and_the_content_printable_ascii():
    """The AAEL specification: a domain RECOMMENDED to be a URI, every field printable
    characters; a value that is not ASCII is escaped, never written as it is."""
    from urllib.parse import urlsplit

    assert urlsplit(bind.DOMAIN).scheme == "urn" and bind.DOMAIN.isascii()
    said = bind.content("fail", 1, 0, "on", None, None,
                        devices=[{"bus_id": "00000000:1B:00.0", "uuid": "GPU-\u00e9\n"}])
    assert said.isascii() and said.isprintable()
    assert json.loads(said)["devices"] == [{"bus_id": "00000000:1B:00.0", "uuid": "GPU-\u00e9\n"}]


def test_the_devices_are_listed_by_bus_id():
    said = json.loads(bind.content("pass", 2, 0, "on", None, None, devices=[
        {"bus_id": "00000000:2A:00.0", "uuid": "GPU-b", "index": 1},
        {"bus_id": "00000000:1B:00.0", "uuid": "GPU-a"}]))
    assert said["devices"] == [{"bus_id": "00000000:1B:00.0", "uuid": "GPU-a"},
                               {"bus_id": "00000000:2A:00.0", "uuid": "GPU-b"}]


def test_a_rerun_appends_only_when_its_result_differs(tmp_path):
    register = FakeRegister()
    root = world(tmp_path)
    assert bind.bind(root, "pass", body(), register)["appended"] is True
    again = bind.bind(root, "pass", body(), register)
    assert again["state"] == "bound" and again["appended"] is False
    assert len(register.writes) == 1
    revoked = bind.bind(root, "fail", body("fail"), register)
    assert revoked["appended"] is True and len(register.writes) == 2
    texts = [r.text() for r in rtmr.parse_records(log_bytes(tmp_path), False, "AAEL")]
    assert [json.loads(t.split(" ", 2)[2])["result"] for t in texts] == ["pass", "fail"]


def test_a_register_that_does_not_replay_is_broken_and_nothing_is_written(tmp_path):
    earlier = aael(["a b c"])
    register = FakeRegister(hashlib.sha384(b"an extend nobody logged").digest())
    root = world(tmp_path, log=earlier)
    with pytest.raises(bind.BindError, match="does not replay.*without logging"):
        bind.bind(root, "pass", body(), register)
    assert register.writes == [] and log_bytes(tmp_path) == earlier


def test_a_refused_extend_takes_the_entry_back(tmp_path):
    earlier = aael(["a b c"])
    register = FakeRegister(replayed([hashlib.sha384(tagged("a b c")).digest()]), refuse=True)
    root = world(tmp_path, log=earlier)
    with pytest.raises(bind.BindError, match="extending .*failed.*taken back"):
        bind.bind(root, "pass", body(), register)
    assert log_bytes(tmp_path) == earlier  # the log replays again


def test_a_register_that_reads_back_wrong_keeps_the_entry_and_says_so(tmp_path):
    register = FakeRegister(wrong=True)
    root = world(tmp_path)
    with pytest.raises(bind.BindError, match="after the extend is .*entry stays"):
        bind.bind(root, "pass", body(), register)
    assert len(rtmr.parse_records(log_bytes(tmp_path), False, "AAEL")) == 1


def test_a_log_that_cannot_be_written_extends_nothing(tmp_path):
    register = FakeRegister()
    root = world(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run/attestation-agent").write_text("a file where the folder goes")
    with pytest.raises(bind.BindError, match="cannot"):
        bind.bind(root, "pass", body(), register)
    assert register.writes == [] and register.value == bytes(48)


def test_a_log_others_can_write_is_not_trusted(tmp_path):
    root = world(tmp_path, log=b"")
    os.chmod(tmp_path / rtmr.EVENTLOG_PATH.lstrip("/"), 0o666)
    with pytest.raises(bind.BindError, match="cannot be trusted"):
        bind.bind(root, "pass", body(), FakeRegister())


def test_no_register_is_unbound_and_writes_nothing(tmp_path):
    got = bind.bind(Root(tmp_path), "pass", body())
    assert got["state"] == "unbound" and "rtmr3:sha384" in got["reason"]
    assert not (tmp_path / "run").exists()


def test_for_boot_required_without_a_register_fails_and_auto_does_not(tmp_path):
    status = Status()
    record, failure = bind.for_boot(Root(tmp_path), status, "required", "none")
    assert record["state"] == "unbound" and "confidential_computing.bind: required" in failure
    record, failure = bind.for_boot(Root(tmp_path), status, "auto", "none")
    assert record["state"] == "unbound" and failure is None
    record, failure = bind.for_boot(Root(tmp_path), status, "off", "none")
    assert record["state"] == "off" and failure is None


def test_for_boot_keeps_the_attested_record_whose_sha256_the_event_names(tmp_path):
    status = Status()
    status.attestation = {"result": "passed", "nonce": "ab" * 32, "nvattest_version": "1.2.2",
                          "devices": [{"device": "gpu", "index": 0}],
                          "runs": [{"device": "gpu", "code": 0, "claims_sha256": "ee" * 32}]}
    register = FakeRegister()
    record, failure = bind.for_boot(Root(tmp_path), status, "auto", "pass", register)
    assert failure is None and record["state"] == "bound"
    kept = (tmp_path / bind.RECORD_PATH.lstrip("/")).read_bytes()
    [entry] = rtmr.parse_records(log_bytes(tmp_path), False, "AAEL")
    said = json.loads(entry.text().split(" ", 2)[2])
    assert said["record_sha256"] == hashlib.sha256(kept).hexdigest()
    assert said["nonce"] == "ab" * 32 and said["result"] == "pass"


def pci(address: str, device_id: str):
    from podvm_gpu.model import PciDevice

    return PciDevice(address, "10de", device_id, "030200", "nvidia", device_id)


def bound_content(tmp_path, status) -> dict:
    record, failure = bind.for_boot(Root(tmp_path), status, "auto", "pass", FakeRegister())
    assert failure is None and record["state"] == "bound", record
    [entry] = rtmr.parse_records(log_bytes(tmp_path), False, "AAEL")
    domain, operation, content = entry.text().split(" ", 2)
    assert (domain, operation) == (bind.DOMAIN, bind.OPERATION)
    return json.loads(content)


def test_for_boot_names_the_gpus_their_architecture_and_the_multi_gpu_mode(tmp_path):
    """Issue 45 item 2, before the attestation records identities: the GPUs on PCI by bus id
    (nvidia-smi's form), no UUID; the architecture of their PCI ids; -mgm's word."""
    from podvm_gpu.steps.cc.classify import CcAnswers

    status = Status()
    status.gpus = [pci("0000:2a:00.0", "2330"), pci("0000:1b:00.0", "2330")]
    status.confidential_computing = CcAnswers(mode="off", devtools=False,
                                              multi_gpu="protected-pcie")
    said = bound_content(tmp_path, status)
    assert said["devices"] == [{"bus_id": "00000000:1B:00.0", "uuid": None},
                               {"bus_id": "00000000:2A:00.0", "uuid": None}]
    assert (said["architecture"], said["multi_gpu_mode"], said["cc_mode"], said["gpus"]) == \
        ("Hopper", "protected-pcie", "ppcie", 2)


@pytest.mark.parametrize("where", ["status", "attestation"])
def test_for_boot_takes_the_attested_identities_where_the_boot_recorded_them(tmp_path, where):
    """Issue 45 item 1 records ``attested_gpus`` (objects with .bus_id and .uuid, or their
    dicts): the event names those, not the PCI scan."""
    from types import SimpleNamespace

    status = Status()
    status.gpus = [pci("0000:1b:00.0", "2901"), pci("0000:2a:00.0", "2901")]
    gpus = [SimpleNamespace(index=0, bus_id="00000000:1b:00.0", uuid="GPU-1", ueid="7"),
            SimpleNamespace(index=1, bus_id="0000:2A:00.0", uuid="GPU-2", ueid=None)]
    if where == "status":
        status.attested_gpus = gpus
    else:
        status.attestation = {"attested_gpus": [vars(g) for g in gpus]}
    said = bound_content(tmp_path, status)
    assert said["devices"] == [{"bus_id": "00000000:1B:00.0", "uuid": "GPU-1"},
                               {"bus_id": "00000000:2A:00.0", "uuid": "GPU-2"}]
    assert said["architecture"] == "Blackwell"


@pytest.mark.parametrize("ids, want", [(["2330", "2901"], None), (["2330", "ffff"], None),
                                       (["2335", "2335"], "Hopper"), ([], None)])
def test_the_architecture_is_the_gpus_one_known_architecture(ids, want):
    status = Status()
    status.gpus = [pci(f"0000:{i + 16:02x}:00.0", did) for i, did in enumerate(ids)]
    assert bind.gpu_identities(status)[1] == want


def test_for_boot_a_broken_binding_fails_the_boot_in_auto(tmp_path):
    register = FakeRegister(refuse=True)
    record, failure = bind.for_boot(Root(tmp_path), Status(), "auto", "none", register)
    assert record["state"] == "broken" and failure.startswith("binding broken: extending")


# ---- check's binding row


def row_world(tmp_path, binding: dict | None, register: bytes | None, log: bytes = b""):
    from types import SimpleNamespace

    from podvm_gpu.status import StatusFile

    root = world(tmp_path, log=log)
    if register is not None:
        node = tmp_path / rtmr.RTMR3_PATH.lstrip("/")
        node.parent.mkdir(parents=True)
        node.write_bytes(register)
    status = Status()
    status.binding = binding
    StatusFile(root).finish(status, "no-gpu", "detect: no NVIDIA GPU on PCI (3 devices scanned)")
    return SimpleNamespace(root=root)


def test_the_row_passes_a_binding_whose_logs_still_replay_and_fails_one_that_does_not(tmp_path):
    text = f"{bind.DOMAIN} GpuAttestation {body('none')}"
    log = aael([text])
    value = replayed([hashlib.sha384(tagged(text)).digest()])
    bound = rtmr.binding_record("bound", "none", None, True, "ab" * 48)
    row = bind.binding_row(row_world(tmp_path / "a", bound, value, log))
    assert (row.result, row.name) == ("pass", "binding") and "bound: none" in row.detail
    later = hashlib.sha384(value + b"an extend nobody logged".ljust(48)).digest()
    row = bind.binding_row(row_world(tmp_path / "b", bound, later, log))
    assert row.result == "fail" and "no longer replays" in row.detail


def test_the_row_names_the_register_it_could_not_read(tmp_path):
    """It said ``warn ... cannot be checked now: No such file or directory``, naming no file."""
    bound = rtmr.binding_record("bound", "none", None, True, "ab" * 48)
    row = bind.binding_row(row_world(tmp_path, bound, None))
    assert row.result == "warn", row
    assert row.detail.endswith(f"cannot be checked now: cannot read {rtmr.RTMR3_PATH}: No such "
                               "file or directory"), row.detail


def test_the_row_fails_broken_and_skips_unbound(tmp_path):
    broken = rtmr.binding_record("broken", "pass", "extending it failed")
    row = bind.binding_row(row_world(tmp_path / "a", broken, None))
    assert row.result == "fail" and "extending it failed" in row.detail
    unbound = rtmr.binding_record("unbound", reason=rtmr.UNBOUND_REASON)
    assert bind.binding_row(row_world(tmp_path / "b", unbound, None)).result == "skip"


# ---- the host gives the CCEL (an ACPI table): any bytes are read safely



@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.booleans())
def test_any_bytes_parse_to_records_or_a_log_error(data, header):
    try:
        records = rtmr.parse_records(data, header, "log")
    except rtmr.LogError:
        return
    for r in records:
        assert r.offset < len(data) and (r.digest is None or len(r.digest) == 48)
    try:
        assert len(rtmr.replay(records)) == 48
    except rtmr.LogError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
                max_size=5))
def test_built_entries_parse_back_to_their_texts(contents):
    texts = [f"d o {c.replace(chr(10), ' ').replace(chr(13), ' ')}" for c in contents]
    log = b"".join(rtmr.entry(rtmr.tagged_event(*t.split(" ", 2))) for t in texts)
    assert [r.text() for r in rtmr.parse_records(log, False, "l")] == texts
