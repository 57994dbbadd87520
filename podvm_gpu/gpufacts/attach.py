"""How long nvidia-persistenced's GPU attach may take, whether it fits the boot, and its marks
in the kernel log (issue 46 item 1; docs/interface.md 3.4, "Attach budget").

The per-GPU rate follows the slowest architecture present (:data:`RATES_S`; pci_ids.py gives the
architecture): Blackwell guests with more than 3 GPUs attach about 34 s per GPU, each GPU logging
one ``NVRM: GPU<n> kbifCacheVFInfo_GB100: Unable to read NV_PF0_INITIAL_AND_TOTAL_VFS`` line
(kata-containers#13270; fixed in kata by NVRC v0.1.7, kata-containers PR #13835; one such line
for GPU0 at 7 s is harmless, NVIDIA/nvrc#159). An NVIDIA id pci_ids.py does not list takes the
slowest known rate. An explicit ``persistenced.per_gpu_s`` wins over the table.

Those lines are the attach marks: each is progress (the wait goes on while marks keep coming,
:class:`AttachMarks`), and status.json's ``attach`` records the interval between them per GPU
instance.
"""

from __future__ import annotations

import re

from podvm_gpu.errors import StepFailed
from podvm_gpu.pci_ids import architecture

#: architecture -> seconds a GPU of it takes to attach, where it is slower than
#: :data:`DEFAULT_RATE_S`: Blackwell 35 s (34 s measured between marks, kata-containers#13270).
RATES_S: dict[str, float] = {"Blackwell": 35.0}
#: every other known architecture (Hopper and older): 15 s, the rate before issue 46 (case C18:
#: 8-GPU machines needing about 150 s with the 30 s base).
DEFAULT_RATE_S = 15.0
#: the slowest known rate, which an NVIDIA id pci_ids.py does not list takes.
SLOWEST_RATE_S = max([DEFAULT_RATE_S, *RATES_S.values()])
#: cloud-api-adaptor's default wait for the pod VM, seconds (systemd/podvm-gpu.service's comment).
CLOUD_API_ADAPTOR_WAIT_S = 300.0

# "NVRM: GPU3 kbifCacheVFInfo_GB100: Unable to read NV_PF0_INITIAL_AND_TOTAL_VFS"
# (kata-containers#13270): the GPU instance and the function, whatever the chip's suffix
ATTACH_MARK = re.compile(r"NVRM: (GPU\d+) (kbifCacheVFInfo\w*)")


def architecture_rate(device_id: str) -> tuple[float, str]:
    """The attach rate of one GPU, seconds, and its architecture's name.

    Args:
        device_id: the PCI device id (4 hex digits, any case, with or without ``0x``).

    Returns:
        ``(seconds, name)``: :data:`RATES_S`'s rate or :data:`DEFAULT_RATE_S` for a listed id;
        :data:`SLOWEST_RATE_S` and ``"unknown"`` for an id pci_ids.py does not list.
    """
    arch = architecture(device_id)
    if arch is None:
        return SLOWEST_RATE_S, "unknown"
    return RATES_S.get(arch, DEFAULT_RATE_S), arch


class Rate:
    """The per-GPU rate of one boot's persistenced wait and where it came from.

    Attributes:
        per_gpu_s: seconds a GPU; gpus: the GPU count; explicit: ``persistenced.per_gpu_s`` set it.
        source: what set it, for messages: ``persistenced.per_gpu_s``, the architecture
            (``Blackwell``), ``unknown NVIDIA id 10de:2fff: the slowest known rate``.
    """

    __slots__ = ("per_gpu_s", "gpus", "explicit", "source")

    def __init__(self, per_gpu_s: float, gpus: int, explicit: bool, source: str):
        self.per_gpu_s, self.gpus, self.explicit, self.source = per_gpu_s, gpus, explicit, source

    @property
    def attach_s(self) -> float:
        """The expected attach time: ``per_gpu_s x gpus`` seconds."""
        return self.per_gpu_s * self.gpus


def rate_for(gpus: list, configured: float | None) -> Rate:
    """The per-GPU rate for these GPUs.

    Args:
        gpus: the detected GPUs (anything with ``device_id`` and ``name``: model.PciDevice).
        configured: ``persistenced.per_gpu_s``, or None (unset: by architecture).

    Returns:
        :class:`Rate`: the configured value when set, else the slowest of the GPUs'
        architectures (an unlisted id: the slowest known); :data:`DEFAULT_RATE_S` with no GPU.
    """
    if configured is not None:
        return Rate(configured, len(gpus), True, "persistenced.per_gpu_s")
    worst, why = DEFAULT_RATE_S, "no GPU"
    for did in sorted({gpu.device_id.lower().removeprefix("0x") for gpu in gpus}):
        seconds, arch = architecture_rate(did)
        if seconds > worst or why == "no GPU":
            why = (f"unknown NVIDIA id 10de:{did}: the slowest known rate" if arch == "unknown"
                   else arch)
            worst = seconds
    return Rate(worst, len(gpus), False, why)


def gpu_words(gpus: list) -> str:
    """The GPUs for a message: ``8 x B300 (10de:3182)``, kinds joined by ``, ``."""
    counts: dict[str, int] = {}
    for gpu in gpus:
        did = gpu.device_id.lower().removeprefix("0x")
        label = f"{gpu.name} (10de:{did})" if gpu.name != f"10de:{did}" else f"10de:{did}"
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n} x {label}" for label, n in sorted(counts.items()))


def fits(rate: Rate, left_s: float) -> int:
    """How many GPUs at ``rate.per_gpu_s`` fit in ``left_s`` (all of them for a rate of 0)."""
    if rate.per_gpu_s <= 0:
        return rate.gpus
    return max(int(left_s // rate.per_gpu_s), 0)


def check_fits(rate: Rate, gpus: list, left_s: float, budget_s: float) -> None:
    """Fail at once when the expected attach (``rate.attach_s``) is longer than the budget left.

    The wait could only time out, after spending the budget: the reason says so now, before the
    daemon starts (docs/interface.md 3.4, "Attach budget"). Only a rate above
    :data:`DEFAULT_RATE_S` is held to this (Blackwell's, an unknown id's, an explicit slower
    one): 15 s a GPU is an upper bound from field reports (8 GPUs in about 150 s with the base),
    not an attach time, and such a wait stays as it was before issue 46 (cut to the budget; the
    field cases C19 and C43 scale the budget down below it).

    Args:
        rate: this boot's rate (:func:`rate_for`); gpus: the detected GPUs (for the message).
        left_s: seconds left in the boot budget; budget_s: the configured ``budget_s``.

    Raises:
        StepFailed: ``8 x B300 (10de:3182) attach at 35 s per GPU (Blackwell): 280 s expected,
            more than the 238 s left of budget_s 240 s (6 such GPUs fit) ...`` and the settings
            to raise: budget_s to what leaves the attach its time (rounded up to 10 s),
            TimeoutStartSec 30 s above it, cloud-api-adaptor's pod-VM timeout above that.
    """
    if rate.per_gpu_s <= DEFAULT_RATE_S or rate.attach_s <= left_s:
        return
    # the budget that would leave the attach its time, rounded up to 10 s
    need = -(-(budget_s - left_s + rate.attach_s) // 10) * 10
    n = fits(rate, left_s)
    raise StepFailed(
        f"{gpu_words(gpus)} attach at {rate.per_gpu_s:g} s per GPU ({rate.source}): "
        f"{rate.attach_s:g} s expected, more than the {max(left_s, 0):.0f} s left of budget_s "
        f"{budget_s:g} s ({n} such GPU{'' if n == 1 else 's'} fit{'s' if n == 1 else ''}); not waiting for an "
        f"attach that cannot finish: raise cloud-api-adaptor's pod-VM timeout "
        f"({CLOUD_API_ADAPTOR_WAIT_S:g} s by default) above budget_s, budget_s to at least "
        f"{need:g} s and podvm-gpu.service's TimeoutStartSec to budget_s + 30 s, or set "
        "persistenced.per_gpu_s where this stack attaches faster")


def attach_marks(records: list[tuple[int, str, int | None]]) -> list[tuple[str, int | None]]:
    """The attach marks of the kernel log, oldest first: ``(GPU instance, usec)`` per
    :data:`ATTACH_MARK` record (``usec`` the record's kernel time, None without one)."""
    marks = []
    for _level, message, usec in records:
        if "kbifCacheVFInfo" not in message:
            continue
        m = ATTACH_MARK.search(message)
        if m:
            marks.append((m.group(1), usec))
    return marks


class AttachMarks:
    """The attach marks of one boot's kernel log, and status.json's ``attach`` record.

    Args:
        rate: this boot's rate (:class:`Rate`).
        records: the kernel log's records when the wait begins (``kmsg.read_timed_records``):
            marks already there (GPU0's harmless early line, nvrc#159; a rerun's) are kept in
            the record but are no progress.

    Attributes:
        marks: ``(GPU instance, usec)`` of every mark so far, oldest first.
        last_progress: ``time.monotonic()`` when the last new mark was seen, or None.
    """

    def __init__(self, rate: Rate, records=()):
        self.rate = rate
        self.marks: list[tuple[str, int | None]] = attach_marks(records)
        self.last_progress: float | None = None

    def update(self, records, now: float) -> bool:
        """Take the kernel log's records as of ``now`` (``time.monotonic()``); True when a new
        mark came (progress)."""
        marks = attach_marks(records)
        if len(marks) <= len(self.marks):
            return False
        self.marks, self.last_progress = marks, now
        return True

    def to_dict(self) -> dict:
        """status.json's ``attach`` (docs/interface.md 4.1): the rate, its source, the GPUs
        and each mark with the interval from the previous one (seconds; null for the first)."""
        rows, last = [], None
        for gpu, usec in self.marks:
            interval = round((usec - last) / 1e6, 3) if usec is not None and last is not None \
                else None
            rows.append({"gpu": gpu, "at_s": round(usec / 1e6, 3) if usec is not None else None,
                         "interval_s": interval})
            last = usec if usec is not None else last
        return {"per_gpu_s": self.rate.per_gpu_s, "rate_source": self.rate.source,
                "gpus": self.rate.gpus, "expected_s": self.rate.attach_s, "marks": rows}

