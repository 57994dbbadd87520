"""The GPUs made ready are the GPUs attested (issue 45; docs/interface.md 3.12).

nvattest 1.2.2's claims carry no UUID and no bus id, only ``ueid`` and the model
(../shared/nvattest.md 5.2), and it collects the evidence "per GPU in index order" (NVML's
index, nvattest.md 4.1); nvidia-smi gives the UUIDs. So the confidential-computing step reads
the GPU set (index, bus id, UUID: :func:`podvm_gpu.gpufacts.smi.identity_argv`, one bounded
call) twice:

1. right before nvattest runs (after the fabric wait), :func:`read`;
2. after the attestation passed, right before the binding's ``pass`` and ``-srs 1``,
   :func:`confirm`.

The two reads must be equal (the same bus ids, each with the same UUID and index), the evidence
must hold one GPU claim per GPU read (claims in index order: claim ``i`` is the GPU of index
``i``, whose ``ueid`` it gives), and no two GPUs may give the same ``ueid``. nvattest is the only
reader of a ``ueid`` and runs once per attestation, so a ``ueid`` is read once, kept with its
GPU and never compared with a second reading (the record says which GPU gave it). Any
difference fails the step closed, naming the GPU (bus id, UUID) and what changed; the boot's end
then binds ``fail`` (steps/cc/bind.py ``at_end``).

The identities the verdict covers are kept as :data:`NAME` on the boot context (a list of
:class:`GpuIdentity`), in status.json (``attested_gpus``, docs/status.schema.json) and in
``/run/podvm-gpu/attested.json`` (steps/cc/bind.py).
"""

from __future__ import annotations

import collections

from podvm_gpu.errors import CommandError, StepFailed, one_line
from podvm_gpu.gpufacts import ask, smi, words
from podvm_gpu.gpufacts.words import bus_id as normal_bus_id

NAME = "attested_gpus"  # the boot context's attribute and status.json's key
_COMMAND = "nvidia-smi --query-gpu=" + ",".join(smi.IDENTITY_FIELDS)


class GpuIdentity(collections.namedtuple("GpuIdentity", "index bus_id uuid ueid")):
    """One GPU as attested, immutable.

    Attributes:
        index: NVML's index (nvidia-smi's ``index``), int.
        bus_id: the PCI bus id in NVML's form (``00000000:18:00.0``).
        uuid: the GPU's UUID as nvidia-smi prints it (``GPU-3f6c...``).
        ueid: the ``ueid`` claim nvattest gave for this GPU (a long decimal number, as text),
            or None where it gave none.
    """

    __slots__ = ()

    def named(self) -> str:
        """``GPU 00000000:18:00.0 (GPU-3f6c...)``: how a reason names the device."""
        return f"GPU {self.bus_id} ({self.uuid})"

    def to_dict(self) -> dict:
        """status.json's ``attested_gpus`` item: ``{index, bus_id, uuid, ueid}``."""
        return {"index": self.index, "bus_id": self.bus_id, "uuid": self.uuid, "ueid": self.ueid}


def read(runner, when: str, root=None) -> list[GpuIdentity]:
    """The GPU set as nvidia-smi lists it now, in index order (``ueid`` None).

    Args:
        runner: the boot's runner (``run(argv, check=False)``; nvidia-smi's timeout).
        when: what the reason says of the moment (``before nvattest``).
        root: the boot's root; given, the list must hold every GPU of
            ``/proc/driver/nvidia/gpus`` (gpufacts/early_client.py, issue 46).

    Raises:
        StepFailed: nvidia-smi could not be run, failed, printed no identity for a GPU, listed
            a bus id or UUID twice (the reason quotes its answer), or listed fewer GPUs than
            the driver attached (a driver an early client re-initialised).
    """
    try:
        rows, done = ask.identities(runner)
    except CommandError as err:
        raise StepFailed(f"cannot read the GPUs' identities {when} ({one_line(str(err), 200)})"
                         ) from err
    if not rows:
        raise StepFailed(f"cannot read the GPUs' identities {when} ("
                         f"{words.failed_call(smi.identity_argv(), done.returncode, done.output)}): "
                         "the GPUs made ready must be the GPUs attested")
    found = sorted(GpuIdentity(index, normal_bus_id(bus), uuid, None)
                   for index, bus, uuid in rows)
    for field in ("index", "bus_id", "uuid"):
        values = [getattr(gpu, field) for gpu in found]
        twice = next((v for v in values if values.count(v) > 1), None)
        if twice is not None:
            raise StepFailed(f"cannot read the GPUs' identities {when}: {_COMMAND} lists "
                             f"{field} {twice} twice")
    if root is not None:
        from podvm_gpu.gpufacts.early_client import fewer_in_nvml

        fewer = fewer_in_nvml(root, [gpu.bus_id for gpu in found], f"{_COMMAND} {when}")
        if fewer:
            raise StepFailed(fewer)
    return found


def with_ueids(gpus: list[GpuIdentity], devices: list) -> list[GpuIdentity]:
    """The GPUs with the ``ueid`` of their claim: the ``gpu`` devices of the attestation record
    (steps/cc/attest/verdict.py ``device_records``), in nvattest's order, which is the index
    order; a GPU without a claim keeps None."""
    claims = [d for d in devices if isinstance(d, dict) and d.get("type") == "gpu"]
    return [gpu._replace(ueid=claims[i].get("ueid") if i < len(claims) else None)
            for i, gpu in enumerate(gpus)]


def evidence_failure(gpus: list[GpuIdentity], devices: list) -> str | None:
    """How the evidence disagrees with the GPUs read before it (module docstring), or None.

    Args:
        gpus: the GPUs read before nvattest, with their ``ueid`` (:func:`with_ueids`).
        devices: the attestation record's ``devices``.
    """
    claims = [d for d in devices if isinstance(d, dict) and d.get("type") == "gpu"]
    if len(claims) != len(gpus):
        return (f"the evidence holds {len(claims)} GPU claim(s), nvidia-smi listed {len(gpus)} "
                "GPU(s) before nvattest: a GPU without its own evidence is never made ready")
    seen: dict[str, GpuIdentity] = {}
    for gpu in gpus:
        if gpu.ueid is None:
            continue
        if gpu.ueid in seen:
            return (f"{seen[gpu.ueid].named()} and {gpu.named()} give the same ueid "
                    f"{gpu.ueid[:24]}...: the evidence does not come from two GPUs")
        seen[gpu.ueid] = gpu
    return None


def changed(before: list[GpuIdentity], after: list[GpuIdentity]) -> str | None:
    """The first difference between two reads, naming the GPU and what changed, or None.

    A GPU is matched by its bus id: ``GPU <bus> (<uuid>): UUID now <uuid>``, ``... index now
    N``, ``... is gone``, or ``GPU <bus> (<uuid>) appeared``.
    """
    now = {gpu.bus_id: gpu for gpu in after}
    for gpu in before:
        later = now.get(gpu.bus_id)
        if later is None:
            return f"{gpu.named()} is gone"
        if later.uuid != gpu.uuid:
            return f"{gpu.named()}: UUID now {later.uuid}"
        if later.index != gpu.index:
            return f"{gpu.named()}: index {gpu.index} now {later.index}"
    then = {gpu.bus_id for gpu in before}
    new = next((gpu for gpu in after if gpu.bus_id not in then), None)
    return f"{new.named()} appeared, not attested" if new is not None else None


def keep(ctx, gpus: list[GpuIdentity]) -> None:
    """The identities the verdict covers, on the boot context and in the status (:data:`NAME`)."""
    setattr(ctx, NAME, list(gpus))
    setattr(ctx.status, NAME, [gpu.to_dict() for gpu in gpus])


def confirm(ctx, before: list[GpuIdentity], state: str) -> str:
    """After an attestation that passed: the evidence against the first read, then the second
    read against the first (module docstring); keeps the identities (:func:`keep`).

    Args:
        ctx: the boot's context (its runner and status; ``status.attestation`` passed).
        before: the first read (:func:`read`, before nvattest).
        state: the ready state found (``ready``: set back to not-ready on a failure).

    Returns:
        What the step's message adds: ``; the same N GPU(s) as attested``.

    Raises:
        StepFailed: a difference (``attestation failed: ...``, naming the GPU and what changed;
            the status' ``attestation`` becomes ``failed`` with that reason), or the second read
            failed.
    """
    from podvm_gpu.steps.cc.attest.gate import _unready

    record = ctx.status.attestation
    gpus = with_ueids(before, record.get("devices") or [])
    keep(ctx, gpus)
    failure = evidence_failure(gpus, record.get("devices") or [])
    if failure is None:
        try:
            failure = changed(before, read(ctx.runner, "before the ready state", ctx.root))
        except StepFailed as err:
            failure = str(err)
        if failure is not None:
            failure = f"the GPUs changed after the attestation: {failure}"
    if failure is None:
        return f"; the same {len(gpus)} GPU{'s' if len(gpus) != 1 else ''} as attested"
    reason = f"{failure}; the GPUs made ready must be the GPUs attested"
    ctx.status.attestation = {**record, "result": "failed", "reason": one_line(reason, 600)}
    raise StepFailed(f"attestation failed: {reason}{_unready(ctx, state)}")
