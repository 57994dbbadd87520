#!/usr/bin/env python3
"""A stand-in for NVIDIA's ``nvattest`` (NVAT CLI 1.2.2) for the tests, true to ../shared/nvattest.md.

No ``nvattest`` is packaged for the test machines; this script behaves as that document says the
real one does, driven by a plan (JSON) that says what the "hardware" and the "network" answer:

* the plan is read from ``$NVATTEST_STANDIN_PLAN``, else from ``nvattest.plan.json`` beside the
  script (so a stand-in started by systemd-run, which passes no environment, still finds it);
  no plan is the default plan: one GPU, everything passes.
* parsing as CLI11 does (nvattest.md 2, 3.3): ``attest``/``collect-evidence``/``version``, global
  ``--format/-f`` and ``--log-level/-l`` before or after the subcommand, ``--x v`` and ``--x=v``,
  env vars used only when the flag is absent; a validation error prints
  ``<opt>: <reason>\\nRun with --help for more information.`` to stderr, nothing on stdout, exit
  105; an unknown option 109; a missing value 114.
* ``attest --format json`` prints one sorted-key, 4-space-indented document on stdout
  (nvattest.md 4, 5): ``claims`` and ``detached_eat`` arrays for result codes 0, 11 and 12,
  ``{}`` otherwise; exit status ``result_code & 0xFF`` (3.1); the nonce given is echoed,
  lowercase without ``0x``, in every claim's ``eat_nonce`` (5.7); a bad nonce gives 4, a nonce
  not 32 bytes long on NVML 501 (2.3); ``secboot``/``dbgstat`` follow ``measres`` (6.4); an RP
  policy turns 12 into 0 unless the plan says it rejects (11) (2.4 step 6). Log lines on stderr.
* ``--format text`` (the default) prints nothing on stdout.
* the stand-in never touches the ready state (11.7).

Plan keys (all optional)::

    {"version": "1.2.2",
     "log": "/path/calls.jsonl",            # one JSON line per call: argv, env keys used
     "gpus": [{"hwmodel": ..., "ueid": ..., "driver": "580.159.03", "vbios": "96.00.D9.00.01",
               "switch_pdis": ["0A..", ...]}, ...],        # or a count
     "nvswitches": [{"pdi": "..", "gpu_pdis": [..], "bios": ".."}, ...],   # or a count
     "gpu": {...outcome...}, "nvswitch": {...outcome...}}

An outcome: ``code`` (a result code; default 0; for 0/11/12 claims follow), ``measres_fail``
(device indexes whose measurements mismatch: code 12 unless given), ``cert`` (device index ->
cert-chain claim changes, e.g. ``{"0": {"x-nvidia-cert-ocsp-status": "revoked"}}``: code 12),
``rp_rejects`` (with a policy: 11), ``nonce`` (``"foreign"``: claims carry another nonce, as a
replayed output would), ``claims`` (how many claims to print: fewer than the devices),
``driver`` (the driver version every GPU claim says), ``delay_s``, ``hang`` (sleep until killed),
``stderr`` (extra log lines), ``claims_version`` (``"4.0"``: the newer shape, unknown keys added).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import time

VERSION = "1.2.2"
MESSAGES = {0: "Ok", 1: "Unknown", 2: "Internal Error", 3: "Not initialized", 4: "Bad Argument",
            11: "Relying Party Policy Mismatch", 12: "Overall Attestation Result is False",
            101: "RIM Forbidden", 102: "RIM Internal Error", 104: "RIM Not Found",
            105: "RIM Invalid Signature", 201: "OCSP Invalid Response", 202: "OCSP Server Error",
            205: "OCSP Forbidden", 301: "Policy Evaluation Error",
            500: "NVML Initialization Failed", 501: "NVML Error",
            502: "GPU Architecture Not Supported", 504: "GPU Evidence Nonce Mismatch",
            505: "GPU Evidence Driver RIM Version Mismatch",
            509: "GPU is neither in CC nor in PPCIe mode", 600: "NSCQ Initialization Failed",
            601: "NSCQ Error", 802: "Certificate Chain Verification Failure"}
# the error log lines nvattest.md 4 and 7.2 quote, per code
ERROR_LINES = {
    2: ["Final libcurl error: Couldn't resolve host name (6)", "Gave up HTTP request after 6 attempts",
        "Failed to perform OCSP check with url: https://ocsp.ndis.nvidia.com",
        "Failed to validate attestation report certificate chain",
        "Failed to generate attestation report claims", "Failed to verify GPU evidence",
        "Error while performing device attestation"],
    12: ["Failed to verify GPU evidence"],
    500: ["Failed to initialize NVML", "Failed to collect GPU evidence"],
    501: ["No GPUs available", "Failed to collect GPU evidence"],
    509: ["GPU must be running in CC or PPCIe mode to collect evidence through NVML",
          "Failed to collect GPU evidence",
          # the real 1.2.2 on an H200 with CC off (nvattest.md, "Confirmed with the real binary")
          "Error while performing device attestation"],
    600: ["Failed to initialize NSCQ", "Failed to collect switch evidence"],
    104: ["Failed to download RIM from https://rim.attestation.nvidia.com/v1/rim/"
          "NV_GPU_DRIVER_GH100_580.159.03"],
}
GLOBAL_OPTS = {"--format": "format", "-f": "format", "--log-level": "log_level", "-l": "log_level"}
ATTEST_OPTS = {"--nonce": "nonce", "--device": "device", "-d": "device",
               "--gpu-evidence-source": "gpu_evidence_source", "--gpu-architecture": "gpu_arch",
               "--gpu-evidence-file": "gpu_evidence_file",
               "--nvswitch-evidence-source": "nvswitch_evidence_source",
               "--nvswitch-evidence-file": "nvswitch_evidence_file", "--verifier": "verifier",
               "--relying-party-policy": "rp_policy", "--rim-store": "rim_store",
               "--rim-url": "rim_url", "--rim-dir": "rim_dir", "--ocsp-url": "ocsp_url",
               "--nras-url": "nras_url", "--service-key": "service_key"}
ATTEST_FLAGS = ("--verify-rim-signatures", "--no-verify-rim-signatures",
                "--verify-rim-cert-chain", "--no-verify-rim-cert-chain")
CHOICES = {"format": ("text", "json"), "log_level": ("trace", "debug", "info", "warn", "error", "off"),
           "device": ("gpu", "nvswitch"), "gpu_evidence_source": ("nvml", "corelib", "file"),
           "nvswitch_evidence_source": ("nscq", "file"), "verifier": ("local", "remote"),
           "rim_store": ("remote", "dir")}
ENV = {"format": "NVAT_FORMAT", "log_level": "NVAT_LOG_LEVEL", "rim_url": "NVAT_RIM_SERVICE_BASE_URL",
       "ocsp_url": "NVAT_OCSP_BASE_URL", "nras_url": "NVAT_NRAS_BASE_URL",
       "service_key": "NV_ATTESTATION_SERVICE_KEY"}
LEVELS = ("trace", "debug", "info", "warn", "error", "off")


class Usage(Exception):
    def __init__(self, text: str, code: int):
        super().__init__(text)
        self.code = code


def load_plan() -> dict:
    path = os.environ.get("NVATTEST_STANDIN_PLAN") or os.path.join(
        os.path.dirname(os.path.abspath(sys.argv[0])), "nvattest.plan.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def parse(argv: list[str]) -> tuple[str | None, dict]:
    """CLI11's way (nvattest.md 2, 3.3): (subcommand, options); raises Usage."""
    sub, opts = None, {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if sub is None and arg in ("attest", "collect-evidence", "version"):
            sub = arg
            continue
        if arg in ("-h", "--help"):
            return "help", opts
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        table = dict(GLOBAL_OPTS)
        if sub in ("attest", "collect-evidence"):
            table.update(ATTEST_OPTS)
        if sub == "attest" and name in ATTEST_FLAGS:
            opts[name.lstrip("-").replace("-", "_")] = True
            continue
        if name not in table:
            raise Usage(f"The following argument was not expected: {arg}", 109)
        if not eq:
            if i >= len(argv) or (argv[i].startswith("-") and len(argv[i]) > 1):
                raise Usage(f"{name}: 1 required TEXT missing", 114)
            value = argv[i]
            i += 1
        opts[table[name]] = value
    for key, var in ENV.items():
        if key not in opts and os.environ.get(var):
            opts[key] = os.environ[var]
    for key, allowed in CHOICES.items():
        if key in opts and opts[key].lower() not in allowed:
            flag = next(f for f, k in {**GLOBAL_OPTS, **ATTEST_OPTS}.items()
                        if k == key and f.startswith("--"))
            raise Usage(f"{flag}: {opts[key]} not in {{{','.join(allowed)}}}", 105)
    if "rp_policy" in opts and not os.path.isfile(opts["rp_policy"]):
        raise Usage(f"--relying-party-policy: File does not exist: {opts['rp_policy']}", 105)
    if "rim_dir" in opts and not os.path.isdir(opts["rim_dir"]):
        raise Usage(f"--rim-dir: Directory does not exist: {opts['rim_dir']}", 105)
    return sub, opts


class Log:
    def __init__(self, level: str):
        self.at = LEVELS.index(level if level in LEVELS else "info")

    def __call__(self, level: str, text: str, sdk: bool = True) -> None:
        if LEVELS.index(level) < self.at:
            return
        tag = "warning" if level == "warn" else level
        stamp = time.strftime("%Y-%m-%d %H:%M:%S") + ".000"
        line = f"{stamp} [attestation.cpp:278 attest_device] [{tag}] {text}" if sdk else text
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _chain(expires: str, changes: dict | None = None) -> dict:
    chain = {"x-nvidia-cert-expiration-date": expires, "x-nvidia-cert-ocsp-nonce-matches": True,
             "x-nvidia-cert-ocsp-response-valid": True, "x-nvidia-cert-ocsp-status": "good",
             "x-nvidia-cert-revocation-reason": None, "x-nvidia-cert-status": "valid"}
    chain.update(changes or {})
    return chain


def _devices(plan: dict, key: str, default: int) -> list[dict]:
    found = plan.get(key, default)
    return [{} for _ in range(found)] if isinstance(found, int) else list(found)


def gpu_claim(i: int, dev: dict, nonce: str, outcome: dict) -> dict:
    failed = i in outcome.get("measres_fail", [])
    cert = outcome.get("cert", {}).get(str(i))
    claim = {
        "dbgstat": None if failed else "disabled", "eat_nonce": nonce,
        "hwmodel": dev.get("hwmodel", "GH100 A01 GSP BROM"),
        "measres": "fail" if failed else "success", "oemid": "5703",
        "secboot": None if failed else True,
        "ueid": dev.get("ueid", str(123456789012345678901234567890 + i)),
        "x-nvidia-device-type": "gpu", "x-nvidia-gpu-arch-check": True,
        "x-nvidia-gpu-attestation-report-cert-chain": _chain("9999-12-31T23:59:59Z", cert),
        "x-nvidia-gpu-attestation-report-cert-chain-fwid-match": True,
        "x-nvidia-gpu-attestation-report-nonce-match": True,
        "x-nvidia-gpu-attestation-report-parsed": True,
        "x-nvidia-gpu-attestation-report-signature-verified": True,
        "x-nvidia-gpu-claims-version": outcome.get("claims_version", "3.0"),
        "x-nvidia-gpu-driver-rim-cert-chain": _chain("2028-04-23T05:31:21Z"),
        "x-nvidia-gpu-driver-rim-fetched": True,
        "x-nvidia-gpu-driver-rim-measurements-available": True,
        "x-nvidia-gpu-driver-rim-signature-verified": True,
        "x-nvidia-gpu-driver-rim-version-match": True,
        "x-nvidia-gpu-driver-version": outcome.get("driver", dev.get("driver", "580.159.03")),
        "x-nvidia-gpu-vbios-index-no-conflict": True,
        "x-nvidia-gpu-vbios-rim-cert-chain": _chain("2027-04-30T23:59:59Z"),
        "x-nvidia-gpu-vbios-rim-fetched": True,
        "x-nvidia-gpu-vbios-rim-measurements-available": True,
        "x-nvidia-gpu-vbios-rim-signature-verified": True,
        "x-nvidia-gpu-vbios-rim-version-match": True,
        "x-nvidia-gpu-vbios-version": dev.get("vbios", "96.00.D9.00.01"),
        "x-nvidia-mismatch-measurement-records": [
            {"goldenSize": 48, "goldenValue": "ab" * 48, "index": 9,
             "measurementSource": "Firmware", "runtimeSize": 48, "runtimeValue": "cd" * 48}]
        if failed else None}
    if "switch_pdis" in dev:
        claim["x-nvidia-gpu-switch-pdis"] = sorted(set(dev["switch_pdis"]))
    if claim["x-nvidia-gpu-claims-version"] == "4.0":
        claim["x-nvidia-attester-claims"] = {}
        claim["x-nvidia-mismatch-opaque-data-records"] = None
    return claim


def switch_claim(i: int, dev: dict, nonce: str, outcome: dict) -> dict:
    failed = i in outcome.get("measres_fail", [])
    cert = outcome.get("cert", {}).get(str(i))
    claim = {
        "dbgstat": None if failed else "disabled", "eat_nonce": nonce,
        "hwmodel": dev.get("hwmodel", "LS_10 A01 FSP BROM"),
        "measres": "fail" if failed else "success", "secboot": None if failed else True,
        "ueid": dev.get("ueid", str(987654321098765432109876543210 + i)),
        "x-nvidia-device-type": "nvswitch",
        "x-nvidia-mismatch-measurement-records": None, "x-nvidia-switch-arch-check": True,
        "x-nvidia-switch-bios-version": dev.get("bios", "96.10.55.00.01"),
        "x-nvidia-switch-attestation-report-cert-chain": _chain("9999-12-31T23:59:59Z", cert),
        "x-nvidia-switch-attestation-report-cert-chain-fwid-match": True,
        "x-nvidia-switch-attestation-report-parsed": True,
        "x-nvidia-switch-attestation-report-nonce-match": True,
        "x-nvidia-switch-attestation-report-signature-verified": True,
        "x-nvidia-switch-bios-rim-fetched": True,
        "x-nvidia-switch-bios-rim-cert-chain": _chain("2027-04-30T23:59:59Z"),
        "x-nvidia-switch-bios-rim-signature-verified": True,
        "x-nvidia-switch-bios-rim-version-match": True,
        "x-nvidia-switch-bios-rim-measurements-available": True,
        "x-nvidia-version": "3.0"}
    if "pdi" in dev:
        claim["x-nvidia-switch-pdi"] = dev["pdi"]
    if "gpu_pdis" in dev:
        claim["x-nvidia-switch-gpu-pdis"] = list(dev["gpu_pdis"])
    return claim


def _b64(obj: dict) -> str:
    raw = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def detached_eat(claims: list[dict], nonce: str, prefix: str, overall: bool) -> list:
    now = int(time.time())
    header = "eyJhbGciOiJub25lIn0"
    subs, digests = {}, {}
    for i, claim in enumerate(claims):
        payload = {**claim, "iat": now, "exp": now + 3600, "iss": "NVAT-LOCAL-VERIFIER",
                   "jti": os.urandom(32).hex()}
        token = f"{header}.{_b64(payload)}."
        subs[f"{prefix}-{i}"] = token
        digests[f"{prefix}-{i}"] = ["DIGEST", ["SHA256", hashlib.sha256(token.encode()).hexdigest()]]
    payload = {"sub": "NVIDIA-PLATFORM-ATTESTATION", "iss": "NVAT-LOCAL-VERIFIER", "iat": now,
               "exp": now + 3600, "jti": os.urandom(32).hex(), "eat_nonce": nonce,
               "x-nvidia-ver": "3.0", "x-nvidia-overall-att-result": overall, "submods": digests}
    return [["JWT", f"{header}.{_b64(payload)}."], subs]


def attest(opts: dict, plan: dict, log: Log) -> int:
    """The ``attest`` subcommand; returns the result code."""
    device = opts.get("device", "gpu").lower()
    outcome = dict(plan.get(device) or {})
    json_out = opts.get("format", "text").lower() == "json"
    code, claims = 0, []
    nonce = opts.get("nonce", "")
    raw = nonce[2:] if nonce[:2] in ("0x", "0X") else nonce
    if not nonce:
        raw = os.urandom(32).hex()
    if opts.get("gpu_evidence_source") == "corelib":
        log("error", "The corelib evidence source is only supported with the collect-evidence "
            "subcommand.")
        code = 4
    elif len(raw) % 2 or any(c not in "0123456789abcdefABCDEF" for c in raw) or len(raw) < 64:
        log("error", "Invalid nonce")
        code = 4
    elif len(raw) != 64 and device == "gpu" and opts.get("gpu_evidence_source", "nvml") == "nvml":
        code = 501
    if code == 0:
        log("info", "Attesting GPUs" if device == "gpu" else "Attesting Switches")
        if outcome.get("hang"):
            while True:
                time.sleep(3600)
        time.sleep(float(outcome.get("delay_s", 0)))
        code = int(outcome.get("code", 0))
    nonce_out = raw.lower()
    if outcome.get("nonce") == "foreign":
        nonce_out = hashlib.sha256(b"another boot").hexdigest()
    if code in (0, 11, 12):
        devices = _devices(plan, "gpus" if device == "gpu" else "nvswitches",
                           1 if device == "gpu" else 0)
        make = gpu_claim if device == "gpu" else switch_claim
        claims = [make(i, dev, nonce_out, outcome) for i, dev in enumerate(devices)]
        if "claims" in outcome:
            claims = claims[:int(outcome["claims"])]
        overall = bool(claims) and all(
            c["measres"] == "success" and all(
                v["x-nvidia-cert-status"] == "valid" and v["x-nvidia-cert-ocsp-status"] == "good"
                and v["x-nvidia-cert-ocsp-nonce-matches"] and v["x-nvidia-cert-ocsp-response-valid"]
                for k, v in c.items() if k.endswith("-cert-chain")) for c in claims)
        if code == 0 and not overall:
            code = 12
        if code == 12:
            for line in ERROR_LINES[12]:
                log("error", line)
        if opts.get("rp_policy"):
            if code == 12:
                log("warn", "Overall result false for attestation, ignoring it as relying party "
                    "policy is provided")
            code = 11 if outcome.get("rp_rejects") or code == 11 else 0
            if code == 0:
                log("info", "Relying party policy ACCEPTED attestation results")
            else:
                log("error", "Relying party policy REJECTED attestation results")
    else:
        for line in ERROR_LINES.get(code, ["Error while performing device attestation"]):
            log("error", line)
    for line in outcome.get("stderr", []):
        log("info", line)
    message = MESSAGES.get(code, "Undefined")
    if json_out:
        doc = {"claims": claims if code in (0, 11, 12) else {},
               "detached_eat": detached_eat(claims, nonce_out, "GPU" if device == "gpu"
                                            else "SWITCH", code == 0)
               if code in (0, 11, 12) else {},
               "result_code": code, "result_message": message}
        sys.stdout.write(json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    else:
        log("info", "Devices: ", sdk=False)
        log("info", "GPU attestation was successful" if code == 0 else
            f"GPU attestation failed!\n\nError {code:03d}: {message}", sdk=False)
    return code


def _cgroup() -> str:
    """This process's cgroup (the unit it runs in, under systemd)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            return f.read().strip().rsplit(":", 1)[-1]
    except OSError:
        return ""


def _inet_allowed() -> bool:
    """Whether an IPv4 socket can be made (RestrictAddressFamilies= of the unit)."""
    import socket

    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    plan = load_plan()
    if plan.get("log"):
        with open(plan["log"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"argv": ["nvattest", *argv], "pid": os.getpid(),
                                "time": time.time(), "cgroup": _cgroup(),
                                "inet": _inet_allowed()}) + "\n")
    try:
        sub, opts = parse(argv)
    except Usage as err:
        sys.stderr.write(f"{err}\nRun with --help for more information.\n")
        return err.code
    log = Log(opts.get("log_level", "info").lower())
    if sub in (None, "help"):
        sys.stdout.write("NVIDIA Attestation CLI\nUsage: nvattest [OPTIONS] SUBCOMMAND\n")
        return 0
    if sub == "version":
        log("info", f"nvattest {plan.get('version', VERSION)} (Linux/x86_64)", sdk=False)
        return 0
    if sub == "collect-evidence":
        sys.stdout.write(json.dumps({"evidences": None, "result_code": 1,
                                     "result_message": "Unknown"}, indent=4) + "\n")
        return 1
    return attest(opts, plan, log) & 0xFF


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
