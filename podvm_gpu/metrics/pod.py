"""The pod a peer-pods VM runs, as ``pod`` and ``namespace`` labels of the per-GPU metrics
(issue 28; dcgm-exporter's names for pod attribution, NVIDIA/gpu-operator#2706).

cloud-api-adaptor's ``process-user-data.service`` writes ``/run/peerpod/apf.json`` at boot: the
agent-protocol-forwarder's settings, with the pod's ``pod-name`` and ``pod-namespace`` at the
top level, and TLS material (keys, certificates) beside them. The network-facing exporter never
opens that file. A short-lived reader (``podvm-gpu metrics --pod-labels``, run once by
``podvm-gpu-pod-labels.service``, ordered after ``process-user-data.service`` and before
``podvm-gpu-metrics.service``) reads it and writes only the two names to
``/run/podvm-gpu/pod-labels.json`` (0644, atomically); the exporter reads that file on every
scrape. Nothing else of apf.json is kept, logged or copied: a problem is worded without its
content. A missing or bad file means no labels and one warning (the reader's stderr: the unit's
journal), and the labels file is removed so that no stale pod is shown.

Both reads follow docs/interface.md 2.7: bounded, non-blocking, no link in the last component,
regular files only; apf.json must also be owned by root (or, under ``--root``, the root
directory's owner) and writable by nobody else.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat

from podvm_gpu.host.fs import Root, atomic_write, ensure_dir

APF_PATH = "/run/peerpod/apf.json"
LABELS_PATH = "/run/podvm-gpu/pod-labels.json"
APF_LIMIT = 1024 * 1024  # settings and a few PEM blocks: kilobytes
LABELS_LIMIT = 4096
# Kubernetes object names: a pod is a DNS subdomain (RFC 1123, at most 253), a namespace a DNS
# label (at most 63); k8s.io/apimachinery validation
_POD = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class Unusable(Exception):
    """The file gives no labels; the message says why without quoting it."""


def _read(root: Root, path: str, limit: int, owner_checked: bool) -> bytes:
    where = root.resolve(path, follow_last=False)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP and os.path.islink(where):
            # O_NOFOLLOW's ELOOP reads "Too many levels of symbolic links" for one link: say
            # what it is (issue 35 item 14)
            raise Unusable(f"{path} is a symbolic link, which is not followed (a regular file "
                           "only)") from err
        raise Unusable(f"{path}: {err.strerror or err}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unusable(f"{path} is not a regular file")
        if owner_checked:
            owners = {0} if root.is_host else {0, os.stat(root.path).st_uid}
            if info.st_uid not in owners or info.st_mode & 0o022:
                raise Unusable(f"{path} could be written by another user than root "
                               f"(owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Unusable(f"{path} is larger than {limit} bytes")
    return data


def _names(doc: object, pod_key: str, ns_key: str, path: str) -> dict[str, str]:
    if not isinstance(doc, dict):
        raise Unusable(f"{path} is not a JSON object")
    pod, namespace = doc.get(pod_key), doc.get(ns_key)
    if not isinstance(pod, str) or not isinstance(namespace, str):
        raise Unusable(f"{path} has no {pod_key} and {ns_key} strings")
    if len(pod) > 253 or not _POD.fullmatch(pod):
        raise Unusable(f"{path}: {pod_key} is not a Kubernetes pod name")
    if len(namespace) > 63 or not _NAMESPACE.fullmatch(namespace):
        raise Unusable(f"{path}: {ns_key} is not a Kubernetes namespace name")
    return {"pod": pod, "namespace": namespace}


def read_apf(root: Root) -> dict[str, str]:
    """``{"pod": ..., "namespace": ...}`` from apf.json.

    Raises:
        Unusable: missing, unreadable, not root's, too large, not JSON, or names that are not
            Kubernetes names (the message never quotes the file).
    """
    data = _read(root, APF_PATH, APF_LIMIT, owner_checked=True)
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _Duplicate as err:
        raise Unusable(f"{APF_PATH}: {err}") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise Unusable(f"{APF_PATH} is not JSON") from err
    return _names(doc, "pod-name", "pod-namespace", APF_PATH)


class _Duplicate(Exception):
    pass


def _no_duplicates(pairs: list) -> dict:
    """A JSON object whose keys are each given once: json.loads keeps the last of two, so a
    second ``pod-name`` would silently win (the config and the web config refuse a key given
    twice too; issue 35 item 17). The key is named only when it is one the reader uses: the
    file holds TLS material, which is never quoted."""
    doc: dict = {}
    for key, value in pairs:
        if key in doc:
            named = f" {key}" if key in ("pod-name", "pod-namespace") else ""
            raise _Duplicate(f"a key{named} is given twice in one object")
        doc[key] = value
    return doc


def write_labels(root: Root) -> tuple[dict[str, str] | None, str | None]:
    """``metrics --pod-labels``: the two names from apf.json into :data:`LABELS_PATH`.

    Returns:
        ``(labels, None)`` once written, or ``(None, warning)`` with the labels file removed.

    Raises:
        OSError: the labels file cannot be written or removed.
    """
    target = root.resolve(LABELS_PATH, follow_last=False)
    try:
        labels = read_apf(root)
    except Unusable as err:
        if os.path.lexists(target):
            os.unlink(target)
        return None, f"no pod labels: {err}"
    ensure_dir(os.path.dirname(target))
    atomic_write(target, json.dumps(labels, sort_keys=True) + "\n", mode=0o644)
    return labels, None


def read_labels(root: Root) -> dict[str, str]:
    """The exporter's read: ``{"pod", "namespace"}`` from :data:`LABELS_PATH`, or ``{}`` when
    it is missing or bad (the reader already warned)."""
    try:
        data = _read(root, LABELS_PATH, LABELS_LIMIT, owner_checked=False)
        return _names(json.loads(data.decode("utf-8")), "pod", "namespace", LABELS_PATH)
    except (Unusable, UnicodeDecodeError, ValueError):
        return {}
