"""docs/trustee/podvm-gpu.rego, the Trustee policy fragment users take (issues 37 and 43), run by
two Rego engines over inputs built as Trustee builds them.

The engines (both pinned in the test extras, never skipped): regorus, Trustee's own engine,
through PyPI's ``opa-eval`` (a builtin's type error is an error of the whole evaluation there:
``RuntimeError``, which fails the test), and rego-cpp through ``regopy``. Every input is given
to both; they must agree with each other and with the expected verdict.

The input: each log is made of the agent's own bytes (podvm_gpu/steps/cc/bind.py's content,
podvm_gpu/host/rtmr.py's tagged event and entry), and shown to the policy as Trustee's TDX
verifier shows a replayed log (trustee ``deps/eventlog/src/ccel/event_tag.rs``, the facts in
../shared/trustee-aa.md 1): firmware entries first, then one entry per AAEL record with
``index``, ``type_name`` ``EV_EVENT_TAG``, ``digests``, ``event`` (base64 of the event data),
``digest_matches_event`` (SHA-384 of the event data against the record's digest: computed, not
enforced, by Trustee) and ``details``: ``string`` (the text, NULs removed), and for the AAEL tag
``unicode_name`` ``AAEL`` and ``data`` ``{domain, operation, content}``, the content parsed when
it is JSON and a string only when it is not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from pathlib import Path

import opa_eval  # regorus; a test dependency (pyproject.toml): never skipped
import pytest
import regopy  # rego-cpp; a test dependency (pyproject.toml): never skipped

from podvm_gpu.host import rtmr
from podvm_gpu.steps.cc import bind

REPO = Path(__file__).resolve().parent.parent
POLICY = REPO / "docs" / "trustee" / "podvm-gpu.rego"
OPERATING = REPO / "docs" / "operating.md"
QUERY = "data.policy.podvm_gpu_attested"

DEVICES = [{"bus_id": "00000000:1B:00.0", "uuid": "GPU-4a3c1f0e-7d2b-4c59-9e1a-2b6f0d8c3e71"}]


def ours(result: str, gpus: int = 1, cc_mode: str | None = "on",
         architecture: str | None = "Hopper") -> tuple[str, str, str]:
    return bind.DOMAIN, bind.OPERATION, bind.content(
        result, gpus, 0, cc_mode, "ab" * 32, "cd" * 32 if result == "pass" else None,
        devices=DEVICES * gpus, architecture=architecture, multi_gpu_mode="none")


OTHER = ("github.com/confidential-containers", "PullImage", '{"image":"busybox"}')
INITDATA = ("github.com/confidential-containers", "InitData", '{"digest":"sha384:00"}')
V1_CONTENT = ('{"cc_mode":"on","gpus":1,"nonce":"' + "ab" * 32 + '","nvswitches":0,'
              '"record_sha256":null,"result":"pass","version":1}')


# ---- what Trustee builds


def aael_entry(record: rtmr.Record) -> dict:
    """One AAEL record as Trustee's TDX verifier gives it to the policy (event_tag.rs)."""
    event = record.event
    tag, size = struct.unpack_from("<II", event)
    text = event[8:8 + size].decode("utf-8", "replace").replace("\0", "")
    details: dict = {"string": text}
    if tag == rtmr.TAG:
        domain, operation, rest = _split_two_spaces(event[8:8 + size].decode("utf-8"))
        details["data"] = {"domain": domain, "operation": operation, "content": _serde(rest)}
        details["unicode_name"] = "AAEL"
    return {"index": record.index, "type_name": "EV_EVENT_TAG",
            "digests": [{"alg": "SHA-384", "digest": record.digest.hex()}],
            "digest_matches_event": hashlib.sha384(event).digest() == record.digest,
            "event": base64.b64encode(event).decode(), "details": details}


def _split_two_spaces(text: str) -> tuple[str, str, str]:
    """AaelEventEntry::from_bytes: the text up to the first space, up to the second, the rest
    (no second space: an error of the whole evidence)."""
    first = text.index(" ")
    second = text.index(" ", first + 1)
    return text[:first], text[first + 1:second], text[second + 1:]


def _serde(text: str):
    """serde_json::from_str as a Value, else the string: any JSON value parses (an object stays
    one), NaN and Infinity do not."""
    def refuse(name):
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError:
        return text


def firmware() -> list[dict]:
    """Firmware entries as Trustee gives them, before the AAEL's: some legitimately with
    ``digest_matches_event`` false (its own test data has such EV_IPL and boot-application
    records), none in RTMR3 but an EV_NO_ACTION."""
    def fw(index, type_name, data: bytes, matches: bool, details: dict) -> dict:
        digest = hashlib.sha384(data if matches else data + b"!").hexdigest()
        return {"index": index, "type_name": type_name, "digests": [{"alg": "SHA-384",
                "digest": digest}], "digest_matches_event": matches,
                "event": base64.b64encode(data).decode(), "details": details}

    return [fw(1, "EV_EFI_VARIABLE_DRIVER_CONFIG", b"SecureBoot\x01", True,
               {"unicode_name": "SecureBoot", "variable_data": "AQ=="}),
            fw(2, "EV_EFI_BOOT_SERVICES_APPLICATION", b"\x18\x60shim", False,
               {"device_paths": ["File(\\EFI\\BOOT\\BOOTX64.EFI)"]}),
            fw(3, "EV_IPL", b"grub_cmd linux /vmlinuz\0", False,
               {"string": "grub_cmd linux /vmlinuz"}),
            fw(4, "EV_NO_ACTION", b"\0" * 16, False, {})]


def log_of(events, forge: dict | None = None) -> bytes:
    """AA's log of these events in the agent's bytes; ``forge`` {position: text} replaces a
    record's event by another text and keeps its digest (what someone holding the log can do:
    the register and Trustee's replay of the digests do not change)."""
    out = b""
    for at, event in enumerate(events):
        tagged = rtmr.tagged_event(*event)
        entry = rtmr.entry(tagged)
        if forge and at in forge:
            other = rtmr.tagged_event(*forge[at])
            entry = entry[:62] + struct.pack("<I", len(other)) + other
        out += entry
    return out


def trustee_view(events, forge: dict | None = None, fw: list[dict] | None = None,
                 string_content: bool = False) -> dict:
    """The input Trustee's policy gets for this AA log (``string_content``: the content kept
    as the string an older Trustee gave)."""
    entries = [aael_entry(r) for r in rtmr.parse_records(log_of(events, forge), False, "AAEL")]
    if string_content:
        for entry in entries:
            if "data" in entry["details"]:
                entry["details"]["data"]["content"] = _split_two_spaces(
                    entry["details"]["string"])[2]
    return {"tdx": {"uefi_event_logs": (firmware() if fw is None else fw) + entries}}


# ---- the two engines


def policy(min_gpus: int | None = None, earlier: tuple[str, ...] = (),
           architectures: tuple[str, ...] = ()) -> str:
    text = POLICY.read_text()
    for line, value, given in (("podvm_gpu_min_gpus := 1", str(min_gpus), min_gpus is not None),
                               ("podvm_gpu_earlier_domains := set()",
                                "{" + ", ".join(json.dumps(d) for d in earlier) + "}", earlier),
                               ("podvm_gpu_architectures := set()",
                                "{" + ", ".join(json.dumps(a) for a in architectures) + "}",
                                architectures)):
        assert line in text
        if given:
            text = text.replace(line, line.split(":=")[0] + ":= " + value)
    return text


def regorus(text: str, view: dict, tmp_path: Path) -> bool:
    path = tmp_path / "podvm-gpu.rego"
    path.write_text(text)
    value = opa_eval.OpaEval(str(path), query=QUERY).evaluate_parsed(json.dumps(view))
    assert isinstance(value, bool), value
    return value


def rego_cpp(text: str, view: dict) -> bool:
    interpreter = regopy.Interpreter()
    interpreter.add_module("podvm_gpu", text)
    interpreter.set_input_term(json.dumps(view))
    output = interpreter.query(f"x = {QUERY}")
    assert output.ok(), str(output)
    value = json.loads(str(output).split("@")[0])["bindings"]["x"]
    assert isinstance(value, bool), value
    return value


def attested(view: dict, tmp_path: Path, **edits) -> bool:
    """The verdict of both engines, which must agree."""
    text = policy(**edits)
    by_regorus, by_rego_cpp = regorus(text, view, tmp_path), rego_cpp(text, view)
    assert by_regorus is by_rego_cpp, f"regorus {by_regorus}, rego-cpp {by_rego_cpp}"
    return by_regorus


# ---- the verdicts


@pytest.mark.parametrize("events, forge, want", [
    ([ours("pass")], None, True),
    ([ours("fail")], None, False),
    ([ours("none")], None, False),
    ([], None, False),  # missing: a boot that died before it wrote
    ([OTHER], None, False),  # missing, another component's event only
    ([ours("pass"), OTHER, ours("pass")], None, True),  # a later pass (a rerun) adds nothing
    ([ours("fail"), ours("pass")], None, False),  # a later pass does not undo a fail
    ([ours("pass"), ours("fail")], None, False),  # a real later fail revokes
    ([ours("pass"), OTHER, ours("fail"), ours("pass")], None, False),
    ([OTHER, ours("pass")], None, False),  # an unknown domain's event before it in RTMR3
    ([ours("none"), ours("pass")], None, False),  # the first podvm-gpu event must be the pass
    # a forged pass: the fail's text rewritten, its digest kept (RTMR3 replays the same)
    ([ours("fail")], {0: ours("pass")}, False),
    ([ours("pass"), ours("fail")], {1: ours("pass")}, False),
    # a mangled fail: its text made unreadable, or another domain's, the digest kept
    ([ours("pass"), ours("fail")], {1: (bind.DOMAIN, bind.OPERATION, '{"result":"fa')}, False),
    ([ours("pass"), ours("fail")], {1: OTHER}, False),
    # a mangled event of another domain after the pass: a tagged text that was not extended
    ([ours("pass"), OTHER], {1: INITDATA}, False),
    # non-JSON content: Trustee gives a string
    ([ours("pass"), (bind.DOMAIN, bind.OPERATION, "not json")], None, False),
    ([(bind.DOMAIN, bind.OPERATION, "pass")], None, False),
    ([ours("pass"), ("example.com/other", "Note", "plain text, not JSON")], None, True),
    # JSON that is not an object, or not a version it reads
    ([(bind.DOMAIN, bind.OPERATION, '"pass"')], None, False),
    ([(bind.DOMAIN, bind.OPERATION, ours("pass")[2].replace('"version":2', '"version":3'))],
     None, False),
    ([ours("pass"), (bind.DOMAIN, bind.OPERATION, '{"result":"fail","version":3}')], None,
     False),
    # version 1 (issue 37): its domain is not accepted; its content under the domain is read
    ([("podvm-gpu", bind.OPERATION, V1_CONTENT)], None, False),
    ([(bind.DOMAIN, bind.OPERATION, V1_CONTENT)], None, True),
], ids=["pass", "fail", "none", "missing", "only-others", "later-pass", "fail-then-pass",
        "pass-then-fail", "revoked-then-pass", "unknown-earlier-domain", "none-first",
        "forged-pass", "forged-revocation", "mangled-fail", "fail-disguised-as-other",
        "mangled-other", "non-json-after-pass", "non-json-first", "non-json-other",
        "json-string", "version-3", "version-3-fail", "v1-domain", "v1-content"])
def test_the_policy_over_trustee_shaped_logs(events, forge, want, tmp_path):
    view = trustee_view(events, forge)
    assert attested(view, tmp_path) is want


def test_a_forged_record_replays_to_the_same_register_and_only_its_flag_tells():
    """Why the policy reads ``digest_matches_event``: Trustee's replay of the digests does not
    see the rewrite."""
    real = rtmr.parse_records(log_of([ours("pass"), ours("fail")]), False, "AAEL")
    forged = rtmr.parse_records(log_of([ours("pass"), ours("fail")], {1: ours("pass")}), False,
                                "AAEL")
    assert rtmr.replay(real) == rtmr.replay(forged)
    assert json.loads(forged[1].text().split(" ", 2)[2])["result"] == "pass"
    assert [aael_entry(r)["digest_matches_event"] for r in forged] == [True, False]


def test_an_earlier_rtmr3_event_is_accepted_only_from_a_listed_domain(tmp_path):
    view = trustee_view([INITDATA, ours("pass")])
    assert attested(view, tmp_path) is False
    assert attested(view, tmp_path, earlier=(INITDATA[0],)) is True
    assert attested(trustee_view([INITDATA, OTHER, ours("pass")]), tmp_path,
                    earlier=("example.com/initdata",)) is False


@pytest.mark.parametrize("fw, want", [
    (None, True),
    ([], True),
    ([{"index": 4, "type_name": "EV_IPL", "digests": [], "digest_matches_event": True,
       "event": "", "details": {"string": "kernel cmdline"}}], False),
], ids=["firmware-false-flags-elsewhere", "no-firmware", "firmware-in-rtmr3"])
def test_the_firmware_before_the_aael(fw, want, tmp_path):
    """Firmware records in RTMR0-2 with ``digest_matches_event`` false do not refuse; one
    extended into RTMR3 before the pass does (it is not a listed AAEL domain)."""
    assert attested(trustee_view([ours("pass")], fw=fw), tmp_path) is want


@pytest.mark.parametrize("events, want", [
    ([ours("pass")], True), ([ours("pass"), ours("fail")], False),
    ([(bind.DOMAIN, bind.OPERATION, "{")], False)])
def test_a_content_given_as_a_string_is_parsed_and_never_an_error(events, want, tmp_path):
    """An older Trustee's string content: parsed only when it is JSON (json.unmarshal of
    anything else is an error of the whole evaluation under regorus)."""
    assert attested(trustee_view(events, string_content=True), tmp_path) is want


@pytest.mark.parametrize("cc_mode, want", [("on", True), ("ppcie", True), ("devtools", False),
                                           (None, False)])
def test_the_policy_requires_production_cc_mode(cc_mode, want, tmp_path):
    assert attested(trustee_view([ours("pass", cc_mode=cc_mode)]), tmp_path) is want


def test_the_policy_requires_at_least_n_gpus(tmp_path):
    assert attested(trustee_view([ours("pass", gpus=8)]), tmp_path, min_gpus=8) is True
    assert attested(trustee_view([ours("pass", gpus=4)]), tmp_path, min_gpus=8) is False


def test_the_architectures_when_listed(tmp_path):
    hopper = ("Hopper",)
    assert attested(trustee_view([ours("pass")]), tmp_path, architectures=hopper) is True
    assert attested(trustee_view([ours("pass", architecture="Blackwell")]), tmp_path,
                    architectures=hopper) is False
    assert attested(trustee_view([ours("pass", architecture=None)]), tmp_path,
                    architectures=hopper) is False
    assert attested(trustee_view([(bind.DOMAIN, bind.OPERATION, V1_CONTENT)]), tmp_path,
                    architectures=hopper) is False  # version 1 names none


def documented_event() -> str:
    """The example event of docs/operating.md, verbatim: the one line of its section that
    starts with the domain."""
    section = OPERATING.read_text().split("## Binding the GPUs' verdict to the TEE", 1)[1]
    section = section.split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith(bind.DOMAIN + " ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_documented_example_event_is_accepted_and_is_todays_content(tmp_path):
    domain, operation, content = documented_event().split(" ", 2)
    assert (domain, operation) == (bind.DOMAIN, bind.OPERATION)
    said = json.loads(content)
    today = json.loads(ours("pass")[2])
    assert sorted(said) == sorted(today) and said["version"] == bind.CONTENT_VERSION
    assert content == bind.canonical(said)  # the canonical line the agent writes
    assert re.fullmatch(r"[\x20-\x7e]+", content)  # printable ASCII (the AAEL specification)
    assert attested(trustee_view([(domain, operation, content)]), tmp_path) is True
    assert attested(trustee_view([(domain, operation, content), ours("fail")]), tmp_path) is False


@pytest.mark.parametrize("view", [{}, {"tdx": {}}, {"snp": {"report": {}}},
                                  {"tdx": {"uefi_event_logs": []}},
                                  {"tdx": {"uefi_event_logs": [{"index": 4}]}}],
                         ids=["empty", "tdx-without-log", "sev-snp", "empty-log", "bare-entry"])
def test_evidence_without_a_podvm_gpu_event_is_refused_never_an_error(view, tmp_path):
    """Trustee evaluates the merged policy for every VM: an SEV-SNP or CPU VM's evidence must
    give false, never an error of the whole evaluation under regorus."""
    assert attested(view, tmp_path) is False
