"""The agent's own verdict over one ``nvattest attest --format json`` run: pure, no I/O.

NVAT's result is necessary, never sufficient: a relying-party policy replaces NVAT's built-in
one (../shared/nvattest.md 6.2), and no claim says how many GPUs the VM has or which nonce the
agent passed. So whatever NVAT says, a run passes only when (docs/interface.md 3.2,
"Attestation"):

1. its exit status is 0 and its JSON's ``result_code`` is 0 (a usage error prints no JSON and
   exits 104-114, colliding with RIM codes: nvattest.md 3.3; exit = code & 0xFF: 3.1);
2. ``claims`` is a list with exactly one claim of the device type per device found on PCI (a
   GPU without a claim is never made ready; dstack and c8s count the same way: 6.3);
3. every ``eat_nonce`` is the nonce the agent passed, lowercase hex without ``0x`` (5.7), and
   the report's nonce matched;
4. ``measres`` is ``success`` (``secboot``/``dbgstat`` are derived from it: 6.4);
5. every cert chain (``*-cert-chain``) is ``valid``, OCSP ``good``, the OCSP response valid, and
   its OCSP nonce matched (a cached "trust outpost" response does not: accepted only when the
   config names a relying-party policy, which is how NVIDIA relaxes it, with a warning; 7.3);
6. the signature, parse, FWID, RIM fetch/signature/version and measurements-available claims
   true (the checks NVAT's claims carry; unknown keys are ignored: claims 3.0 and 4.0, 5.2);
7. each GPU claim's driver version is the loaded module's;
8. in Protected PCIe the topology as NVIDIA's PPCIe verifier checks it (nvattest.md 9,
   nvtrust ``validate_topology.py``): every GPU claim's ``x-nvidia-gpu-switch-pdis`` the same set
   of distinct switch PDIs, one per NVSwitch; every switch's ``x-nvidia-switch-pdi`` in that set;
   every switch's ``x-nvidia-switch-gpu-pdis`` one per GPU and the same for all switches.
"""

from __future__ import annotations

import json

CLAIMS_VERSIONS = ("3.0", "4.0")
_CHAIN_RULES = (("x-nvidia-cert-status", "valid"), ("x-nvidia-cert-ocsp-status", "good"),
                ("x-nvidia-cert-ocsp-response-valid", True))
_NONCE_MATCHES = "x-nvidia-cert-ocsp-nonce-matches"
# Claims that must be true (nvattest.md 5.2, 5.5); a key absent is a failure too.
_GPU_TRUE = ("x-nvidia-gpu-arch-check", "x-nvidia-gpu-attestation-report-cert-chain-fwid-match",
             "x-nvidia-gpu-attestation-report-parsed", "x-nvidia-gpu-attestation-report-nonce-match",
             "x-nvidia-gpu-attestation-report-signature-verified",
             "x-nvidia-gpu-driver-rim-fetched", "x-nvidia-gpu-driver-rim-signature-verified",
             "x-nvidia-gpu-driver-rim-version-match",
             "x-nvidia-gpu-driver-rim-measurements-available", "x-nvidia-gpu-vbios-rim-fetched",
             "x-nvidia-gpu-vbios-rim-version-match", "x-nvidia-gpu-vbios-rim-signature-verified",
             "x-nvidia-gpu-vbios-rim-measurements-available",
             "x-nvidia-gpu-vbios-index-no-conflict")
_SWITCH_TRUE = ("x-nvidia-switch-arch-check",
                "x-nvidia-switch-attestation-report-cert-chain-fwid-match",
                "x-nvidia-switch-attestation-report-parsed",
                "x-nvidia-switch-attestation-report-nonce-match",
                "x-nvidia-switch-attestation-report-signature-verified",
                "x-nvidia-switch-bios-rim-fetched", "x-nvidia-switch-bios-rim-signature-verified",
                "x-nvidia-switch-bios-rim-version-match",
                "x-nvidia-switch-bios-rim-measurements-available")


class Expect:
    """What the agent knows that nvattest does not.

    Attributes:
        nonce: the nonce passed with ``--nonce``, 64 hex digits (any case, no ``0x``).
        devices: how many devices of the run's type were found on PCI (GPUs for ``gpu``,
            NVSwitches for ``nvswitch``).
        driver_version: the loaded nvidia module's version (``580.159.03``), or None (unknown:
            not compared).
        rp_policy: whether the config names a relying-party policy (a cached OCSP response's
            nonce mismatch is then accepted with a warning).
    """

    __slots__ = ("nonce", "devices", "driver_version", "rp_policy")

    def __init__(self, nonce: str, devices: int, driver_version: str | None = None,
                 rp_policy: bool = False):
        self.nonce = nonce.lower().removeprefix("0x")
        self.devices, self.driver_version, self.rp_policy = devices, driver_version, rp_policy


class NvattestOutcome:
    """The outcome of one run.

    Attributes:
        ok: the run passed every rule of the module docstring.
        code, message: NVAT's ``result_code`` and ``result_message`` (None without JSON).
        failure: why it did not pass, one line naming NVAT's code and message and the first
            failed claim (``gpu 1: measres fail``), or nvattest's stderr when there are no
            claims; ``""`` when ``ok``.
        claims: the claims list as printed ([] when none).
        document: the whole JSON document as parsed (None without JSON).
        warnings: lines for the status' warnings (a cached OCSP response accepted).
    """

    __slots__ = ("ok", "code", "message", "failure", "claims", "document", "warnings")

    def __init__(self, ok: bool, code: int | None, message: str | None, failure: str,
                 claims: list, document: dict | None, warnings: list[str]):
        self.ok, self.code, self.message, self.failure = ok, code, message, failure
        self.claims, self.document, self.warnings = claims, document, warnings


def _last_error(stderr: str) -> str:
    """nvattest's most telling stderr line: the first ``[error]`` line (the root cause comes
    first in its log, nvattest.md 7.2), else the last non-empty line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.split("] ", 2)[-1] for line in lines if "[error]" in line]
    return (errors[0] if errors else (lines[-1] if lines else "")) [:300]


def parse_output(stdout: str) -> dict | None:
    """nvattest's JSON document, or None when stdout holds none (a usage error, text mode).

    A document counts only as a JSON object with an integer ``result_code``."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    if not isinstance(doc, dict) or type(doc.get("result_code")) is not int:
        return None
    return doc


def claim_failure(claim: object, kind: str, index: int, expect: Expect,
                  warnings: list[str]) -> str | None:
    """The first rule (module docstring 3-7) one claim breaks, as ``<kind> <index>: <what>``."""
    where = f"{kind} {index}"
    if not isinstance(claim, dict):
        return f"{where}: claim is not an object"
    if claim.get("x-nvidia-device-type") != kind:
        return f"{where}: device type {claim.get('x-nvidia-device-type')!r}, not {kind!r}"
    version = claim.get("x-nvidia-gpu-claims-version" if kind == "gpu" else "x-nvidia-version")
    if version not in CLAIMS_VERSIONS:
        return f"{where}: claims version {version!r} unknown (known: 3.0, 4.0)"
    nonce = claim.get("eat_nonce")
    if not isinstance(nonce, str) or nonce.lower() != expect.nonce:
        return f"{where}: eat_nonce {str(nonce)[:16]}... is not the nonce this boot passed"
    if claim.get("measres") != "success":
        return f"{where}: measres {claim.get('measres')!r}{_mismatch(claim)}"
    for key in _GPU_TRUE if kind == "gpu" else _SWITCH_TRUE:
        if claim.get(key) is not True:
            return f"{where}: {key} {json.dumps(claim.get(key))}"
    for key in sorted(k for k in claim if k.endswith("-cert-chain")):
        chain = claim[key]
        if not isinstance(chain, dict):
            return f"{where}: {key} is not an object"
        for field, wanted in _CHAIN_RULES:
            if chain.get(field) != wanted:
                reason = chain.get("x-nvidia-cert-revocation-reason")
                return (f"{where}: {key} {field} {json.dumps(chain.get(field))}"
                        + (f" ({reason})" if reason else ""))
        if chain.get(_NONCE_MATCHES) is not True:
            if not expect.rp_policy:
                return f"{where}: {key} {_NONCE_MATCHES} {json.dumps(chain.get(_NONCE_MATCHES))}" \
                       " (a cached OCSP response: name a relying-party policy that allows it)"
            warnings.append(f"attestation: {where}: {key}: a cached OCSP response (nonce not "
                            "matched), accepted under the relying-party policy")
    if kind == "gpu" and expect.driver_version is not None:
        said = claim.get("x-nvidia-gpu-driver-version")
        if said != expect.driver_version:
            return f"{where}: driver version {said!r} in the claims, {expect.driver_version!r} loaded"
    return None


def _mismatch(claim: dict) -> str:
    records = claim.get("x-nvidia-mismatch-measurement-records")
    if isinstance(records, list) and records and isinstance(records[0], dict):
        first = records[0]
        return f" (measurement index {first.get('index')} {first.get('measurementSource')})"
    return ""


def judge(returncode: int, stdout: str, stderr: str, kind: str, expect: Expect) -> NvattestOutcome:
    """The verdict over one finished run of ``nvattest attest --device <kind> --format json``.

    Args:
        returncode: its exit status (negative: killed by that signal).
        stdout, stderr: what it printed.
        kind: ``gpu`` or ``nvswitch``.
        expect: what the agent knows (:class:`Expect`).
    """
    warnings: list[str] = []
    doc = parse_output(stdout)
    if doc is None:
        from podvm_gpu.errors import exit_text

        said = _last_error(stderr) or "no output"
        return NvattestOutcome(False, None, None, f"nvattest printed no JSON result "
                               f"({exit_text(returncode)}): {said}", [], None, warnings)
    code, message = doc["result_code"], str(doc.get("result_message", ""))[:120]
    claims = doc.get("claims") if isinstance(doc.get("claims"), list) else []
    nvat = f"NVAT result {code} ({message})"
    if returncode != code & 0xFF:
        return NvattestOutcome(False, code, message, f"{nvat}, but nvattest exited {returncode}",
                               claims, doc, warnings)
    first = None
    for index, claim in enumerate(claims):
        first = claim_failure(claim, kind, index, expect, warnings)
        if first:
            break
    if code != 0:
        why = first or _last_error(stderr) or (claims and "no claim failed the agent's checks")
        return NvattestOutcome(False, code, message, f"{nvat}: {why or 'nvattest said nothing more'}",
                               claims, doc, warnings)
    if not isinstance(doc.get("claims"), list):
        return NvattestOutcome(False, code, message, f"{nvat} but claims is not a list", [], doc, warnings)
    if len(claims) != expect.devices:
        return NvattestOutcome(False, code, message, f"{nvat} but {len(claims)} {kind} claim(s) for "
                               f"{expect.devices} {kind}(s) on PCI: a device without a claim is never "
                               "made ready", claims, doc, warnings)
    if first:
        return NvattestOutcome(False, code, message, f"{nvat} but {first}", claims, doc, warnings)
    return NvattestOutcome(True, code, message, "", claims, doc, warnings)


def topology_failure(gpu_claims: list[dict], switch_claims: list[dict]) -> str | None:
    """Protected PCIe: the first way the claims' topology is wrong (module docstring 8), or None.

    Args:
        gpu_claims, switch_claims: the claims of the ``gpu`` and ``nvswitch`` runs, already
            counted (one per device on PCI) by :func:`judge`.
    """
    sets = [c.get("x-nvidia-gpu-switch-pdis") for c in gpu_claims]
    for index, pdis in enumerate(sets):
        if not isinstance(pdis, list) or not pdis:
            return f"gpu {index}: no x-nvidia-gpu-switch-pdis in a Protected PCIe claim"
    switch_pdis = set(sets[0]) if sets else set()
    if len(switch_pdis) != len(sets[0] if sets else []):
        return "gpu 0: x-nvidia-gpu-switch-pdis are not distinct"
    for index, pdis in enumerate(sets):
        if set(pdis) != switch_pdis:
            return f"gpu {index}: x-nvidia-gpu-switch-pdis differ from gpu 0's"
    if len(switch_pdis) != len(switch_claims):
        return (f"the GPUs name {len(switch_pdis)} switch PDI(s), {len(switch_claims)} "
                "NVSwitch(es) attested")
    gpu_sets = []
    for index, claim in enumerate(switch_claims):
        if claim.get("x-nvidia-switch-pdi") not in switch_pdis:
            return (f"nvswitch {index}: x-nvidia-switch-pdi {claim.get('x-nvidia-switch-pdi')!r} "
                    "is not among the GPUs' switch PDIs")
        gpus = claim.get("x-nvidia-switch-gpu-pdis")
        if not isinstance(gpus, list) or len(set(gpus)) != len(gpu_claims) \
                or len(gpus) != len(gpu_claims):
            return (f"nvswitch {index}: x-nvidia-switch-gpu-pdis name "
                    f"{len(gpus) if isinstance(gpus, list) else 0} GPU(s), {len(gpu_claims)} "
                    "attested")
        gpu_sets.append(set(gpus))
    if any(s != gpu_sets[0] for s in gpu_sets):
        return "the NVSwitches' x-nvidia-switch-gpu-pdis differ"
    return None


def device_records(claims: list) -> list[dict]:
    """Per device, what status.json's ``attestation.devices`` keeps (docs/status.schema.json)."""
    out = []
    for index, claim in enumerate(claims):
        if not isinstance(claim, dict):
            continue
        kind = claim.get("x-nvidia-device-type")
        gpu = kind == "gpu"
        out.append({"type": kind if isinstance(kind, str) else None, "index": index,
                    "hwmodel": _text(claim.get("hwmodel")), "ueid": _text(claim.get("ueid")),
                    "driver_version": _text(claim.get("x-nvidia-gpu-driver-version")) if gpu
                    else None,
                    "vbios_version": _text(claim.get("x-nvidia-gpu-vbios-version" if gpu
                                                     else "x-nvidia-switch-bios-version")),
                    "measres": _text(claim.get("measres"))})
    return out


def _text(value: object) -> str | None:
    return value[:200] if isinstance(value, str) else None


def claims_sha256(claims: list) -> str:
    """SHA-256 (hex) of the claims as canonical JSON (sorted keys, no spaces, UTF-8)."""
    import hashlib  # OpenSSL's load holds the interpreter ~3 ms: only when claims are kept

    text = json.dumps(claims, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
