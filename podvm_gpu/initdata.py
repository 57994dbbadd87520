"""Expectations a pod carries in its initdata (docs/interface.md 3.13): read only when the config
names the file (``initdata.path``; off by default: no read, no wait, nothing imported on the CPU
fast path).

cloud-api-adaptor keeps the pod's raw initdata at ``/run/peerpod/initdata`` (TOML, the CoCo
initdata format: ``version``, ``algorithm`` and a ``data`` table of file name -> content) and
its digest, bound into the TEE's evidence, in ``/run/peerpod/initdata.digest``; it ignores the
files it does not know. The agent's file is ``data."podvm-gpu.toml"``, itself TOML::

    expected_gpus = 8              # exactly this many NVIDIA GPUs on PCI (1 to 64)
    gpu_model = "H100"             # every GPU's name (status gpus[].name) contains it
    attestation_required = true    # attestation must run and pass, whatever the config says

It can only add requirements to the image's config, never remove one (``attestation_required
= false`` changes nothing). Any other key, a wrong type, or a ``podvm-gpu.toml`` that is not
TOML fails the boot naming it. The file is read as docs/interface.md 2.7 requires: bounded,
without blocking, a regular file whose last component is not a link, root's and writable by
root alone (it adds requirements to a root process). Waited for up to ``initdata.wait_s`` (cut
to the budget): cloud-api-adaptor's ``process-user-data`` writes it early in boot; absent then,
the pod carried none: no requirement, a warning.
"""

from __future__ import annotations

import os
import time

SECTION = "podvm-gpu.toml"
MAX_BYTES = 256 << 10  # initdata is a kata annotation: a few KiB in practice
KEYS = {"expected_gpus", "gpu_model", "attestation_required"}
_POLL_S = 0.1


class InitdataError(Exception):
    """The initdata cannot be used: unreadable, untrusted, malformed; the message names it."""


def parse(text: str, where: str) -> dict:
    """The requirements of an initdata document (the module docstring's schema).

    Args:
        text: the initdata file's text (TOML).
        where: the file's path, for messages.

    Returns:
        ``{"expected_gpus": int | None, "gpu_model": str | None, "attestation_required": bool,
        "section": bool}`` (``section``: the document has the agent's file).

    Raises:
        InitdataError: not TOML, ``data`` not a table, the agent's file not a TOML string or
            holding an unknown key or a wrong value.
    """
    import tomllib

    found = {"expected_gpus": None, "gpu_model": None, "attestation_required": False,
             "section": False}
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InitdataError(f"{where}: not TOML: {err}") from None
    data = doc.get("data", {})
    if not isinstance(data, dict):
        raise InitdataError(f"{where}: data must be a table of files")
    if SECTION not in data:
        return found
    name = f'{where}: data."{SECTION}"'
    if not isinstance(data[SECTION], str):
        raise InitdataError(f"{name}: must be a string holding TOML")
    try:
        section = tomllib.loads(data[SECTION])
    except tomllib.TOMLDecodeError as err:
        raise InitdataError(f"{name}: not TOML: {err}") from None
    found["section"] = True
    unknown = sorted(set(section) - KEYS)
    if unknown:
        raise InitdataError(f"{name}: {unknown[0]}: unknown key (known: {', '.join(sorted(KEYS))})")
    count = section.get("expected_gpus")
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
            raise InitdataError(f"{name}: expected_gpus: must be a whole number from 1 to 64, "
                                f"not {count!r}")
        found["expected_gpus"] = count
    model = section.get("gpu_model")
    if model is not None:
        if not isinstance(model, str) or not model.strip() or len(model) > 100:
            raise InitdataError(f"{name}: gpu_model: must be a non-empty string of at most 100 "
                                "characters")
        found["gpu_model"] = model.strip()
    required = section.get("attestation_required", False)
    if not isinstance(required, bool):
        raise InitdataError(f"{name}: attestation_required: must be true or false, not "
                            f"{required!r}")
    found["attestation_required"] = required
    return found


def read(root, path: str, wait_s: float, deadline: float) -> tuple[str | None, str | None]:
    """The initdata's text and its digest file's content (None each when absent), after
    waiting up to ``wait_s`` seconds (cut to ``deadline``, a ``time.monotonic()`` value) for the
    file to appear.

    Raises:
        InitdataError: unreadable (not a regular file, a link, too large, not UTF-8) or not
            root's alone.
    """
    from podvm_gpu.host.fs import read_bounded
    from podvm_gpu.host.wait import until

    real = root.resolve(path, follow_last=False)  # a link there is refused, not followed
    limit = max(min(wait_s, deadline - time.monotonic()), 0.0)
    if not until(lambda: os.path.lexists(real), limit, _POLL_S).held:
        return None, None
    text = _read_text(real, path, read_bounded)
    digest_path = path + ".digest"
    digest = None
    digest_real = root.resolve(digest_path, follow_last=False)
    if os.path.lexists(digest_real):
        digest = " ".join(_read_text(digest_real, digest_path, read_bounded).split())[:200]
    return text, digest or None


def _read_text(real: str, path: str, read_bounded) -> str:
    from podvm_gpu.config.load import untrusted_because

    try:
        raw = read_bounded(real, MAX_BYTES)
    except OSError as err:
        raise InitdataError(f"{path}: cannot read: {err.strerror or err}") from None
    why = untrusted_because(real)
    if why:
        raise InitdataError(f"{path}: not trusted: {why}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InitdataError(f"{path}: not UTF-8 text") from None


def apply(run, settings, gpus: list, step=None, wait_for=None) -> str | None:
    """Read the initdata the config names and hold the GPUs found against it; the failure
    reason (without the ``initdata: `` prefix), or None. Records ``status.initdata``.

    Args:
        run: the boot run (its status, status file, root and start).
        settings: the validated config (``initdata.path`` set).
        gpus: the GPUs detect found.
        step: the running ``initdata`` step, or None: its message says what the boot waits
            for while it waits (written to the status first), then what was read.
        wait_for: called with the initdata's ``expected_gpus`` when fewer GPUs are on PCI
            (the boot's late-GPU wait, issue 37: a pod that says how many GPUs it gets waits
            for them as ``detect.expected_gpus`` does); returns the GPUs found afterwards.
    """
    from podvm_gpu.model import StepResult

    cfg = settings.initdata
    deadline = run.started + settings.budget_s
    record = {"path": cfg.path, "digest": None, "section": False, "expected_gpus": None,
              "gpu_model": None, "attestation_required": False}
    run.status.initdata = record
    limit = max(min(cfg.wait_s, deadline - time.monotonic()), 0.0)
    cut = f" (initdata.wait_s {cfg.wait_s:g} s, cut to what the boot budget has left)" \
        if limit < cfg.wait_s else ""
    started = time.monotonic()
    if step is not None:
        step.message = f"waiting up to {limit:.2f} s for the pod's initdata {cfg.path}{cut}"
        try:
            run.status_file.write(run.status)
        except OSError:
            pass  # the status was written a moment ago; the final write reports a failure
    try:
        text, digest = read(run.root, cfg.path, cfg.wait_s, deadline)
        record["digest"] = digest
        waited = time.monotonic() - started
        if text is None:
            said = f"{cfg.path} not there after {waited:.2f} s{cut}"
            run.status.warnings.append(f"initdata: {said}: the pod carried none, no requirement "
                                       "added")
            if step is not None:
                step.result, step.message = StepResult.SKIPPED, f"{said}: no requirement added"
            return None
        record.update(parse(text, cfg.path))
        if step is not None:
            step.message = f"read {cfg.path} after {waited:.2f} s"
    except InitdataError as err:
        return str(err)
    return _hold(record, gpus, wait_for, cfg.path)


def _hold(record: dict, gpus: list, wait_for, path: str) -> str | None:
    """Hold the GPUs on PCI (``gpus``, after ``wait_for`` when fewer than the initdata's
    ``expected_gpus``) against ``record``'s ``expected_gpus`` and ``gpu_model`` (a case-blind
    part of each GPU's name); the failure reason, or None. ``path``: the initdata file."""
    count, model = record["expected_gpus"], record["gpu_model"]
    if count is not None and len(gpus) < count and wait_for is not None:
        gpus = wait_for(count)
    if count is not None and len(gpus) != count:
        return (f'the pod\'s initdata ({path}, data."{SECTION}") expects {count} GPU(s), '
                f"{len(gpus)} on PCI")
    if model is not None and not gpus:
        # a pod that names the GPU model it needs, on a VM with none, fails as one that counts
        # its GPUs does (issue 35 item 19); attestation_required alone has nothing to attest
        return (f'the pod\'s initdata ({path}, data."{SECTION}") expects GPU model '
                f"{model!r}; no NVIDIA GPU on PCI")
    if model is not None:
        wrong = [g for g in gpus if model.lower() not in (g.name or "").lower()]
        if wrong:
            return (f'the pod\'s initdata ({path}, data."{SECTION}") expects GPU model '
                    f"{model!r}; {wrong[0].pci_address} is {wrong[0].name!r}")
    return None
