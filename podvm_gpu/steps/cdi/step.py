"""Step 9, ``cdi``: generate the CDI spec, validate it, install it atomically.

``nvidia-ctk cdi generate --format=json`` writes the spec on stdout: no ``--output`` at all
(issue 42; an output name without an extension would get ``.yaml`` appended, making a temporary
name in ``/var/run/cdi`` a file CDI readers scan, and an empty ``--output=`` is parsed
differently by each release: 1.19.1 refuses it, ``flag needs an argument: --output=``, and
1.18.2 takes the next argv word as the output path; ../shared/nvidia-ctk/README.md, the real
builds). JSON because the standard library reads it at once where PyYAML costs its import on
every GPU boot; JSON is YAML, so the CDI readers take it from ``nvidia.yaml`` as it is, and a
YAML answer is read too. The spec's content decides (contract section 8), not nvidia-ctk's exit
code or its warnings: it prints many harmless ones, and exits 0 when it leaves out the uvm nodes
or names a missing hook. Boot owns kind ``nvidia.com/gpu`` in ``/var/run/cdi``: another file
there that defines it would make kata-agent drop every device both define, so it is renamed
aside.

The step is in two parts (boot/pipeline.py): :func:`run` generates and validates, beside the fabric wait and the
confidential-computing step; :func:`finish` installs, only once they have all succeeded. With
``imex.channels`` set, the IMEX channels' nodes and spec (steps/cdi/imex.py) are made in the
first part and the spec installed in the second, before the GPUs'.
"""

from __future__ import annotations

import os

from podvm_gpu import cdi, nvidia_ctk, readers
from podvm_gpu.cdi import MAX_SPEC_BYTES
from podvm_gpu.cdi import SPEC_PATH as CDI_SPEC_PATH
from podvm_gpu.cdi.parse import parse_spec
from podvm_gpu.cdi.ready import check_ready_spec
from podvm_gpu.cdi.unavailable import UNAVAILABLE_DEVICE
from podvm_gpu.errors import CdiSpecError, CommandError, StepFailed, exit_text, one_line
from podvm_gpu.gpufacts import ask, smi, words
from podvm_gpu.gpufacts.finding import REPLACE, RESET
from podvm_gpu.host.fs import atomic_write, ensure_dir, read_bounded, unread
from podvm_gpu.row import FAIL, NO_GPU, PASS, SKIP, WARN, Check
from podvm_gpu.steps.cdi import imex, toolkit, toolkit_image
from podvm_gpu.steps.context import BootContext

# nvidia-ctk's warnings that can explain a failed generate: the driver libraries and device
# nodes every spec needs, NVML and the CDI hook. (It warns about dozens of graphics files on
# every run; those explain nothing.)
ESSENTIAL = r"libcuda\.so|libnvidia-ml\.so|/dev/nvidia|nvidia-cdi-hook|NVML|nvml"


# nvidia-smi's exit status for NVML_ERROR_NOT_FOUND: what `mig -lgi` exits with, printing "No GPU
# instances found", on a GPU in MIG mode without instances (field case C11).
NOT_FOUND_RC = words.NVSMI_NOT_FOUND_RC


def mig_problem(ctx: BootContext) -> str | None:
    """Why generation may fail on MIG: MIG mode enabled on a GPU with no GPU instances.

    Only a diagnosis after generation failed: each query gets at most the harmless-call time,
    and "no GPU instances" is said only when ``mig -lgi`` says so (its text or its not-found
    exit status), never because it failed some other way.
    """
    timeout = ctx.harmless_timeout("nvidia-smi")
    try:
        enabled = ask.mig_enabled(ctx.runner, timeout)
    except CommandError:
        return None
    if not enabled:
        return None
    gpus = one_line(", ".join(enabled), 100)
    try:
        listing = ask.mig_instances(ctx.runner, timeout)
    except CommandError as err:
        return f"MIG mode is enabled on GPU {gpus} (nvidia-smi mig -lgi: {err})"
    said = words.ended(listing.returncode, listing.output, 200)
    if "no gpu instances" in listing.output.lower() or listing.returncode == NOT_FOUND_RC:
        return (f"MIG mode is enabled on GPU {gpus} but no GPU instances exist (nvidia-smi mig "
                f"-lgi {said}); create GPU instances or disable MIG mode")
    if listing.returncode != 0:
        return f"MIG mode is enabled on GPU {gpus}; its GPU instances cannot be listed " \
               f"(nvidia-smi mig -lgi {said})"
    return None


class Generated:
    """A generated spec that passed validation: its text (as nvidia-ctk wrote it) and model."""

    def __init__(self, text: str, spec):
        self.text, self.spec = text, spec
        self.health = ""  # what the health gate read (podvm_gpu/steps/cdi/health.py), for the step's message
        self.imex = None  # the IMEX spec (steps/cdi/imex.py), None when imex is off


def run(ctx: BootContext) -> Generated:
    """Generate and validate the spec while the health gate (podvm_gpu/steps/cdi/health.py: a spec must
    mean a usable GPU) reads the GPUs: two independent NVML clients, both after persistenced, so
    the gate's queries cost the boot no time beyond the generation's. The gate starts once
    ``nvidia-ctk cdi generate`` is in flight: the generation is the boot's longest lane, and the
    gate's process starts would otherwise delay its own (issue 38); so does the ask of the hook
    binary's list (steps/cdi/toolkit.py ``start_hook_asks``). Nothing is written but
    the IMEX channel nodes (steps/cdi/imex.py), when ``imex.channels`` asks for them.

    Raises:
        StepFailed: nvidia-ctk failed or timed out (its last error, the driver version, and the
            MIG state when that is the cause), the spec breaks a rule of contract section 8, or
            the health gate read a GPU that needs replacing or a reset (the generation's
            failure is named first when both fail), or the IMEX channels or their spec failed
            (``imex: ...``). A generation that never started (nvidia-ctk missing, a feature
            its version lacks) fails before the gate reads anything.
    """
    from podvm_gpu.host.proc import Background
    from podvm_gpu.steps.cdi import health

    reader = Background(lambda: health.gate(ctx), "step-cdi-health", start=False)
    try:
        generated = generate(ctx, on_start=reader.start)
    finally:
        # the generation's end (or failure) is the step's; the gate is bounded by its own
        # timeouts, and a stop of the boot cancels its calls as it cancels every call
        reader.outcome()
    generated.health = reader.result()  # what the gate raised is raised here, in the step's thread
    return generated


def generate(ctx: BootContext, on_start=None) -> Generated:
    """Read nvidia-ctk's version and refuse what it lacks, generate and validate the spec, check
    each hook the spec names against its hook binary's own list (and, before 1.18.0, its
    refusal by name: steps/cdi/toolkit.py ``check_hooks``); ``on_start`` is called once the
    generation is in flight (:meth:`Runner.run`), when the hook binary's asks start too
    (toolkit.py ``start_hook_asks``)."""
    driver = ctx.driver_version or "unknown"
    ctk = toolkit.read_version(ctx)
    toolkit.check_features(ctx, ctk)

    def in_flight() -> None:  # the generation started: what runs beside it starts now
        if on_start is not None:
            on_start()
        toolkit.start_hook_asks(ctx, ctk)

    try:
        argv = nvidia_ctk.generate_nvml_argv(ctx.root, ctx.config.cdi.disable_hooks)
        done = ctx.runner.run(argv, on_start=in_flight)
    except CommandError as err:
        if err.timed_out:
            raise StepFailed(f"nvidia-ctk cdi generate timed out after {err.timeout_s:g} s "
                             f"(driver {driver})") from err
        if err.held_open:
            raise StepFailed(f"{err} (driver {driver})") from err
        if err.returncode is None:  # missing, not executable, or refused to start
            raise StepFailed(f"{err.tool_message()} (driver {driver})") from err
        cause = f"nvidia-ctk cdi generate failed ({exit_text(err.returncode)}): " \
                f"{err.tool_message()} (driver {driver})"
        hints = err.warnings_about(ESSENTIAL)
        if hints:
            cause += "; it warned: " + "; ".join(hints[:2])
        if err.returncode == 127 and "undefined symbol" in err.stderr:
            cause += "; this nvidia-ctk needs a newer driver than the image has"
        if "empty device edits" in err.stdout + err.stderr:
            # talos#14015: NVML enumerated fewer GPUs than PCI has (none for the "all" device);
            # the tool's words are the symptom, the count is the cause
            seen = ctx.nvml_seen
            count = f"NVML sees {len(seen)} of the {ctx.gpu_count} GPU(s) on PCI" \
                if seen is not None else f"NVML enumerated no GPU of the {ctx.gpu_count} on PCI"
            raise StepFailed(f"{count} (nvidia-ctk cdi generate: empty device edits); "
                             f"{cause}") from err
        mig = mig_problem(ctx)
        raise StepFailed(f"{mig}; {cause}" if mig else cause) from err
    text = done.stdout
    try:
        spec = parse_spec(text, source="nvidia-ctk cdi generate")
    except CdiSpecError as err:
        raise StepFailed(f"the generated spec is invalid: {err}") from err
    problems = check_ready_spec(spec, ctx.root, ctx.minors, ctx.driver_version)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise StepFailed("the generated spec is not usable: " + "; ".join(problems[:3]) + more)
    toolkit.check_hooks(ctx, spec, ctk)
    generated = Generated(text, spec)
    generated.imex = imex.generate(ctx)
    return generated


def finish(ctx: BootContext, generated: Generated) -> str:
    """Rename other specs of the kind aside, install the spec atomically, record it.

    Raises:
        StepFailed: the spec cannot be written.
    """
    text, spec = generated.text, generated.spec
    for warning in cdi.disable_duplicates(ctx.root):
        ctx.warn(warning)
    imex_done = imex.install(ctx, generated.imex)  # before the GPUs' spec makes the VM usable
    try:
        target = ctx.root.resolve(CDI_SPEC_PATH, follow_last=False)
        ensure_dir(os.path.dirname(target))
        atomic_write(target, text)
    except OSError as err:
        raise StepFailed(f"cannot install {CDI_SPEC_PATH}: {err.strerror or err}") from err
    names = spec.device_names()
    ctx.status.cdi = {"path": CDI_SPEC_PATH, "kind": spec.kind, "devices": names,
                      "cdi_version": spec.cdi_version}
    done = f"{CDI_SPEC_PATH}: {len(names)} devices (cdiVersion {spec.cdi_version})"
    if imex_done:
        done = f"{done}; {imex_done}"
    return f"{done}; {generated.health}" if generated.health else done


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the spec's generation, then the health gate's queries."""

    return [nvidia_ctk.VERSION_ARGV, nvidia_ctk.generate_nvml_argv(ctx.root, ctx.config.cdi.disable_hooks),
            *imex.plan(ctx), smi.remap_argv(), smi.ecc_argv(), smi.reset_argv(), smi.action_argv()]


# --- podvm-gpu check ----------------------------------------------------------------------

def cdi_spec_row(facts) -> Check:
    try:  # bounded, never waited on: a FIFO there is named, as spec_kind reads the folder
        text = read_bounded(facts.root.resolve(CDI_SPEC_PATH), MAX_SPEC_BYTES).decode(
            "utf-8", errors="replace")
    except OSError as err:
        if not isinstance(err, FileNotFoundError):
            return Check("cdi-spec", FAIL, unread(CDI_SPEC_PATH, err),
                         "run podvm-gpu boot: it replaces the file")
        if not facts.gpus:
            return Check("cdi-spec", SKIP, f"{NO_GPU}; no {CDI_SPEC_PATH}",
                         "" if not facts.config.unavailable_spec else
                         "boot writes the unavailable spec: has it run?")
        return Check("cdi-spec", FAIL, f"{CDI_SPEC_PATH} is missing",
                     "run podvm-gpu boot, or see podvm-gpu status")
    try:
        spec = parse_spec(text, source=CDI_SPEC_PATH)
    except CdiSpecError as err:
        return Check("cdi-spec", FAIL, str(err), "run podvm-gpu boot to regenerate it")
    names = spec.device_names()
    if names == [UNAVAILABLE_DEVICE]:
        if not facts.gpus:
            return Check("cdi-spec", SKIP, f"{NO_GPU}; {CDI_SPEC_PATH} is the unavailable "
                         "spec, so GPU requests fail at once")
        return Check("cdi-spec", FAIL, f"{CDI_SPEC_PATH} is the unavailable spec: GPU setup "
                     "failed", "see the status check and podvm-gpu status")
    if not facts.gpus:  # issue 47: the GPUs it was written for left PCI (hot-removed, Xid 79)
        return Check("cdi-spec", FAIL, f"{CDI_SPEC_PATH} is a ready spec naming {len(names)} "
                     "device(s), none of which is on PCI", "see the pci check: replace the VM")
    problems = check_ready_spec(spec, facts.root, facts.minors,
                                readers.kernel_module_version(facts.root))
    if problems:
        return Check("cdi-spec", FAIL, "; ".join(problems[:3]),
                     "run podvm-gpu boot to regenerate it")
    return Check("cdi-spec", PASS, f"{CDI_SPEC_PATH}: cdiVersion {spec.cdi_version}, "
                 f"{len(names)} devices, nodes and hooks present")


def cdi_duplicates_row(facts) -> Check:
    found = [(facts.root.host_path(p), problem)
             for folder in (cdi.RUN_DIR, cdi.ETC_DIR)
             for p, problem in cdi.other_specs(facts.root, folder)]
    defining = [p for p, problem in found if not problem]
    unread = [(p, problem) for p, problem in found if problem]
    if defining:
        more = "".join(f"; {p} could not be read ({problem})" for p, problem in unread)
        return Check("cdi-duplicates", FAIL, f"also defining nvidia.com/gpu: "
                     f"{', '.join(defining)}{more}",
                     f"remove {', '.join(defining[:3])}: each defines the same devices, and "
                     "kata-agent drops every device two specs define")
    if unread:
        what = "; ".join(f"{p} could not be read ({problem})" for p, problem in unread)
        return Check("cdi-duplicates", FAIL, f"{what}: whether it defines nvidia.com/gpu is "
                     "unknown", f"look at {unread[0][0]}: kata-agent would drop every device "
                     "it defines too; remove it if it is a spec of nvidia.com/gpu")
    return Check("cdi-duplicates", PASS, "no other spec defines nvidia.com/gpu")


def row_remapper_row(facts) -> Check:
    """The row remapper of each GPU, judged as the health gate judges it (gpufacts/health.py):
    one bounded query; a failure fails, a pending remap fails unless
    ``health.reset_pending_warns``, an unanswered query warns."""
    from podvm_gpu.gpufacts import health

    return _memory_row(facts, "row-remapper", health.read_remapper, smi.remap_argv,
                       "; the remap takes effect then",
                       lambda read: "no row remapper (before Ampere): " + "; ".join(
                           f.what for f in read),
                       replace="replace the GPU (ask the provider for another host): its memory "
                       "cannot be repaired")


def memory_errors_row(facts) -> Check:
    """Each GPU's volatile uncorrectable ECC count and pending page retirement, judged as the
    health gate judges them (gpufacts/health.py ``judge_ecc``; issue 33: boot read them, check
    did not show them): one bounded query; a count above 0 or a retirement pending fails with
    "GPU reset needed" unless ``health.reset_pending_warns`` (then warns); an unanswered query
    warns; a lost GPU or a driver that cannot answer fails."""
    from podvm_gpu.gpufacts import health

    return _memory_row(facts, "memory-errors", health.read_ecc, smi.ecc_argv,
                       "; the retirement takes effect and the volatile count "
                       "starts again then", lambda read: "no ECC counters (N/A on every GPU: ECC "
                       "off, or GPUs without it): " + ", ".join(f.gpu for f in read))


def _memory_row(facts, name: str, read, argv, then: str, none_said,
                replace: str | None = None) -> Check:
    """One memory-health row of check's: the query asked and judged by ``read``
    (gpufacts/health.py ``read_remapper`` or ``read_ecc``; ``argv``, the function of its
    command line in gpufacts/smi.py, gives the by-hand hint only). A lost GPU or a driver that
    cannot answer fails; a finding that asks for a replacement fails with ``replace`` (when
    given), one that asks for a reset fails or warns with the reset sentence and ``then``; a
    query or a value not read warns; ``skip`` when every GPU answered N/A (``none_said(read
    findings)``), else ``pass``."""
    from podvm_gpu.gpufacts import health
    from podvm_gpu.steps.cdi import recovery

    ended, timeout = recovery.health_row_start(facts, name)
    if ended:
        return ended
    hand = "run " + " ".join(argv()).replace(",noheader", "") + " by hand"
    try:
        found, why = read(facts.runner, timeout, facts.config.health.reset_pending_warns)
    except health.Broken as err:
        return Check(name, FAIL, str(err), "reboot the VM; if the GPU stays lost, ask the "
                     "provider for another host")
    if found is None:
        return Check(name, WARN, f"not read ({why}); the boot does not fail on it", hand)
    if replace and any(f.action == REPLACE for f in found):
        return Check(name, FAIL, "; ".join(f.what for f in _bad(found)), replace)
    ended = _reset_row(facts, name, found, then)
    if ended:
        return ended
    if any(f.kind == "unread-value" for f in found):
        return Check(name, WARN, "; ".join(health.said(found, "unread-value")) +
                     ": not read as a value", hand)
    read = [f for f in found if f.kind in health.READ]
    if all(f.kind == "not-offered" for f in read):
        return Check(name, SKIP, none_said(read))
    return Check(name, PASS, "; ".join(f.what for f in read))


def _bad(found) -> list:
    """The findings that fail or ask for a reset: those that ask for a replacement first."""
    return [f for f in found if f.action == REPLACE] + [f for f in found if f.action == RESET]


def _reset_row(facts, name: str, found, then: str) -> Check | None:
    """The row for findings that fail or ask for a reset (gpufacts/judge.py's reset sentence,
    in check's guest: ``facts.confidential`` True, False or None), or None without any."""
    from podvm_gpu.gpufacts import judge

    bad = _bad(found)
    if not bad:
        return None
    warns = not any(f.fatal for f in bad)
    return Check(name, WARN if warns else FAIL, "; ".join(f.what for f in bad) + (
        " (a warning: health.reset_pending_warns)" if warns else ""),
        judge.reset_advice([f.gpu for f in bad if f.gpu],
                           getattr(facts, "confidential", None)) + then)


def recovery_action_row(facts) -> Check:
    """The GPUs' reset status and recovery action (steps/cdi/recovery.py, issue 28)."""
    from podvm_gpu.steps.cdi import recovery

    return recovery.check_row(facts)


# The remapper first: the health gate runs before the spec is installed.
VM_ROWS = {"row-remapper": row_remapper_row, "memory-errors": memory_errors_row,
           "recovery-action": recovery_action_row,
           "cdi-spec": cdi_spec_row,
           "cdi-duplicates": cdi_duplicates_row, **imex.VM_ROWS}

# check --image: the toolkit's binaries and their versions (issue 36)
IMAGE_ROWS = {"toolkit": toolkit_image.image_row}
