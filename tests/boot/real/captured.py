"""The captured behaviour of Debian 12's real NVIDIA programs (tests/data/nvidia-<version>/).

tests/boot/real/capture.py made these fixtures in qemu boots of the real-driver image; the
README there says how each was made. One folder per boot (``plain``, ``no-install-rule``, one
per kernel command line that stops modules from loading), one folder per command in it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

DRIVER = "535.261.03"  # the kernel module's version, which names the folder
PERSISTENCED = "535.171.04"  # Debian 12 ships an older nvidia-persistenced than the driver
DATA = Path(__file__).resolve().parents[2] / "data" / f"nvidia-{DRIVER}"


@dataclasses.dataclass(frozen=True)
class Run:
    """One command as it ran in the guest: argv, exit status (an int), output, kernel records
    (raw ``prio,seq,usec,flags;message`` lines) written meanwhile, journal entries (dicts)."""

    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    kmsg: list[str]
    journal: list[dict]

    def kernel_messages(self) -> list[str]:
        """The messages of the kernel records, without their prefix."""
        return [record.split(";", 1)[1] for record in self.kmsg]

    def as_kmsg_file(self) -> str:
        """The records as a ``/dev/kmsg`` stand-in file holds them (one per line)."""
        return "".join(record + "\n" for record in self.kmsg)


def run(boot: str, name: str) -> Run:
    folder = DATA / boot / name
    assert folder.is_dir(), f"no captured run {boot}/{name} in {DATA}"
    journal = folder / "journal"
    return Run(json.loads((folder / "argv").read_text()), int((folder / "rc").read_text()),
               (folder / "stdout").read_text(), (folder / "stderr").read_text(),
               (folder / "kmsg").read_text().splitlines(),
               [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else [])


def files(boot: str, name: str) -> dict[str, str]:
    """path -> content (``-> target`` for a link) of a captured ``read`` entry."""
    return json.loads((DATA / boot / name / "files.json").read_text())
