"""Run one of NVIDIA's real ``nvidia-smi`` builds (tests/realsmi/fetch.py) against the fake NVML.

The binary is NVIDIA's, unmodified; it ``dlopen``\\ s ``libnvidia-ml.so.1`` through the library
path, where the fake (tests/fake_nvml) answers from a description file. It runs as ``nobody``
(``setpriv``), with a clean environment and a timeout: with the fake it opens no ``/dev`` node,
and unprivileged it could not create one (the genuine library, as root, creates
``/dev/nvidiactl``: nvidia-smi-real.md); :func:`dev_entries` lets a test check ``/dev`` is as it
was. Everything the program says goes to stdout (nvidia-smi-real.md); stderr is kept apart so a
test can say so.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
TIMEOUT_S = 20


@dataclass(frozen=True)
class Said:
    """What one run printed: ``stdout``, ``stderr`` and the exit status."""

    stdout: str
    stderr: str
    returncode: int


def run(binary: Path, args: list[str], description: Path, lib_dir: Path) -> Said:
    """``binary args`` as nobody, with the fake NVML of ``lib_dir`` describing ``description``.

    Raises:
        subprocess.TimeoutExpired: it ran past :data:`TIMEOUT_S`.
    """
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "env", "-i", f"LD_LIBRARY_PATH={lib_dir}", f"FAKE_NVML_DESCRIPTION={description}",
            "PATH=/usr/bin:/bin", str(binary), *args]
    if os.geteuid() != 0:
        argv = argv[argv.index("env"):]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd="/",
                          check=False)
    return Said(done.stdout, done.stderr, done.returncode)


def dev_entries() -> set[str]:
    """The names directly in the host's ``/dev`` and ``/dev/char``."""
    names = {e.name for e in os.scandir("/dev")}
    if os.path.isdir("/dev/char"):
        names |= {"char/" + e.name for e in os.scandir("/dev/char")}
    return names


def shared_dir(path: Path) -> Path:
    """``path`` made (mode 0777) so that nobody can read the description and write the state
    file the fake keeps (``cc.ready_file``); its parents must be searchable (pytest's
    ``tmp_path`` parents are 0700, so the tests use their own directory)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path
