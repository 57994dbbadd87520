"""The CDI spec of kind ``nvidia.com/gpu``: where it lives, and the spec directories.

The package's rooms, each changing for its own reason:

* here: the kind, the spec's path and the other files in the spec directories (below), which
  the CPU fast path needs, so this module imports nothing more;
* :mod:`~podvm_gpu.cdi.unavailable`: the unavailable spec a CPU or failed VM gets (fast path);
* :mod:`~podvm_gpu.cdi.model`: the typed spec; :mod:`~podvm_gpu.cdi.rules`: what makes a
  document a CDI spec (the schema's shapes as data, the Go package's rules);
  :mod:`~podvm_gpu.cdi.parse`: strict YAML/JSON to a checked model;
  :mod:`~podvm_gpu.cdi.ready`: what a ``ready`` boot needs of a valid spec.

Other files that define the kind: boot owns it in ``/var/run/cdi`` (contract section 3, step 9):
kata-agent drops every device that two specs define, so a second spec of the kind, e.g. one the
toolkit or an image build left, would hide the agent's devices or, on a VM without a usable GPU,
the unavailable spec's fast failure. Such a file is renamed to ``<name>.disabled-by-podvm-gpu`` on
every boot outcome; ``/etc/cdi`` is never written (kata-agent does not read it), only reported.

Cheap when the folder holds nothing else (one listdir): the CPU fast path calls it.
"""

from __future__ import annotations

import errno
import os

from podvm_gpu.host.fs import Root, read_bounded

KIND = "nvidia.com/gpu"
RUN_DIR = "/var/run/cdi"
SPEC_PATH = RUN_DIR + "/nvidia.yaml"  # what kata-agent reads (contract section 2)
# The IMEX channels' spec (podvm_gpu/steps/cdi/imex.py): a file boot owns beside ours, of kind
# nvidia.com/imex-channel; a no-gpu or failed boot removes it (cdi/unavailable.py).
IMEX_KIND = "nvidia.com/imex-channel"
IMEX_SPEC_PATH = RUN_DIR + "/nvidia-imex.yaml"
ETC_DIR = "/etc/cdi"
OUR_SPEC = "nvidia.yaml"
DISABLED_SUFFIX = ".disabled-by-podvm-gpu"
# Far above any real spec (nvidia-ctk's spec of 8 GPUs is about 30 KB, one with every MIG
# profile a few hundred KB), so that a spec of the kind is never left alone for its size.
MAX_SPEC_BYTES = 32 << 20


def spec_kind(root: Root, path: str) -> tuple[str | None, str | None]:
    """``(kind, problem)`` of the spec file at ``path`` (a real path in a spec folder).

    A symlink is followed chroot-style, inside the root (the CDI readers follow links, so a link
    to /etc/cdi/nvidia.yaml is a spec of its kind; a link out of the root is never read). The
    file is opened without blocking and read up to :data:`MAX_SPEC_BYTES`. JSON is read with the
    standard library; PyYAML is imported only for a YAML file, which a CPU VM's spec folder
    rarely holds. ``kind`` is the top-level ``kind`` (None when there is none or the file is not
    a spec); ``problem`` says why the kind could not be told (too large, nested too deeply),
    else None.
    """
    try:
        real = root.resolve(root.host_path(path)) if os.path.islink(path) else path
        data = read_bounded(real, MAX_SPEC_BYTES)
    except OSError as err:
        if err.errno == errno.EFBIG:
            return None, f"larger than {MAX_SPEC_BYTES >> 20} MiB"
        return None, None  # gone, not a regular file, a dangling link: nothing a reader uses
    text = data.decode("utf-8", errors="replace")
    import json  # only when the folder holds another spec: the CPU fast path seldom pays it

    try:
        doc = json.loads(text)
    except RecursionError:
        return None, "nested too deeply to read"
    except ValueError:
        import yaml

        try:
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except RecursionError:
            return None, "nested too deeply to read"
        except (yaml.YAMLError, ValueError) as err:
            # past libyaml's nesting limit the kind is unknown, not absent
            return None, ("nested too deeply to read" if "nesting depth" in str(err) else None)
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return (kind if isinstance(kind, str) else None), None


def other_specs(root: Root, host_dir: str) -> list[tuple[str, str | None]]:
    """The spec files in ``host_dir`` (other than our own in /var/run/cdi) that define kind
    nvidia.com/gpu, or whose kind could not be told: ``(real path, problem or None)``."""
    try:
        folder = root.resolve(host_dir)
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    ours = OUR_SPEC if host_dir == RUN_DIR else None
    found = []
    for name in names:
        if not name.endswith((".yaml", ".json")) or name == ours:
            continue
        path = os.path.join(folder, name)
        kind, problem = spec_kind(root, path)
        if kind == "nvidia.com/gpu" or problem:
            found.append((path, problem))
    return found


def disable_duplicates(root: Root) -> list[str]:
    """Rename the other nvidia.com/gpu specs in /var/run/cdi aside (a symlink itself, never its
    target); report those in /etc/cdi and every spec whose kind could not be told.

    Returns one warning line per file. A rename that fails is reported, not raised.
    """
    warnings = []
    for path, problem in other_specs(root, RUN_DIR):
        host = root.host_path(path)
        if problem:
            warnings.append(f"cdi: {host} could not be read ({problem}): if it defines "
                            "nvidia.com/gpu, kata-agent drops our devices; remove it")
            continue
        try:
            os.rename(path, path + DISABLED_SUFFIX)
        except OSError as err:
            warnings.append(f"cdi: {host} also defines nvidia.com/gpu and could not be renamed: "
                            f"{err.strerror}")
            continue
        warnings.append(f"cdi: {host} also defined nvidia.com/gpu; renamed to "
                        f"{host}{DISABLED_SUFFIX}")
    for path, problem in other_specs(root, ETC_DIR):
        what = f"could not be read ({problem})" if problem else "also defines nvidia.com/gpu"
        warnings.append(f"cdi: {root.host_path(path)} {what}; remove it from the image (boot "
                        "never writes to /etc/cdi)")
    return warnings
