"""The nvidia-smi back end's facts per GPU, for the tests (issue 44 item 1: the package has one
reader per fact, the one boot, check and the watcher run; this per-GPU view of the same queries,
as gpufacts/facts.py's value types, serves only the tests that hold the two back ends to the
same facts and the exporter's verdicts to the boot's: tests/test_real_nvidia_smi.py,
tests/test_gpufacts.py, tests/test_real_580.py, tests/test_flood.py). It was
podvm_gpu/gpufacts/smi.py's ``smi_facts``, called by nothing in the package; so was
:func:`parse_fabric`, the ``Fabric`` blocks of a full ``nvidia-smi -q`` (the agent reads the
fabric with ``--query-gpu``), kept for the tests of ``-q`` texts."""

from __future__ import annotations

import re

from podvm_gpu.gpufacts.smi import (
    ACTION_FIELDS,
    ECC_FIELDS,
    FABRIC_FIELDS,
    FABRIC_HEALTH_FIELDS,
    REMAP_FIELDS,
    FabricState,
    action_argv,
    ecc_argv,
    fabric_argv,
    fabric_health_argv,
    flag,
    parse_fabric_health,
    parse_fabric_rows,
    remap_argv,
)
from podvm_gpu.gpufacts.words import GPU_LOST, GPU_REQUIRES_RESET, csv_rows, na


def _answer(runner, argv: list[str], width: int, timeout: float, parse=None):
    """``(rows, None)`` or ``(None, Read)`` saying why the query gave no value."""
    from podvm_gpu.errors import CommandError
    from podvm_gpu.gpufacts.facts import unread
    from podvm_gpu.gpufacts.words import NOT_A_FIELD, failed_call

    try:
        done = runner.run(argv, check=False, timeout=timeout)
    except CommandError as err:
        return None, unread(str(err))
    if done.returncode != 0 and NOT_A_FIELD in done.output:
        return None, unread("not offered by this nvidia-smi")
    rows = (parse(done.stdout) if parse else csv_rows(done.stdout, width)) \
        if done.returncode == 0 else None
    if rows is None:
        return None, unread(failed_call(argv, done.returncode, done.output))
    return rows, None


def smi_facts(runner, timeout: float) -> dict:
    """NVML's bus id -> :class:`~podvm_gpu.gpufacts.facts.GpuFacts` of every GPU the queries
    list: the row remapper, the volatile ECC count and pending retirement, the recovery action,
    the fabric state and 580's health summary, each query bounded by ``timeout`` seconds. A value
    a query did not give says why (the failed call's words, ``not offered by this nvidia-smi``,
    ``N/A``); a GPU printed ``[GPU is lost]`` is ``lost``. An exit status that says no answer
    can come (words.NVSMI_BROKEN: a GPU lost at its handle, no driver) leaves the query's values
    unread with its words: the boot's step and check's rows fail on it (steps/cdi/health.py).

    Args:
        runner: what runs a command (``run(argv, check=False, timeout=)``, host/proc.py's).
    """
    from podvm_gpu.gpufacts.facts import gpu_facts, read, unread
    from podvm_gpu.gpufacts.words import bus_id

    found: dict[str, dict] = {}

    def put(bus: str, **values) -> None:
        found.setdefault(bus_id(bus), {}).update(values)

    def value(text: str, convert):
        if text.strip() == GPU_LOST:
            return None
        if text.strip() == GPU_REQUIRES_RESET:
            return unread(GPU_REQUIRES_RESET)
        if na(text):
            return unread("N/A")
        converted = convert(text)
        return unread(f"{text.strip()!r} not understood") if converted is None else read(converted)

    def number(text: str):
        return int(text) if text.strip().isdigit() else None

    queries = {"remap": (remap_argv(), REMAP_FIELDS), "ecc": (ecc_argv(), ECC_FIELDS),
               "action": (action_argv(), ACTION_FIELDS), "fabric": (fabric_argv(), FABRIC_FIELDS),
               "summary": (fabric_health_argv(), FABRIC_HEALTH_FIELDS)}
    parsers = {"fabric": parse_fabric_rows, "summary": parse_fabric_health,
               "action": lambda text: [[r[0], ", ".join(r[1:])] for r in (
                   csv_rows(text, 2) or csv_rows(text, 3) or [])] or None}
    answers = {name: _answer(runner, argv, len(fields), timeout, parsers.get(name))
               for name, (argv, fields) in queries.items()}
    rows, _ = answers["remap"]
    for bus, pending, failure in rows or []:
        if GPU_LOST in (pending, failure):
            put(bus, lost=read(True))
            continue
        put(bus, remap_pending=value(pending, flag), remap_failure=value(failure, flag))
    rows, _ = answers["ecc"]
    for bus, volatile, retired in rows or []:
        if GPU_LOST not in (volatile, retired):
            put(bus, ecc_volatile=value(volatile, number), retired_pending=value(retired, flag))
    rows, _ = answers["action"]
    for bus, action in rows or []:
        if action != GPU_LOST:
            put(bus, recovery_action=value(action, _action_value))
    for name in ("remap", "ecc", "action"):  # in any column: the recovery action GPU Reset
        for row in answers[name][0] or []:
            if GPU_REQUIRES_RESET in (v.strip() for v in row[1:]):
                put(row[0], recovery_action=read(_action_value(GPU_REQUIRES_RESET)))
    for state in answers["fabric"][0] or []:
        if not state.lost:
            put(state.gpu, fabric_state=read(state.state) if state.supported else unread("N/A"),
                fabric_success=read(state.success) if state.supported else unread("N/A"))
    rows, _ = answers["summary"]
    for bus, summary in rows or []:
        if summary != GPU_LOST:
            put(bus, fabric_summary=value(summary, str.strip))
    out = {}
    for bus, values in found.items():
        for name, answer in answers.items():
            if answer[1] is not None:
                for field in _FIELDS_OF[name]:
                    values.setdefault(field, answer[1])
        out[bus] = gpu_facts(bus, **values)
    return out


_FIELDS_OF = {"remap": ("remap_pending", "remap_failure"), "ecc": ("ecc_volatile", "retired_pending"),
              "action": ("recovery_action",), "fabric": ("fabric_state", "fabric_success"),
              "summary": ("fabric_summary",)}


def _action_value(text: str):
    """NVML's number of the action nvidia-smi's words name (judge.action_of), else the words."""
    from podvm_gpu.gpufacts.judge import action_of

    action = action_of(text)
    return action.number if action is not None else text.strip()


def parse_fabric(text: str) -> list[FabricState]:
    """The ``Fabric`` block of each GPU in ``nvidia-smi -q`` output, by labels.

    A GPU block starts at ``GPU <pci>``; inside it, the ``State`` and ``Status`` lines after a
    ``Fabric`` heading (indented deeper than it) are read. GPUs without a Fabric block are left out.
    """
    result: list[FabricState] = []
    gpu = None
    fabric_indent = None
    state = status = None

    def flush():
        nonlocal state, status
        if gpu is not None and state is not None:
            result.append(FabricState(gpu, state, status or "N/A"))
        state = status = None

    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        m = re.match(r"^GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", stripped)
        if m and indent == 0:
            flush()
            gpu, fabric_indent = m.group(1), None
            continue
        if stripped == "Fabric":
            fabric_indent = indent
            continue
        if fabric_indent is not None:
            if indent <= fabric_indent and stripped:
                fabric_indent = None
                continue
            key, sep, value = stripped.partition(":")
            if sep and key.strip() == "State" and state is None:
                state = value.strip()
            elif sep and key.strip() == "Status" and status is None:
                status = value.strip()
    flush()
    return result
