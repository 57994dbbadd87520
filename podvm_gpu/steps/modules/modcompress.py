"""Whether a kernel can load its xz-compressed nvidia modules: the check type of each ``.ko.xz``
against what that kernel's decompressor takes (``check --image``, the ``module-compression``
row of the modules step).

Where the kernel decompresses modules itself (``CONFIG_MODULE_DECOMPRESS=y``), kmod hands it a
module compressed in the kernel's own format (``/sys/module/compression``) as it is
(``finit_module`` with ``MODULE_INIT_COMPRESSED_FILE``; libkmod-module.c); a module in another
format, or any module on a kernel without in-kernel decompression, kmod decompresses in user
space (liblzma, which takes every check type). The kernel's xz decoder (lib/xz/xz_dec_stream.c,
built without ``XZ_DEC_ANY_CHECK``) takes only the check types None and CRC32: any other
returns ``XZ_OPTIONS_ERROR`` (status 6), and ``modprobe`` fails with ``Invalid argument``
(Documentation/staging/xz.rst: "use --check=none or --check=crc32"). User-space ``xz`` writes
CRC64 by default (ublue-os/akmods#318, NixOS/nixpkgs#549398); kbuild itself compresses with
``xz --check=crc32 --lzma2=dict=1MiB``. So it bites on Debian 13's 6.12
(``CONFIG_MODULE_COMPRESS_XZ=y``, ``CONFIG_MODULE_DECOMPRESS=y``), not on Debian 12's 6.1
(``CONFIG_MODULE_COMPRESS_NONE=y``: kmod decompresses).

The check type is read from the xz stream header (the .xz file format, section 2.1.1): 6 magic
bytes, 2 bytes of stream flags (the first 0, the second's low 4 bits the check ID, its high 4
bits 0), their CRC32. Twelve bytes: nothing is decompressed.
"""

from __future__ import annotations

import os
import re
import struct
import zlib

from podvm_gpu.host.fs import Root, open_regular
from podvm_gpu.row import FAIL, PASS, SKIP, WARN, Check

XZ_MAGIC = b"\xfd7zXZ\x00"
# Check IDs of the .xz format (section 2.1.1.2); the others are reserved.
CHECK_NAMES = {0x00: "None", 0x01: "CRC32", 0x04: "CRC64", 0x0A: "SHA-256"}
KERNEL_CHECKS = frozenset({0x00, 0x01})  # what lib/xz takes without XZ_DEC_ANY_CHECK
FIX = ("recompress the module with xz --check=crc32 (as kbuild does: xz --check=crc32 "
       "--lzma2=dict=1MiB), or use zstd or an uncompressed .ko; then run depmod for that kernel")


def xz_check(real_path: str) -> int | str:
    """The check ID of the xz stream at ``real_path``, or why its header cannot be read (a
    string: not an xz stream, a corrupt header, unreadable)."""
    try:
        with open_regular(real_path) as f:  # a FIFO or a device there never blocks
            head = f.read(12)
    except OSError as err:
        kind = getattr(err, "kind", None)
        return f"unreadable ({kind + ', not a regular file' if kind else err.strerror or err})"
    if len(head) < 12 or head[:6] != XZ_MAGIC:
        return "not an xz stream (no xz header)"
    flags = head[6:8]
    if zlib.crc32(flags) != struct.unpack("<I", head[8:12])[0]:
        return "a corrupt xz stream header (its CRC32 does not match)"
    if flags[0] != 0 or flags[1] & 0xF0:
        return "an xz stream header with reserved flags set"
    return flags[1] & 0x0F


def _xz_check_under(root: Root, host_path: str) -> int | str:
    """:func:`xz_check` of a file under the root; a link loop on its way is unreadable."""
    try:
        real = root.resolve(host_path)
    except OSError as err:
        return f"unreadable ({err.strerror})"
    return xz_check(real)


def check_name(check_id: int) -> str:
    """``CRC64``, or ``check ID 7`` for a reserved one."""
    return CHECK_NAMES.get(check_id, f"check ID {check_id}")


def kernel_decompresses_xz(root: Root, release: str) -> tuple[bool | None, str]:
    """Whether kernel ``release`` decompresses ``.ko.xz`` modules itself, from
    ``/boot/config-<release>``: ``(True|False, why)``, or ``(None, why)`` without its config."""
    where = f"/boot/config-{release}"
    text = root.read_text(where)
    if text is None:
        return None, f"no {where} to tell whether it decompresses modules in the kernel"
    values = dict(re.findall(r"^(CONFIG_MODULE_\w+)=(\S+)", text, re.M))
    if values.get("CONFIG_MODULE_DECOMPRESS") != "y":
        return False, f"CONFIG_MODULE_DECOMPRESS is not set ({where}): kmod decompresses " \
                      "modules in user space"
    if values.get("CONFIG_MODULE_COMPRESS_XZ") != "y":
        return False, f"its in-kernel decompression is not xz ({where}): kmod decompresses " \
                      ".ko.xz in user space"
    return True, f"CONFIG_MODULE_DECOMPRESS=y and CONFIG_MODULE_COMPRESS_XZ=y ({where}): the " \
                 "kernel decompresses .ko.xz itself, and takes only the check types None and CRC32"


def nvidia_xz_modules(root: Root, release: str, resolved=()) -> list[str]:
    """Host paths of the nvidia ``.ko.xz`` files under ``/lib/modules/<release>`` (file names
    starting ``nvidia``, Debian's ``nvidia-current*`` included), ``resolved`` first: the files
    modprobe loads for the required modules, whatever their names."""
    first = sorted({p for p in resolved if p and p.endswith(".ko.xz")})
    found = set()
    top = root.resolve(f"/lib/modules/{release}")
    for dirpath, dirs, files in os.walk(top):
        dirs.sort()
        for name in files:
            if name.startswith("nvidia") and name.endswith(".ko.xz"):
                relative = os.path.relpath(os.path.join(dirpath, name), top)
                found.add(f"/lib/modules/{release}/{relative}")
    return first + sorted(found - set(first))


def compression_image_row(image) -> Check:
    """``module-compression``: per kernel, each nvidia ``.ko.xz``'s check type against what that
    kernel's decompressor takes (see the module docstring)."""
    root = image.root
    if not any(res.file for found in image.found.values() for res in found.values()):
        # no kernel, or no nvidia module file for any: nothing looked at, not a pass (issue 47)
        return Check("module-compression", SKIP, "no nvidia module in the image to judge "
                     "(see modules)", "fix the modules row first")
    bad, unknown, fine, unreadable = [], [], [], []
    for release in image.kernels:
        resolved = [res.file for res in image.found.get(release, {}).values()]
        files = nvidia_xz_modules(root, release, resolved)
        if not files:
            continue
        read = {path: _xz_check_under(root, path) for path in files}
        unreadable += [f"{path}: {why}" for path, why in read.items() if isinstance(why, str)]
        refused = {path: check for path, check in read.items()
                   if isinstance(check, int) and check not in KERNEL_CHECKS}
        types = sorted({check_name(c) for c in read.values() if isinstance(c, int)})
        if not refused:
            fine.append(f"{release}: {len(files)} .ko.xz, check {', '.join(types) or '?'}")
            continue
        in_kernel, why = kernel_decompresses_xz(root, release)
        first, check = next(iter(refused.items()))
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        said = f"kernel {release}: {first} has xz check {check_name(check)}{more}"
        if in_kernel:
            bad.append(f"{said}; {why}: modprobe fails with 'Invalid argument' (kernel log: "
                       "decompression failed with status 6)")
        elif in_kernel is None:
            unknown.append(f"{said}; {why}: a kernel with CONFIG_MODULE_DECOMPRESS=y refuses it")
        else:
            fine.append(f"{release}: {said.split(': ', 1)[1]}, fine there: {why}")
    if unreadable:
        return Check("module-compression", FAIL, "; ".join(unreadable[:3]), "reinstall the module "
                     "(neither the kernel nor kmod can decompress it)")
    if bad:
        return Check("module-compression", FAIL, "; ".join(bad[:3]), FIX)
    if unknown:
        return Check("module-compression", WARN, "; ".join(unknown[:3]), f"install the kernel's "
                     f"/boot/config-<release> so this can be judged, or {FIX}")
    if not fine:
        return Check("module-compression", PASS, "no nvidia module is xz-compressed: nothing for "
                     "a kernel to decompress")
    return Check("module-compression", PASS, "; ".join(fine))
