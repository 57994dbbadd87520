"""The VM's NVLink fabric kind, from PCI, and the fabric manager's configuration for it.

Three kinds (docs/design.md, "Fabrics"; NVIDIA/nvrc ``src/mode.rs`` decides the same from PCI):

- ``none``: no NVSwitch function and no NVLink management port. The fabricmanager step probes
  the GPUs' fabric state all the same (shared-NVSwitch virtualization: managed outside the VM).
- ``nvswitch``: NVSwitches are PCI functions of the VM (NVIDIA vendor, class ``0x0680``: HGX
  A100/H100/H200): nv-fabricmanager drives them (the path before issue 16).
- ``nvlink5``: no NVSwitch function, but ConnectX bridge functions (vendor ``0x15b3``) whose
  VPD carries ``SW_MNG`` (host/infiniband.py): HGX B200/B300, where NVLSM (the NVLink subnet
  manager) must run on one of those ports before the fabric manager (podvm_gpu/steps/fabric/nvl5.py).

- ``nvlink-rack`` (issue 28): no NVSwitch function and no management port, and GPUs of a
  rack-scale NVLink system (:data:`RACK_GPU_IDS`: GB200 NVL72 compute trays). The tray has no
  NVSwitch of its own; the rack's NVLink switch trays and their fabric manager run the fabric,
  so the agent never starts one here (AgentBaker#8839: one started on a compute tray breaks
  provisioning) and waits for the fabric as for ``none``. What tells such a VM from an H100 VM
  behind shared NVSwitches, where the fabric is managed outside the VM too and PCI looks the
  same (no NVSwitch, no port): the GPUs' PCI device id. A Grace-Blackwell GPU is rack-scale
  (``nvlink-rack``); a Hopper one is shared-NVSwitch (``none``). After the fabric completes, the
  step reads each GPU's clique id and cluster UUID from full ``nvidia-smi -q`` (550 and later
  print them; 535 does not, and no ``--query-gpu`` field has them): a cluster UUID of all zeros
  means the GPU is in no multi-node NVLink domain.

Both NVSwitch functions and management ports on one VM is ``mixed``: NVRC panics on it
("unexpected topology"), and the agent fails the fabricmanager step naming both.

Detection runs on the GPU path only, never on the CPU fast path (boot/pipeline.py calls it
before the steps): a VM without a ``0x15b3`` function pays one ``vendor`` read per PCI function;
with some, their VPD is read, bounded in size and time (host/infiniband.py). A function without
``vpd`` (an mlx5 VF, Azure's and AWS's accelerated-networking NICs), one whose VPD has no marker,
and one whose VPD is malformed or unreadable are never management ports, and never fail a boot:
they are named in the kind's ``why`` only.
"""

from __future__ import annotations

import collections
import time

from podvm_gpu.host import infiniband

NONE, NVSWITCH, NVLINK5, MIXED, RACK = "none", "nvswitch", "nvlink5", "mixed", "nvlink-rack"
KINDS = (NONE, NVSWITCH, NVLINK5, MIXED, RACK)
# The GPUs of rack-scale NVLink systems, by PCI device id (pci_ids.py): GB200 (NVL72, NVL36x2).
# GB300 belongs here too once its device id is confirmed from the PCI ID Repository.
RACK_GPU_IDS = {"2941": "GB200"}
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
VPD_TIME_LIMIT_S = 2.0  # every VPD read of a boot together

# fabricmanager.cfg keys the role needs (NVRC src/daemon.rs configure_fabricmanager; the FM user
# guide, "Fabric Manager Operating Mode" and "Partition Rail Policy"): FABRIC_MODE 0 is bare
# metal or full pass-through, the VM owns its NVSwitches; PARTITION_RAIL_POLICY greedy for
# NVLink 4, symmetric for NVLink 5 (which CC on Blackwell requires, NVRC's note).
RAIL_POLICY = {NVSWITCH: "greedy", NVLINK5: "symmetric"}
STOCK_FM_CONFIG = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
RUN_FM_CONFIG = "/run/podvm-gpu/fabricmanager.cfg"


class Fabric:
    """The fabric kind found on PCI and why.

    Attributes:
        kind: one of :data:`KINDS`.
        nvswitches: the NVSwitch functions' PCI addresses.
        ports: the management ports (:class:`~podvm_gpu.host.infiniband.Vpd` with ``sw_mng``).
        others: the other ``0x15b3`` functions, with what their VPD said.
        port: the IB device chosen for NVLSM (name), once the NVL5 path found it; ``guid`` its
            port GUID.
        steps: the NVL5 path's sub-steps as status.json's ``fabric.steps`` holds them.
    """

    def __init__(self, kind: str, nvswitches: list[str], ports: list, others: list):
        self.kind, self.nvswitches, self.ports, self.others = kind, nvswitches, ports, others
        self.port: str | None = None
        self.guid: str | None = None
        self.steps: list[dict] = []
        self.rack_gpus: list[str] = []  # "<address> (GB200)" of the rack-scale GPUs
        self.cliques: list[dict] = []  # nvlink-rack: [{"gpu", "clique_id", "cluster_uuid"}]
        self.health: list[dict] = []  # 580's fabric health per GPU (steps/fabric/parse.py)

    @property
    def port_addresses(self) -> list[str]:
        return [p.address for p in self.ports]

    def why(self) -> str:
        """One phrase: what made the kind."""
        parts = []
        if self.nvswitches:
            parts.append(f"{len(self.nvswitches)} NVSwitch function(s) ({_few(self.nvswitches)})")
        if self.ports:
            parts.append(f"{len(self.ports)} ConnectX NVLink management port(s) "
                         f"({_few([p.describe() for p in self.ports])})")
        if not parts:
            parts.append("no NVSwitch function and no ConnectX function whose VPD carries SW_MNG")
        if self.kind == RACK:
            parts.append(f"{len(self.rack_gpus)} rack-scale GPU(s) ({_few(self.rack_gpus)}): a "
                         "compute tray whose NVLink fabric the rack manages")
        if self.others:
            parts.append(f"not management ports: {_few([o.describe() for o in self.others])}")
        return "; ".join(parts)

    def record(self, name: str, result: str, message: str, duration_s: float) -> None:
        """Add (or replace) a sub-step of the NVL5 path for status.json."""
        self.steps = [s for s in self.steps if s["name"] != name]
        self.steps.append({"name": name, "result": result, "message": message,
                           "duration_s": round(duration_s, 6)})

    def to_dict(self) -> dict:
        """status.json's ``fabric`` object (docs/interface.md section 4.1)."""
        out = {"kind": self.kind, "why": self.why(), "management_ports": self.port_addresses,
               "port": self.port, "port_guid": self.guid, "steps": list(self.steps)}
        if self.kind == RACK:
            out["cliques"] = list(self.cliques)
        if self.health:
            out["health"] = list(self.health)
        return out


def _few(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (", ..." if len(items) > most else "")


# (NVSwitch functions on PCI, NVLink management ports on PCI) -> the kind
_KIND_OF = {(True, True): MIXED, (True, False): NVSWITCH, (False, True): NVLINK5,
            (False, False): NONE}


def detect(nvswitches: list[str], sys_pci: str = infiniband.PCI_DEVICES,
           limit_s: float = VPD_TIME_LIMIT_S, gpus=()) -> Fabric:
    """The fabric kind of a VM with GPUs (never call it on the CPU fast path).

    Args:
        nvswitches: the NVSwitch functions' addresses (detect's).
        sys_pci: the sysfs PCI device folder (never under ``--root``).
        limit_s: the time limit of the VPD reads together.
        gpus: the GPUs (``model.PciDevice``: ``pci_address``, ``device_id``), for
            ``nvlink-rack``.
    """
    mellanox = infiniband.mellanox_functions(sys_pci)
    vpds = infiniband.read_vpds(mellanox, limit_s, sys_pci) if mellanox else []
    ports = [v for v in vpds if v.state == "sw_mng"]
    others = [v for v in vpds if v.state != "sw_mng"]
    kind = _KIND_OF[bool(nvswitches), bool(ports)]
    rack = [f"{g.pci_address} ({RACK_GPU_IDS[g.device_id.lower().removeprefix('0x')]})"
            for g in gpus if g.device_id.lower().removeprefix("0x") in RACK_GPU_IDS]
    if kind == NONE and rack:
        kind = RACK
    fabric = Fabric(kind, list(nvswitches), ports, others)
    fabric.rack_gpus = rack
    return fabric


def kind_of(fabric: Fabric | None, nvswitches: list) -> str:
    """The fabric kind to act on: the one detected (the boot's, check's reading of PCI), or,
    where none was (a plan or a context built without detection), ``nvswitch`` when PCI has
    NVSwitch functions, else ``none``. The one fallback of the fabricmanager step."""
    if fabric is not None:
        return fabric.kind
    return NVSWITCH if nvswitches else NONE


def set_keys(text: str, keys: dict[str, str]) -> str:
    """``KEY=value`` lines of a fabricmanager.cfg with ``keys`` set: an existing line (not a
    comment) is replaced in place, a missing key appended (NVRC src/config.rs
    update_config_file does the same); ``FABRIC_MODE_RESTART`` is not ``FABRIC_MODE``."""
    lines = text.splitlines()
    done = set()
    for i, line in enumerate(lines):
        name = line.strip().split("=", 1)[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and name in keys:
            lines[i] = f"{name}={keys[name]}"
            done.add(name)
    lines += [f"{k}={v}" for k, v in keys.items() if k not in done]
    return "\n".join(lines) + "\n"


def fm_keys(kind: str) -> dict[str, str]:
    """The keys the VM's role needs: full pass-through, the rail policy of the NVLink
    generation."""
    return {"FABRIC_MODE": "0", "PARTITION_RAIL_POLICY": RAIL_POLICY.get(kind, "greedy")}


# --- the modules step's part (steps/modules/step.py calls these) ----------------------------

NVLINK_DISABLE = "NVreg_NvLinkDisable"


def module_parameters(ctx) -> tuple[dict, str]:
    """The modules' parameters and a note for the message: with exactly one GPU and no fabric
    (one GPU of a multi-GPU board), ``NVreg_NvLinkDisable=1`` is added to nvidia's, so the
    driver does not train links that lead nowhere (NVIDIA/nvrc src/modprobe.rs adds it when
    exactly one NVIDIA GPU is on PCI; the parameter is the driver's own, documented by its
    README's module parameters). ``modules.parameters.nvidia.NVreg_NvLinkDisable`` wins."""
    params = dict(ctx.config.modules.parameters)
    fabric = getattr(ctx, "fabric", None)
    if ctx.gpu_count != 1 or (fabric is not None and fabric.kind != "none"):
        return params, ""
    nvidia = dict(params.get("nvidia", {}))
    if NVLINK_DISABLE in nvidia:
        return params, f"{NVLINK_DISABLE}={nvidia[NVLINK_DISABLE]} as configured"
    nvidia[NVLINK_DISABLE] = 1
    params["nvidia"] = nvidia
    return params, (f"{NVLINK_DISABLE}=1: one GPU and no NVLink fabric (modules.parameters "
                    f"overrides it)")


def ib_modules(ctx) -> tuple[str, ...]:
    """The IB modules the NVLink 5 path needs (``nvlink5.ib_modules``), on such a VM only
    (the modules step loads them; ``ctx`` a BootContext)."""
    fabric = getattr(ctx, "fabric", None)
    return tuple(ctx.config.nvlink5.ib_modules) if fabric is not None and \
        fabric.kind == "nvlink5" else ()


def ib_context(ctx, module: str) -> str:
    """The words before an IB module's failure: which management ports need it."""
    if module not in ib_modules(ctx):
        return ""
    return (f"NVLink 5 management ports ({', '.join(ctx.fabric.port_addresses)}) need IB "
            f"module {module}: ")


def record_ib(ctx, module: str | None, result: str, message: str,
               since: float) -> None:
    """Record the modules step's IB part in ``fabric.steps`` (status.json)."""
    if module is not None and module not in ib_modules(ctx):
        return
    ctx.fabric.record("ib-modules", result, message, time.monotonic() - since)


def rack_cliques(ctx, fabric: Fabric) -> str:
    """Each GPU's clique id and cluster UUID from a full ``nvidia-smi -q`` (550+), kept in
    ``fabric.cliques`` for status.json; one phrase for the step's message. A query not answered
    or a 535 nvidia-smi (no such lines) is said, never a failure: the fabric is already ready."""
    from podvm_gpu.errors import CommandError
    from podvm_gpu.gpufacts import ask

    try:
        fabric.cliques = ask.cliques(ctx.runner, ctx.harmless_timeout("nvidia-smi"))
    except CommandError as err:
        return f"clique and cluster UUID not read ({err})"
    if not fabric.cliques:
        return "clique and cluster UUID not printed by this nvidia-smi (550 and later print them)"
    pairs = collections.Counter((c["clique_id"], c["cluster_uuid"]) for c in fabric.cliques)
    return "; ".join(f"clique {q}, cluster UUID {u} on {n} GPU(s)" + (
        " (all zeros: no multi-node NVLink)" if u == ZERO_UUID else "")
        for (q, u), n in pairs.items())
