"""The nvidia-smi back end: every nvidia-smi command line the agent runs, and the parsers of
their answers (issue 33). ``boot --dry-run`` names these command lines (docs/interface.md 1.5);
boot and check run them (nvidia-smi's calls are killable: an NVML call in process is not).

Each query asks only fields every build in reach knows, or is a query of its own: a field the
installed nvidia-smi refuses aborts its whole query (``Field "x" is not a valid field to query.``,
exit 2; ../shared/nvidia-smi-real.md, tests/data/real/h200-580). What each build says:

- fabric (:func:`fabric_argv`): every build, 535 to 580; values labelled (``state  Completed``,
  two spaces; ``status Success``), ``[N/A]`` unlabelled without a fabric, ``N/A`` on 580. The
  health summary (:func:`fabric_health_argv`) is a query of its own: 580's ``--help-query-gpu``
  lists ``fabric.health.summary``, the Debian builds (535-555) refuse it; its detail
  (:func:`fabric_detail_argv`: bandwidth, route recovery, route unhealthy, access-timeout recovery,
  incorrect configuration, partition assigned) is another, asked only where the summary was read.
- memory (:func:`remap_argv`, :func:`ecc_argv`): every build; ``remapped_rows.*`` are ``1``/``0``
  on 535-555, ``Yes``/``No`` on 580.
- reset status (:func:`reset_argv`): 535-555 take it; 580 refuses it (NVML deprecated the fields
  in 570 for the recovery action). Recovery action (:func:`action_argv`): 580 answers ``None``;
  535-555 refuse it.
- MIG (:func:`mig_mode_argv`, :func:`mig_list_argv`), CC (:func:`conf_compute_argv`), and the
  full ``-q`` (:func:`full_query_argv`: the clique and cluster of NVLink 5, 550 and later).
"""

from __future__ import annotations

import collections
import re

from podvm_gpu.gpufacts import judge
from podvm_gpu.gpufacts.words import GPU_LOST, csv_rows, csv_value, ended, na

CSV = "--format=csv,noheader"
FABRIC_FIELDS = ("pci.bus_id", "fabric.state", "fabric.status")
FABRIC_HEALTH_FIELDS = ("pci.bus_id", "fabric.health.summary")
# 580's health detail (its --help-query-gpu; values never captured: judge.HEALTH_DETAIL reads them)
FABRIC_DETAIL_FIELDS = ("pci.bus_id", "fabric.health.bandwidth",
                        "fabric.health.route_recovery_in_progress", "fabric.health.route_unhealthy",
                        "fabric.health.access_timeout_recovery",
                        "fabric.health.incorrect_configuration", "fabric.health.partition_assigned")
REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")
ECC_FIELDS = ("pci.bus_id", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
RESET_FIELDS = ("pci.bus_id", "reset_status.reset_required",
                "reset_status.drain_and_reset_recommended")
ACTION_FIELDS = ("pci.bus_id", "gpu_recovery_action")
MIG_FIELDS = ("index", "mig.mode.current")
# issue 45: the GPUs' identities, read before nvattest and again before -srs 1 (every build,
# 535 to 580, answers these three fields: ../shared/nvidia-smi-real.md)
IDENTITY_FIELDS = ("index", "pci.bus_id", "uuid")


def query_gpu_argv(fields: tuple[str, ...]) -> list[str]:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader``; ``fields`` a non-empty tuple
    of nvidia-smi's query names.

    Raises:
        ValueError: no field (an empty ``--query-gpu=`` is a word each program's parser reads
            its own way; the agent never writes one, issue 42).
    """
    if not fields:
        raise ValueError("query_gpu_argv: no field to query")
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", CSV]


def fabric_argv() -> list[str]:
    """The fabric query every real nvidia-smi has (535 to 580)."""
    return query_gpu_argv(FABRIC_FIELDS)


def fabric_health_argv() -> list[str]:
    """``nvidia-smi --query-gpu=pci.bus_id,fabric.health.summary --format=csv,noheader``: 580's
    field, refused by 535-555 (then "not offered", never a warning)."""
    return query_gpu_argv(FABRIC_HEALTH_FIELDS)


def fabric_detail_argv() -> list[str]:
    """``nvidia-smi --query-gpu=pci.bus_id,fabric.health.bandwidth,... --format=csv,noheader``
    (:data:`FABRIC_DETAIL_FIELDS`): 580's detail of the health summary, asked only where the
    summary was read; a build that refuses a field refuses the query (then "not offered")."""
    return query_gpu_argv(FABRIC_DETAIL_FIELDS)


def remap_argv() -> list[str]:
    """``nvidia-smi --query-remapped-rows=<REMAP_FIELDS> --format=csv,noheader``."""
    return ["nvidia-smi", f"--query-remapped-rows={','.join(REMAP_FIELDS)}", CSV]


def ecc_argv() -> list[str]:
    """``nvidia-smi --query-gpu=<ECC_FIELDS> --format=csv,noheader``."""
    return query_gpu_argv(ECC_FIELDS)


def reset_argv() -> list[str]:
    """``nvidia-smi --query-gpu=<RESET_FIELDS> --format=csv,noheader``."""
    return query_gpu_argv(RESET_FIELDS)


def action_argv() -> list[str]:
    """``nvidia-smi --query-gpu=<ACTION_FIELDS> --format=csv,noheader``."""
    return query_gpu_argv(ACTION_FIELDS)


def vbios_argv() -> list[str]:
    """``nvidia-smi --query-gpu=vbios_version --format=csv,noheader``: the VBIOS an NVAT 104
    (RIM not found) names, nvattest's JSON carrying no claims then (steps/cc/attest/gate.py)."""
    return query_gpu_argv(("vbios_version",))


def identity_argv() -> list[str]:
    """``nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader``: the GPU set
    the confidential-computing step reads before nvattest and again right before ``-srs 1``
    (steps/cc/identity.py, issue 45)."""
    return query_gpu_argv(IDENTITY_FIELDS)


def parse_identities(text: str) -> list[tuple[int, str, str]] | None:
    """``(index, bus id, UUID)`` per row of :func:`identity_argv`'s answer, in its order; the
    bus id as printed (``00000000:18:00.0``), the UUID as printed (``GPU-...``). None when a
    row is not three fields, an index is not a number, or a value is missing (``[N/A]``, an
    error text such as ``GPU is lost``): an identity is never guessed."""
    rows = csv_rows(text or "", len(IDENTITY_FIELDS))
    if rows is None:
        return None
    found = []
    for index, bus, uuid in rows:
        if not index.isdigit() or any(na(v) or v.startswith("[") or " " in v
                                      for v in (bus, uuid)):  # [GPU is lost], [N/A], ...
            return None
        found.append((int(index), bus, uuid))
    return found


def mig_mode_argv() -> list[str]:
    """``nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader``."""
    return query_gpu_argv(MIG_FIELDS)


def mig_list_argv() -> list[str]:
    """``nvidia-smi mig -lgi``: the GPU instances."""
    return ["nvidia-smi", "mig", "-lgi"]


def full_query_argv() -> list[str]:
    """``nvidia-smi -q``: everything, read by labels (the clique and cluster of NVLink 5)."""
    return ["nvidia-smi", "-q"]


def conf_compute_argv(*args: str) -> list[str]:
    """``nvidia-smi conf-compute <args>`` (``-f``, ``-d``, ``-e``, ``-mgm``, ``-grs``; ``-srs
    1``/``-srs 0``, the only setting the agent makes, in the confidential-computing step)."""
    return ["nvidia-smi", "conf-compute", *args]


def ready_state_off(runner) -> str | None:
    """``nvidia-smi conf-compute -srs 0``: the confidential GPUs' ready state set back to
    not-ready (system-wide), once: a lost GPU makes it exit 15, which is said, not retried
    (the attestation gate's failed attestation, and the GPUs taken away in a confidential
    guest: podvm_gpu/ending.py).

    Args:
        runner: a :class:`~podvm_gpu.host.proc.Runner`.

    Returns:
        None when it was set; else the one wording of what happened, ``nvidia-smi conf-compute
        -srs 0: exit 15 (GPU is lost): <what it printed>`` (or ``...: not run (<why>)``).
    """
    from podvm_gpu.errors import CommandError, one_line

    try:
        done = runner.run(conf_compute_argv("-srs", "0"), check=False)
    except CommandError as err:
        return f"nvidia-smi conf-compute -srs 0: not run ({one_line(err, 200)})"
    if done.returncode == 0:
        return None
    return f"nvidia-smi conf-compute -srs 0: {ended(done.returncode, done.output)}"


# --- parsers -------------------------------------------------------------------------------

class FabricState(collections.namedtuple("FabricState", "gpu state status")):
    """One GPU's NVLink fabric state: the GPU's PCI address, its fabric state and status as
    text (``Completed``/``Success``), from :func:`fabric_argv`'s rows (:func:`parse_fabric_rows`)
    or, in the tests, a full ``nvidia-smi -q`` (tests/smi_facts.py ``parse_fabric``). A GPU lost
    after NVML took its handle has ``GPU is lost`` in all three."""

    __slots__ = ()

    @property
    def lost(self) -> bool:
        return self.state == GPU_LOST[1:-1]

    @property
    def supported(self) -> bool:
        return not na(self.state) and self.state.strip().lower() != "unknown"

    @property
    def completed(self) -> bool:
        return self.state.strip().lower() == "completed"

    @property
    def success(self) -> bool:
        return self.completed and self.status.strip().lower() == "success"


def parse_cliques(text: str) -> list[dict]:
    """``[{"gpu", "clique_id", "cluster_uuid"}]`` from the ``Fabric`` block of each GPU in a full
    ``nvidia-smi -q`` (550 and later: ``CliqueId``, ``ClusterUUID``; ../shared/nvidia-smi-real.md);
    GPUs whose block lacks them (535) or says ``N/A`` are left out."""
    out, gpu, inside = [], None, False
    for line in text.splitlines():
        m = re.match(r"^GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", line)
        if m:
            gpu, inside = m.group(1), False
            continue
        stripped = line.strip()
        if stripped == "Fabric":
            inside = True
            out.append({"gpu": gpu, "clique_id": None, "cluster_uuid": None})
            continue
        if not inside or gpu is None or ":" not in stripped:
            continue
        key, _sep, value = (p.strip() for p in stripped.partition(":"))
        if key == "CliqueId" and value.isdigit():
            out[-1]["clique_id"] = int(value)
        elif key == "ClusterUUID" and re.fullmatch(r"[0-9a-fA-F-]{36}", value):
            out[-1]["cluster_uuid"] = value.lower()
    return [c for c in out if c["clique_id"] is not None and c["cluster_uuid"] is not None]


def parse_fabric_rows(text: str) -> list[FabricState] | None:
    """One :class:`FabricState` per row of :func:`fabric_argv`'s answer (one row per GPU NVML
    lists, in its order), labels removed (``state  In Progress`` -> ``In Progress``; ``[N/A]``
    without a fabric -> ``N/A``); None when the text is not such an answer."""
    rows = csv_rows(text, len(FABRIC_FIELDS))
    if rows is None:
        return None
    return [FabricState(csv_value(bus), csv_value(state, "state"), csv_value(status, "status"))
            for bus, state, status in rows]


def parse_fabric_health(text: str) -> list[tuple[str, str]] | None:
    """``(bus id, summary)`` per row of :func:`fabric_health_argv`'s answer (a ``summary``
    label, should a build print one as it does for the state, removed; ``[N/A]`` -> ``N/A``);
    None when the text is not such an answer."""
    rows = csv_rows(text, len(FABRIC_HEALTH_FIELDS))
    if rows is None:
        return None
    return [(csv_value(bus), csv_value(summary, "summary")) for bus, summary in rows]


def parse_fabric_detail(text: str) -> dict[str, dict[str, str]] | None:
    """bus id -> {field without ``fabric.health.`` -> value as printed} per row of
    :func:`fabric_detail_argv`'s answer (``[N/A]`` -> ``N/A``); None when the text is not such
    an answer."""
    rows = csv_rows(text, len(FABRIC_DETAIL_FIELDS))
    if rows is None:
        return None
    return {csv_value(row[0]): {f.removeprefix("fabric.health."): csv_value(v)
                                for f, v in zip(FABRIC_DETAIL_FIELDS[1:], row[1:])} for row in rows}


# --- conf-compute (the CC step's answers; classified in steps/cc/classify.py) -----------------

def parse_cc_mode(text: str, returncode: int | None = 0) -> str | None:
    """``on``/``off`` from ``conf-compute -f`` (``CC status: ON``); another value is returned
    lowercased as it is (never read as off); None when the label is missing, or when
    ``returncode`` (nvidia-smi's exit status, when the caller has it) is not 0: a failed query
    is never read as a value (550 and 555 exit with NVML's code; 535 prints ``CC status: OFF``
    with exit 0 when the query fails: steps/cc/classify.py ``CcAnswers.off_unproven``)."""
    if returncode not in (0, None):
        return None
    m = re.search(r"CC status\s*:\s*(\S+)", text or "", re.I)
    return m.group(1).lower() if m else None


def parse_devtools(text: str) -> bool | None:
    """True/False from ``conf-compute -d`` (``DevTools Mode: ON|OFF``); None otherwise."""
    m = re.search(r"DevTools Mode\s*:\s*(\S+)", text or "", re.I)
    value = m.group(1).upper() if m else None
    return {"ON": True, "OFF": False}.get(value or "")


def parse_environment(text: str) -> str | None:
    """``UNAVAILABLE``, ``INTERNAL`` or ``PRODUCTION`` from ``conf-compute -e``; another word
    as printed, upper-cased; None when the label is missing."""
    m = re.search(r"CC Environment\s*:\s*(\S+)", text or "", re.I)
    return m.group(1).upper() if m else None


def parse_multi_gpu(text: str) -> str | None:
    """judge.MGM_NONE or judge.MGM_PPCIE from ``conf-compute -mgm`` (``Multi-GPU Mode:
    None|Protected PCIe``); another value lowercased as printed; None without the label."""
    m = re.search(r"Multi-GPU Mode\s*:\s*(.+?)\s*$", text or "", re.I | re.M)
    if not m:
        return None
    value = m.group(1).lower()
    return {"none": judge.MGM_NONE, "protected pcie": judge.MGM_PPCIE}.get(value, value)


def parse_ready_state(text: str, returncode: int | None = 0) -> str | None:
    """``ready``/``not-ready`` from ``conf-compute -grs`` (the real program prints the line
    between blank lines); the negative is matched first, since "not-ready" contains "ready";
    another value is returned as it is; None without the label or when ``returncode`` is given
    and not 0 (never a value from a failed query)."""
    if returncode not in (0, None):
        return None
    m = re.search(r"Ready state\s*:\s*(.+)$", text or "", re.I | re.M)
    if not m:
        return None
    value = m.group(1).strip().lower()
    if re.fullmatch(r"not[\s_-]?ready", value):
        return "not-ready"
    if value == "ready":
        return "ready"
    return value


def smi_unrecognized_option(text: str) -> str | None:
    """The option an installed nvidia-smi does not offer, from ``Option "-mgm" is not
    recognized.`` (its usage error, exit 2), or None."""
    m = re.search(r'Option "(-[^"\s]+)" is not recognized', text or "")
    return m.group(1) if m else None


def summarize(states: list[FabricState]) -> str:
    """``State X, Status Y on N GPU(s)`` for each distinct pair."""
    pairs = collections.Counter((s.state, s.status) for s in states)
    return "; ".join(f"State {a}, Status {b} on {n} GPU(s)" for (a, b), n in pairs.items())


def mig_enabled(text: str) -> list[str]:
    """The indexes of the GPUs :func:`mig_mode_argv`'s answer lists with MIG ``Enabled``."""
    return [ln.split(",")[0].strip() for ln in text.splitlines()
            if "," in ln and ln.split(",", 1)[1].strip().lower() == "enabled"]


def flag(value: str) -> bool | None:
    """``1``/``Yes``/``True`` -> True, ``0``/``No``/``False`` -> False (a count above 1 is
    True), any case; None otherwise (N/A, an error text)."""
    word = value.strip().lower()
    if word in ("yes", "no", "true", "false"):
        return word in ("yes", "true")
    return int(word) > 0 if word.isdigit() else None
