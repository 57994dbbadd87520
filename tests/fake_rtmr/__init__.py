"""The scenario worlds' RTMR3 (issue 37): fake_rtmr.c, an LD_PRELOAD shim that keeps the
kernel's rules for writes to the world's ``rtmr3:sha384`` (48 bytes at offset 0, else EINVAL;
SHA-384 chaining), over a regular file that reads give as they are.

Why a shim and not a FIFO or FUSE: the agent opens, reads and writes the register as it would
the kernel's file, one descriptor each (podvm_gpu/host/rtmr.py's Register), and must read back
what it extended; a FIFO cannot be read back, FUSE needs /dev/fuse and a daemon, and
tests/fake_nvml already shows how a built C library enters a world. The shim takes only
descriptors of that one file (device and inode), so umockdev's preload and every other write
are untouched.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fake_rtmr.c"


def build(out_dir: Path) -> Path:
    """Compile the shim with gcc into ``out_dir`` (cached by the source's hash); its path.

    Raises:
        subprocess.CalledProcessError: gcc failed (its stderr in the error).
    """
    source = SOURCE.read_bytes()
    target = out_dir / f"fake-rtmr-{hashlib.sha256(source).hexdigest()[:12]}" / "fake_rtmr.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".so.{os.getpid()}.tmp")  # workers may build at once
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
                        str(tmp), str(SOURCE), "-ldl"], check=True, capture_output=True,
                       text=True, timeout=120)
        tmp.rename(target)
    return target
