"""Attestation before the ready state: the policy, the runs, the record (docs/interface.md 3.2,
"Attestation", and its table).

Called by the ``confidential-computing`` step once it has classified the GPUs as confidential
(CC on, DEVTOOLS allowed by the config, or Protected PCIe) and read the ready state, before
``nvidia-smi conf-compute -srs 1``: :func:`attest_before_ready`. Persistenced is running by
then, so nvattest is never the first NVML client (nvattest.md 8: the adapter would be torn
down when it exits). The step keeps its name; its reasons start ``attestation: ``.

The policy (``confidential_computing.attestation``):

* ``off``: no run; a warning says the GPUs are not attested.
* ``required``, or ``auto`` in a confidential guest (host/tee.py's evidence, else the kernel
  log): a run must pass. No usable ``nvattest`` fails closed, naming the tool and the key.
* ``auto`` on a regular VM: a run when nvattest is installed (it must then pass), else a
  warning.

A failed run never leaves the GPUs ready: a ready state found ``ready`` (a re-run) is set back
with ``nvidia-smi conf-compute -srs 0``, as NVIDIA's Protected PCIe verifier does (nvattest.md
9); ``-srs 1`` is never run after a failure (the step raises).
"""

from __future__ import annotations

import os
import time

from podvm_gpu.errors import CommandError, StepFailed, one_line
from podvm_gpu.gpufacts import ask
from podvm_gpu.gpufacts.smi import ready_state_off
from podvm_gpu.row import doc_ref
from podvm_gpu.steps.cc.attest import run as nvattest
from podvm_gpu.steps.cc.attest import verdict as v

STATUS_DIR = "/run/podvm-gpu"


def output_path(device: str) -> str:
    """Where a run's whole JSON output is kept, beside status.json (host path)."""
    return f"{STATUS_DIR}/nvattest-{device}.json"


def required_because(cc, guest: str | None) -> str | None:
    """Why an attestation must pass (the config, or the guest's evidence), or None."""
    if cc.attestation == "required":
        return "confidential_computing.attestation: required"
    if cc.attestation == "auto" and guest:
        return f"a confidential guest ({guest}) with confidential_computing.attestation: auto"
    return None


_UNSET = object()


def tee_guest(ctx) -> str | None:
    """The confidential guest as host/tee.py's evidence names it (``Intel TDX (/proc/cpuinfo
    flag tdx_guest)``), or None (the kernel log alone never makes one: the CC step warns)."""
    from podvm_gpu.host import tee

    guest = tee.detect(ctx.root)
    return guest.describe() if guest.kind is not None else None


def attestation_demanded(ctx) -> str | None:
    """Who demands an attestation whatever the guest: ``confidential_computing.attestation:
    required``, or the pod's initdata (``attestation_required``); None otherwise."""
    pod = getattr(ctx.status, "initdata", None)  # podvm_gpu/initdata.py's record (boot's)
    if isinstance(pod, dict) and pod.get("attestation_required"):
        return f'the pod\'s initdata ({pod["path"]}, data."podvm-gpu.toml" attestation_required)'
    if ctx.config.confidential_computing.attestation == "required":
        return "confidential_computing.attestation: required"
    return None


def attest_before_ready(ctx, state: str, guest=_UNSET, ppcie: bool = False,
                        required_by: str | None = None, before_run=None) -> str:
    """Decide and run the attestation; the step's message part (``""`` when none ran).

    Args:
        ctx: the BootContext (config, runner, GPUs and NVSwitches found on PCI, the loaded
            driver's version, the status being built).
        state: the ready state found, ``ready`` or ``not-ready``.
        guest: how host/tee.py names the confidential guest, or None; by default
            :func:`tee_guest`.
        ppcie: the GPUs are in Protected PCIe mode: the NVSwitches are attested too.
        required_by: another source that requires attestation (the pod's initdata), or None.
        before_run: called once before nvattest runs (the CC step waits there for the
            fabricmanager step: nvattest runs after the fabric manager, nvattest.md 8).

    Raises:
        StepFailed: attestation required and nvattest unusable, or a run failed (``-srs 0``
            was run when the state was found ready; the reason says whether it worked).
    """
    cc = ctx.config.confidential_computing
    if guest is _UNSET:
        guest = tee_guest(ctx)
    if required_by is None:
        required_by = attestation_demanded(ctx)
    must = required_by or required_because(cc, guest)
    if cc.attestation == "off" and not required_by:
        ctx.warn("confidential-computing: the GPUs are not attested (confidential_computing."
                 "attestation: off)")
        ctx.status.attestation = {"result": "off", "reason": "confidential_computing."
                                  "attestation: off"}
        return "not attested (attestation off)"
    if ctx.runner.which("nvattest") is None:
        missing = ctx.runner.why_missing("nvattest")
        if must:
            ctx.status.attestation = {"result": "failed", "reason": missing}
            back = _unready(ctx, state)
            raise StepFailed(f"attestation required ({must}) but {missing}: install NVIDIA's "
                             f"nvattest in the image or name it in tools.nvattest{back}")
        ctx.warn(f"confidential-computing: the GPUs are not attested: {missing} (a regular VM; "
                 "confidential_computing.attestation: off silences this)")
        ctx.status.attestation = {"result": "not-run", "reason": missing}
        return "not attested (nvattest not installed)"
    if before_run is not None:
        before_run()
    record = attest(ctx, ppcie)
    ctx.status.attestation = record
    if record["result"] != "passed":
        back = _unready(ctx, state)
        raise StepFailed(f"attestation failed: {record['reason']}{back}")
    devices = len(record["devices"])
    return f"attested ({devices} device{'s' if devices != 1 else ''}, nvattest local verifier)"


def attest(ctx, ppcie: bool, write: bool = True) -> dict:
    """Run nvattest for the GPUs (and, in Protected PCIe, the NVSwitches with the same nonce)
    and judge it; the status' ``attestation`` record (docs/status.schema.json). ``write``:
    keep each run's JSON under /run/podvm-gpu (``check --attest`` writes nothing)."""
    from podvm_gpu.host.daemons import under_systemd

    nonce = os.urandom(32).hex()
    started = time.monotonic()
    record = {"result": "failed", "reason": None, "code": None, "message": None,
              "verifier": "local", "nonce": nonce,
              "nvattest_version": nvattest.version(ctx.runner), "duration_s": 0.0,
              "devices": [], "runs": []}
    kinds = [("gpu", len(ctx.gpus))] + ([("nvswitch", len(ctx.nvswitches))] if ppcie else [])
    judged = {}
    systemd = under_systemd()
    out_dir = _unit_output_dir(ctx, write) if systemd else None
    try:
        _runs(ctx, record, kinds, judged, nonce, systemd, out_dir, write)
    finally:
        if out_dir is not None and not write:
            import shutil

            shutil.rmtree(out_dir, ignore_errors=True)
    if record["reason"] is None:
        failure = None
        if ppcie:
            failure = v.topology_failure(judged["gpu"].claims, judged["nvswitch"].claims)
            ctx.warn("confidential-computing: the NVSwitches' lock state is not checked "
                     "(it needs NSCQ, which the agent does not use; nvattest does not "
                     "enforce it either)")
        if failure:
            record["reason"] = f"Protected PCIe topology: {failure}"
        else:
            record["result"] = "passed"
    record["duration_s"] = round(time.monotonic() - started, 3)
    if record["reason"]:
        record["reason"] = one_line(record["reason"], 600)
    return record


def _unit_output_dir(ctx, write: bool) -> str:
    """Where the unit's stdout and stderr files go: /run/podvm-gpu under the root for boot; a
    private folder under /run, removed afterwards, for ``check --attest`` (which keeps
    nothing)."""
    import tempfile

    from podvm_gpu.host.fs import ensure_dir

    if write:
        ensure_dir(ctx.root / STATUS_DIR)
        return ctx.root / STATUS_DIR
    return tempfile.mkdtemp(prefix="podvm-gpu-attest-",
                            dir="/run" if os.access("/run", os.W_OK) else None)


def _runs(ctx, record: dict, kinds, judged: dict, nonce: str, systemd: bool, out_dir,
          write: bool) -> None:
    """Each run in turn, recorded; the first failure sets ``record["reason"]`` and ends."""
    cc = ctx.config.confidential_computing
    for kind, count in kinds:
        if kind == "nvswitch":
            old = too_old_for_switches(record["nvattest_version"])
            if old:
                ctx.warn(f"confidential-computing: {old}")
        argv = nvattest.command(kind, nonce, cc, ctx.root)
        ran = nvattest.run(ctx.runner, argv, nvattest.limit_s(cc, count), systemd, out_dir,
                           getattr(ctx, "check_stop", None))
        expect = v.Expect(nonce, count, ctx.driver_version if kind == "gpu" else None,
                          rp_policy=bool(cc.relying_party_policy))
        run_record = {"device": kind, "where": ran.where, "duration_s": round(ran.duration_s, 3),
                      "exit": ran.returncode, "code": None, "message": None,
                      "claims_sha256": None, "output": None}
        record["runs"].append(run_record)
        if ran.returncode is None:
            record["reason"] = f"nvattest attest --device {kind} {ran.ended}"
            return
        verdict = v.judge(ran.returncode, ran.stdout, ran.stderr, kind, expect)
        judged[kind] = verdict
        run_record.update(code=verdict.code, message=verdict.message,
                          claims_sha256=v.claims_sha256(verdict.claims) if verdict.claims
                          else None)
        record["code"], record["message"] = verdict.code, verdict.message
        record["devices"] += v.device_records(verdict.claims)
        if write and verdict.document is not None:
            run_record["output"] = _keep(ctx, kind, ran.stdout)
        for line in verdict.warnings:
            ctx.warn(f"confidential-computing: {line}")
        if not verdict.ok:
            record["reason"] = f"nvattest attest --device {kind}: {verdict.failure}"
            if verdict.code == RIM_NOT_FOUND:
                record["reason"] += rim_not_found(ctx, kind)
            return


NVSWITCH_MIN = (1, 2, 1)  # NVIDIA/attestation-sdk PR #20 ("Release 2026.04.29") fixed NVSwitch RIM lookups


def too_old_for_switches(version: str | None) -> str | None:
    """Why this nvattest may not attest NVSwitches (a version before 1.2.1, naming both), or
    None (1.2.1 or later, or a version it cannot read: nvattest says then)."""
    import re

    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    if not found or tuple(int(x) for x in found.groups()) >= NVSWITCH_MIN:
        return None
    return (f"nvattest {version} attests NVSwitches, but their RIM lookups work only from "
            f"nvattest {'.'.join(map(str, NVSWITCH_MIN))} (NVIDIA/attestation-sdk PR #20): "
            "install a newer nvattest in the image")


RIM_NOT_FOUND = 104  # NVAT_RC_RIM_NOT_FOUND (nvattest.md 3.2): a 404 from the RIM service


def rim_not_found(ctx, kind: str) -> str:
    """What a reason adds to NVAT result 104: NVIDIA has not published the reference values
    (RIM) for this VBIOS or driver (NVIDIA/nvtrust#144, #151: the RIM service answered 404
    ``RIM_NOT_FOUND`` for a new VBIOS), which is not a measurement mismatch; nvattest's JSON
    carries no claims then, so the VBIOS versions come from ``nvidia-smi --query-gpu=
    vbios_version`` (bounded; left out when it fails). docs/operating.md says how to supply a
    RIM directory."""
    versions = ""
    if kind == "gpu":
        try:
            found = ask.vbios_versions(ctx.runner, 10)
            if found:
                versions = f" (VBIOS {', '.join(found)}; driver {ctx.driver_version})"
        except CommandError:
            pass
    where = (f"{ctx.config.confidential_computing.rim_dir} lacks it"
             if ctx.config.confidential_computing.rim_dir else "the RIM service has none")
    return (f"; RIM not found: NVIDIA has not published the reference values for this "
            f"{'GPU' if kind == 'gpu' else 'NVSwitch'}'s firmware or driver{versions} "
            f"({where}); not a measurement mismatch: supply the RIM files in a folder named by "
            f"confidential_computing.rim_dir ({doc_ref('operating.md', 'When attestation fails')}), or use "
            "a VBIOS and driver NVIDIA has published")


def _keep(ctx, kind: str, stdout: str) -> str | None:
    """Keep a run's JSON beside the status (atomic, 0644); its host path, or None (a warning)."""
    from podvm_gpu.host.fs import atomic_write, ensure_dir

    path = output_path(kind)
    try:
        ensure_dir(ctx.root / STATUS_DIR)
        atomic_write(ctx.root / path, stdout, 0o644)
    except OSError as err:
        ctx.warn(f"confidential-computing: cannot keep nvattest's output in {path}: "
                 f"{err.strerror}")
        return None
    return path


def _unready(ctx, state: str) -> str:
    """A failed attestation with the ready state found ``ready``: set it back to not-ready.

    Returns what the reason adds: ``""`` when the state was not-ready, else what ``-srs 0``
    did (the GPUs may still be ready when it failed: the reason says so).
    """
    if state != "ready":
        return ""
    said = ready_state_off(ctx.runner)
    if said:
        return f"; the ready state found ready could NOT be set back to not-ready ({said})"
    ctx.warn("confidential-computing: attestation failed; the ready state found ready was set "
             "back to not-ready (nvidia-smi conf-compute -srs 0)")
    return "; the ready state found ready was set back to not-ready"
