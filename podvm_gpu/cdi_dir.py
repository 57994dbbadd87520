"""The CDI spec directories: other files that define kind ``nvidia.com/gpu``.

Boot owns the kind in ``/var/run/cdi`` (contract section 3, step 9): kata-agent drops every
device that two specs define, so a second spec of the kind, e.g. one the toolkit or an image
build left, would hide the agent's devices or, on a VM without a usable GPU, the unavailable
spec's fast failure. Such a file is renamed to ``<name>.disabled-by-podvm-gpu`` on every boot
outcome; ``/etc/cdi`` is never written (kata-agent does not read it), only reported.

Cheap when the folder holds nothing else (one listdir): the CPU fast path calls it.
"""

from __future__ import annotations

import os
import stat

from podvm_gpu.host.fs import Root

RUN_DIR = "/var/run/cdi"
ETC_DIR = "/etc/cdi"
OUR_SPEC = "nvidia.yaml"
DISABLED_SUFFIX = ".disabled-by-podvm-gpu"
_MAX_BYTES = 1 << 20


def defines_gpu_kind(path: str) -> bool:
    """True when the spec file at ``path`` has kind ``nvidia.com/gpu`` at its top level.

    The file is opened without following a symlink (a link in the spec folder is never read
    through) and without blocking, at most 1 MiB of it. JSON is read with the standard library;
    PyYAML is imported only for a YAML file, which a CPU VM's spec folder rarely holds.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        text = os.read(fd, _MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return False
    finally:
        os.close(fd)
    import json  # only when the folder holds another spec: the CPU fast path seldom pays it

    try:
        doc = json.loads(text)
    except ValueError:
        import yaml

        try:
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError:
            return False
    return isinstance(doc, dict) and doc.get("kind") == "nvidia.com/gpu"


def other_specs(root: Root, host_dir: str) -> list[str]:
    """Real paths of the spec files in ``host_dir`` (other than our own in /var/run/cdi) that
    define kind nvidia.com/gpu."""
    try:
        folder = root.resolve(host_dir)
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    ours = OUR_SPEC if host_dir == RUN_DIR else None
    return [os.path.join(folder, n) for n in names
            if n.endswith((".yaml", ".json")) and n != ours
            and defines_gpu_kind(os.path.join(folder, n))]


def disable_duplicates(root: Root) -> list[str]:
    """Rename the other nvidia.com/gpu specs in /var/run/cdi aside; report those in /etc/cdi.

    Returns one warning line per file. A rename that fails is reported, not raised.
    """
    warnings = []
    for path in other_specs(root, RUN_DIR):
        host = root.host_path(path)
        try:
            os.rename(path, path + DISABLED_SUFFIX)
        except OSError as err:
            warnings.append(f"cdi: {host} also defines nvidia.com/gpu and could not be renamed: "
                            f"{err.strerror}")
            continue
        warnings.append(f"cdi: {host} also defined nvidia.com/gpu; renamed to "
                        f"{host}{DISABLED_SUFFIX}")
    for path in other_specs(root, ETC_DIR):
        warnings.append(f"cdi: {root.host_path(path)} also defines nvidia.com/gpu; remove it from "
                        "the image (boot never writes to /etc/cdi)")
    return warnings
