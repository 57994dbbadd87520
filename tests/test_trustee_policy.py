"""docs/trustee/podvm-gpu.rego, the Trustee policy fragment users take (issue 37 item 5), run
by a real Rego engine (regopy, rego-cpp; pinned in the test extras) over event logs built from
the agent's own bytes.

Each log is made as the VM would hold it: podvm_gpu/steps/cc/bind.py's content,
podvm_gpu/host/rtmr.py's tagged event and entry, read back by the parser. It is then shown to
the policy as Trustee's TDX verifier shows a replayed log: ``input.tdx.uefi_event_logs[i]``
with ``index``, ``type_name`` and, for an AAEL event, ``details.data.{domain, operation,
content}`` (the text split at its first two spaces).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import regopy  # a test dependency (pyproject.toml): never skipped

from podvm_gpu.host import rtmr
from podvm_gpu.steps.cc import bind

POLICY = Path(__file__).resolve().parent.parent / "docs" / "trustee" / "podvm-gpu.rego"


def ours(result: str, gpus: int = 1, cc_mode: str = "on") -> tuple[str, str, str]:
    return bind.DOMAIN, bind.OPERATION, bind.content(result, gpus, 0, cc_mode, "ab" * 32, None)


OTHER = ("github.com/confidential-containers", "PullImage", '{"image":"busybox"}')


def trustee_view(events: list[tuple[str, str, str]], firmware: list[dict] = ()) -> dict:
    """The AA log of these events in the agent's bytes, parsed back, as Trustee shows it."""
    log = b"".join(rtmr.entry(rtmr.tagged_event(*event)) for event in events)
    shown = list(firmware)
    for record in rtmr.parse_records(log, False, "AAEL"):
        domain, operation, content = record.text().split(" ", 2)
        shown.append({"index": record.index, "type_name": "EV_EVENT_TAG",
                      "digests": [{"alg": "SHA-384", "digest": record.digest.hex()}],
                      "details": {"unicode_name": "AAEL",
                                  "data": {"domain": domain, "operation": operation,
                                           "content": content}}})
    return {"tdx": {"uefi_event_logs": shown}}


def attested(view: dict, min_gpus: int | None = None) -> bool:
    text = POLICY.read_text()
    if min_gpus is not None:
        assert "podvm_gpu_min_gpus := 1" in text
        text = text.replace("podvm_gpu_min_gpus := 1", f"podvm_gpu_min_gpus := {min_gpus}")
    interpreter = regopy.Interpreter()
    interpreter.add_module("podvm_gpu", text)
    interpreter.set_input_term(json.dumps(view))
    output = interpreter.query("x = data.policy.podvm_gpu_attested")
    assert output.ok(), str(output)
    value = json.loads(str(output).split("@")[0])["bindings"]["x"]
    assert isinstance(value, bool)
    return value


FIRMWARE_RTMR0 = [{"index": 1, "type_name": "EV_EFI_VARIABLE_DRIVER_CONFIG", "details": {}},
                  {"index": 4, "type_name": "EV_NO_ACTION", "details": {}}]


@pytest.mark.parametrize("events, want", [
    ([ours("pass")], True),
    ([ours("fail")], False),
    ([ours("none")], False),
    ([], False),  # missing: a boot that died before it wrote
    ([OTHER], False),  # missing, another component's event only
    ([ours("pass"), OTHER, ours("pass")], True),  # a later pass (forged or a rerun) adds nothing
    ([ours("fail"), ours("pass")], False),  # a forged later pass does not undo a fail
    ([ours("pass"), ours("fail")], False),  # a real later fail revokes
    ([ours("pass"), OTHER, ours("fail"), ours("pass")], False),
    ([OTHER, ours("pass")], False),  # not first in RTMR3
    ([ours("none"), ours("pass")], False),  # the first podvm-gpu event must be the pass
], ids=["pass", "fail", "none", "missing", "only-others", "later-pass", "fail-then-forged-pass",
        "pass-then-fail", "revoked-then-forged", "not-first", "none-first"])
def test_the_policy_over_built_event_logs(events, want):
    assert attested(trustee_view(events, FIRMWARE_RTMR0)) is want


def test_other_registers_and_no_action_records_do_not_count_as_first():
    view = trustee_view([ours("pass")], FIRMWARE_RTMR0 + [
        {"index": 3, "type_name": "EV_IPL", "details": {}}])
    assert attested(view) is True


def test_a_firmware_event_in_rtmr3_before_the_pass_is_not_first():
    view = trustee_view([ours("pass")], [{"index": 4, "type_name": "EV_IPL", "details": {}}])
    assert attested(view) is False


@pytest.mark.parametrize("cc_mode, want", [("on", True), ("ppcie", True), ("devtools", False),
                                           (None, False)])
def test_the_policy_requires_production_cc_mode(cc_mode, want):
    assert attested(trustee_view([ours("pass", cc_mode=cc_mode)])) is want


def test_the_policy_requires_at_least_n_gpus():
    assert attested(trustee_view([ours("pass", gpus=8)]), min_gpus=8) is True
    assert attested(trustee_view([ours("pass", gpus=4)]), min_gpus=8) is False
