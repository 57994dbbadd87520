"""Run Debian's podman (4.3.1, the real Go CDI library) on test CDI folders, never the host's.

``python3 podman_cdi.py WORK RUN_CDI ETC_CDI IMAGE_TAR REQUEST...`` is started by
test_cdi_podman.py under ``unshare -m`` (a private mount namespace). It makes the namespace's
mounts private, puts a tmpfs on ``/run`` (so ``/var/run/cdi`` can be made there) and an overlay
on ``/etc`` (so ``/etc/cdi`` can), binds RUN_CDI and ETC_CDI over them, imports IMAGE_TAR into a
podman storage under WORK (``--root``/``--runroot``: the host's container storage is not used),
then for each REQUEST (``nvidia.com/gpu=0``) runs ``podman create --device REQUEST`` and
``podman init``, and prints one JSON line per request: the create's exit code and stderr and,
when a container was made, the OCI ``config.json`` podman wrote with the CDI edits applied
(crun then fails on these machines; the file is written before it runs). The ready spec's
device nodes (env ``PODMAN_CDI_NODES``) are made in an overlay on ``/dev``, inside the namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def must(argv: list[str]) -> None:
    done = run(argv)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")


def main(work: str, run_cdi: str, etc_cdi: str, image_tar: str, requests: list[str]) -> None:
    must(["mount", "--make-rprivate", "/"])
    must(["mount", "-t", "tmpfs", "tmpfs", "/run"])
    os.makedirs("/run/cdi")
    must(["mount", "--bind", run_cdi, "/run/cdi"])
    for sub in ("upper", "work"):
        os.makedirs(os.path.join(work, "etc-overlay", sub), exist_ok=True)
    must(["mount", "-t", "overlay", "overlay", "-o",
          f"lowerdir=/etc,upperdir={work}/etc-overlay/upper,workdir={work}/etc-overlay/work", "/etc"])
    os.makedirs("/etc/cdi", exist_ok=True)
    must(["mount", "--bind", etc_cdi, "/etc/cdi"])
    # the ready spec's device nodes (env PODMAN_CDI_NODES: [[path, major, minor], ...]), made in
    # an overlay on /dev: the CDI library stats every host node
    nodes = json.loads(os.environ.get("PODMAN_CDI_NODES", "[]"))
    if nodes:
        for sub in ("upper", "work"):
            os.makedirs(os.path.join(work, "dev-overlay", sub), exist_ok=True)
        must(["mount", "-t", "overlay", "overlay", "-o",
              f"lowerdir=/dev,upperdir={work}/dev-overlay/upper,workdir={work}/dev-overlay/work", "/dev"])
        for path, major, minor in nodes:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.lexists(path):  # the host's own, seen through the overlay: replaced in it
                os.unlink(path)
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
    # --runroot: the namespace's tmpfs; podman allows 50 characters
    podman = ["podman", "--root", f"{work}/storage", "--runroot", "/run/podman-test",
              "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "none"]
    must(podman + ["import", image_tar, "localhost/podvm-gpu-test:1"])
    for request in requests:
        created = run(podman + ["create", "--device", request, "localhost/podvm-gpu-test:1",
                                "/bin/busybox", "env"])
        out = {"request": request, "rc": created.returncode, "stderr": created.stderr.strip()}
        cid = created.stdout.strip()
        if created.returncode == 0 and cid:
            out["init_stderr"] = run(podman + ["init", cid]).stderr.strip()
            path = f"{work}/storage/vfs-containers/{cid}/userdata/config.json"
            if os.path.exists(path):
                with open(path) as f:
                    out["config"] = json.load(f)
            run(podman + ["rm", "-f", cid])
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5], sys.argv[5:])
