"""The nvidia-smi back end's readers (issue 44): each runs one query of gpufacts/smi.py and
gives its answer parsed (the fabric's state and health, the cliques of a full ``-q``, MIG, the
GPUs' identities, the VBIOS versions, the confidential-computing answers), so that no step,
check row or watcher poll runs a gpufacts command line or parses its text itself
(tests/test_layout.py holds it). The memory health queries are read in gpufacts/health.py.

Every call is bounded: ``timeout`` in seconds where given, else the runner's own nvidia-smi
timeout (host/proc.py); a call that cannot run raises the runner's ``CommandError`` unless a
reader says otherwise.
"""

from __future__ import annotations

from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.gpufacts import health, smi, words


def fabric_rows(runner, timeout: float | None = None):
    """One :func:`~podvm_gpu.gpufacts.smi.fabric_argv` call, its exit status not checked.

    Returns:
        ``(states, done)``: the rows as :class:`~podvm_gpu.gpufacts.smi.FabricState` (None
        when the call failed or printed no such rows) and the finished call (``returncode``,
        ``stdout``, ``output``: for the words of a failure).

    Raises:
        CommandError: nvidia-smi could not be run or timed out.
    """
    done = runner.run(smi.fabric_argv(), check=False, timeout=timeout)
    return (smi.parse_fabric_rows(done.stdout) if done.returncode == 0 else None), done


def fabric_states(runner, timeout: float | None = None) -> list[smi.FabricState]:
    """Every GPU's fabric state (one :func:`~podvm_gpu.gpufacts.smi.fabric_argv` call, its exit
    status checked): the boot's fabric query.

    Raises:
        CommandError: nvidia-smi failed (its exit status, what it printed: the caller reads
            "No devices were found" and words.NVSMI_BROKEN from it), timed out, or printed
            no rows.
    """
    argv = smi.fabric_argv()
    out = runner.run(argv, timeout=timeout).stdout
    states = smi.parse_fabric_rows(out)
    if states is None:
        raise CommandError(argv, 0, out, message=f"nvidia-smi fabric query printed no rows: "
                           f"{' '.join(out.split())[:160] or 'nothing'}")
    return states


def fabric_query_said(done) -> str:
    """What a fabric query that gave no rows said: its exit status by NVML meaning, its words."""
    return words.failed_call(smi.fabric_argv(), done.returncode, done.output, 200)


def _fabric_answer(runner, argv: list[str], parse, timeout: float):
    """``(parsed, None)``, or ``(None, why)`` with why ``""`` for a field this nvidia-smi does
    not offer.

    Raises:
        StepFailed: nvidia-smi says the driver or a GPU cannot answer (words.NVSMI_BROKEN).
    """
    try:
        parsed, why = health.ask(runner, argv, 0, timeout, parse)
    except health.Broken as err:
        raise StepFailed(f"fabric health: {err}") from None
    if parsed is not None:
        return parsed, None
    return None, "" if words.NOT_A_FIELD in why else why


def fabric_health(runner, timeout: float) -> tuple[list[tuple[str, str]] | None, str | None]:
    """580's fabric health summary per GPU (:func:`~podvm_gpu.gpufacts.smi.fabric_health_argv`):
    ``([(bus id, summary)], None)``, or ``(None, why)``, why ``""`` when this nvidia-smi does
    not offer the field (535-555 refuse it).

    Raises:
        StepFailed: nvidia-smi says the driver or a GPU cannot answer (words.NVSMI_BROKEN).
    """
    return _fabric_answer(runner, smi.fabric_health_argv(), smi.parse_fabric_health, timeout)


def fabric_detail(runner, timeout: float) -> tuple[dict[str, dict[str, str]] | None, str | None]:
    """580's detail of the fabric health (:func:`~podvm_gpu.gpufacts.smi.fabric_detail_argv`):
    ``(bus id -> {field -> value}, None)``, or ``(None, why)`` as :func:`fabric_health`.

    Raises:
        StepFailed: as :func:`fabric_health`.
    """
    return _fabric_answer(runner, smi.fabric_detail_argv(), smi.parse_fabric_detail, timeout)


def cliques(runner, timeout: float) -> list[dict]:
    """Each GPU's clique id and cluster UUID from a full ``nvidia-smi -q``
    (:func:`~podvm_gpu.gpufacts.smi.parse_cliques`; empty where this nvidia-smi prints none).

    Raises:
        CommandError: nvidia-smi failed, could not be run or timed out.
    """
    return smi.parse_cliques(runner.run(smi.full_query_argv(), timeout=timeout).stdout)


def mig_enabled(runner, timeout: float) -> list[str]:
    """The indexes of the GPUs in MIG mode (:func:`~podvm_gpu.gpufacts.smi.mig_mode_argv`).

    Raises:
        CommandError: nvidia-smi failed, could not be run or timed out.
    """
    return smi.mig_enabled(runner.run(smi.mig_mode_argv(), timeout=timeout).stdout)


def mig_instances(runner, timeout: float):
    """``nvidia-smi mig -lgi`` (:func:`~podvm_gpu.gpufacts.smi.mig_list_argv`), its exit status
    not checked: the finished call (``returncode``, ``output``), read for "No GPU instances
    found" by the caller.

    Raises:
        CommandError: nvidia-smi could not be run or timed out.
    """
    return runner.run(smi.mig_list_argv(), check=False, timeout=timeout)


def identities(runner):
    """The GPUs' ``(index, bus id, UUID)`` rows (:func:`~podvm_gpu.gpufacts.smi.identity_argv`,
    :func:`~podvm_gpu.gpufacts.smi.parse_identities`).

    Returns:
        ``(rows, done)``: the rows (None when the call failed or a row is not an identity) and
        the finished call, for the words of a failure.

    Raises:
        CommandError: nvidia-smi could not be run or timed out.
    """
    done = runner.run(smi.identity_argv(), check=False)
    return (smi.parse_identities(done.output) if done.returncode == 0 else None), done


def vbios_versions(runner, timeout: float) -> list[str]:
    """The GPUs' VBIOS versions, sorted, each once (:func:`~podvm_gpu.gpufacts.smi.vbios_argv`);
    empty when the query failed.

    Raises:
        CommandError: nvidia-smi could not be run or timed out.
    """
    done = runner.run(smi.vbios_argv(), check=False, timeout=timeout)
    found = sorted({line.strip() for line in done.stdout.splitlines() if line.strip()})
    return found if done.returncode == 0 else []


def conf_compute(runner, *args: str):
    """``nvidia-smi conf-compute <args>`` (:func:`~podvm_gpu.gpufacts.smi.conf_compute_argv`),
    its exit status not checked: the finished call (``returncode``, ``output``), read by
    :func:`cc_value` or :func:`ready_state`.

    Raises:
        CommandError: nvidia-smi could not be run or timed out.
    """
    return runner.run(smi.conf_compute_argv(*args), check=False)


def cc_value(query: str, text: str):
    """The value of an answered ``nvidia-smi conf-compute <query>`` (``-f``: ``on``/``off``,
    ``-d``: True/False, ``-e``: the environment, ``-mgm``: the multi-GPU mode) by its parser
    in gpufacts/smi.py; None when the text holds none."""
    return {"-f": smi.parse_cc_mode, "-d": smi.parse_devtools, "-e": smi.parse_environment,
            "-mgm": smi.parse_multi_gpu}[query](text)


def ready_state(runner):
    """The GPUs' CC ready state (``nvidia-smi conf-compute -grs``).

    Returns:
        ``(state, done)``: ``ready``, ``not-ready``, another value as printed, or None (a
        failed call or no such line: :func:`~podvm_gpu.gpufacts.smi.parse_ready_state`), and
        the finished call, for the words of a failure.

    Raises:
        CommandError: nvidia-smi could not be run or timed out.
    """
    done = conf_compute(runner, "-grs")
    return smi.parse_ready_state(done.output, done.returncode), done
