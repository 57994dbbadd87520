"""The agent's CDI specs as Debian's real podman (4.3.1, the Go CDI library) reads them (issue 19).

Each test runs tests/podman_cdi.py under ``unshare -m``: the test's folders are bound over
``/var/run/cdi`` and ``/etc/cdi`` in a private mount namespace (the host's are never touched),
podman's storage is the test's own, and ``podman create`` + ``podman init`` write the OCI
``config.json`` with the CDI edits applied (crun cannot start a container on these machines).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import debian_packages
import pytest
import yaml
from boot.image import unavailable
from fake_nvml import metrics_env

from podvm_gpu.cdi import DISABLED_SUFFIX

HERE = Path(__file__).resolve().parent
READY = HERE / "data/fixtures/nvidia-ctk/spec-1gpu.yaml"  # real nvidia-ctk output (1 GPU)
UUID = "GPU-facade00-0000-4000-8000-000000000000"


@pytest.fixture(scope="module")
def image_tar(tmp_path_factory) -> Path:
    """A tarball of a busybox-static rootfs (``podman import`` makes the local image of it)."""
    for tool in ("podman", "unshare"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is missing (Debian package podman, .ci/apt-packages.txt)")
    out = tmp_path_factory.mktemp("busybox")
    debian_packages.unpack(debian_packages.fetch("busybox-static"), out / "rootfs", "./bin/busybox")
    tar = out / "rootfs.tar"
    with tarfile.open(tar, "w") as t:
        t.add(out / "rootfs/bin", arcname="bin")
    return tar


def podman(tmp_path: Path, image_tar: Path, run_cdi: dict[str, str], etc_cdi: dict[str, str],
           *requests: str, nodes: list | None = None) -> dict[str, dict]:
    """Run the requests; request -> podman's answer (``rc``, ``stderr``, ``config``)."""
    folders = {}
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, files in (("run", run_cdi), ("etc", etc_cdi)):
        folders[name] = tmp_path / f"cdi-{name}"
        folders[name].mkdir()
        for file, text in files.items():
            (folders[name] / file).write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PODMAN_CDI_NODES": json.dumps(nodes or [])}
    done = subprocess.run(["unshare", "-m", "--", sys.executable, str(HERE / "podman_cdi.py"),
                           str(work), str(folders["run"]), str(folders["etc"]), str(image_tar),
                           *requests], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return {a["request"]: a for a in map(json.loads, done.stdout.splitlines())}


def cpu_vm_spec(tmp_path: Path) -> tuple[str, dict]:
    """The unavailable spec a real boot writes on this GPU-less machine, and its status."""
    root = tmp_path / "root"
    root.mkdir()
    booted = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                            capture_output=True, text=True, timeout=60, env=metrics_env(None))
    assert booted.returncode == 0, booted.stderr
    [spec] = (root / "var/run/cdi").glob("*.yaml")
    return spec.read_text(), json.loads((root / "run/podvm-gpu/status.json").read_text())


def nodes_of(spec: dict) -> list:
    paths = {n["path"]: n for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}
    paths.update({n["path"]: n for n in spec["containerEdits"].get("deviceNodes", [])})
    return [[p, n["major"], n.get("minor", 0)] for p, n in paths.items()]


def test_the_unavailable_spec_fails_a_gpu_request_at_once_and_carries_state_and_reason(tmp_path, image_tar):
    spec, status = cpu_vm_spec(tmp_path)
    started = time.monotonic()
    answers = podman(tmp_path, image_tar, {"nvidia.yaml": spec}, {},
                     "nvidia.com/gpu=0", "nvidia.com/gpu=all", "nvidia.com/gpu=unavailable")
    elapsed = time.monotonic() - started
    for request in ("nvidia.com/gpu=0", "nvidia.com/gpu=all"):
        answer = answers[request]  # podman 4.3 resolves CDI devices at init, not at create
        said = answer["stderr"] if answer["rc"] else answer.get("init_stderr", "")
        assert f"unresolvable CDI devices {request}" in said, answer
        assert "config" not in answer
    env = answers["nvidia.com/gpu=unavailable"]["config"]["process"]["env"]
    assert f"PODVM_GPU_STATE={status['state']}" in env
    assert f"PODVM_GPU_REASON={status['reason']}" in env
    print(f"podman on the unavailable spec: 3 requests in {elapsed:.1f} s")


@pytest.mark.parametrize("request_name", ["0", "all", UUID])
def test_the_ready_spec_gives_the_container_its_nodes_mounts_hooks_and_env(tmp_path, image_tar,
                                                                           request_name):
    text = READY.read_text()
    spec = yaml.safe_load(text.split("\n---\n", 1)[-1])
    request = f"nvidia.com/gpu={request_name}"
    config = podman(tmp_path, image_tar, {"nvidia.yaml": text}, {}, request,
                    nodes=nodes_of(spec))[request]["config"]
    device = next(d for d in spec["devices"] if d["name"] == request_name)
    wanted = {n["path"] for n in device["containerEdits"].get("deviceNodes", [])} | \
        {n["path"] for n in spec["containerEdits"].get("deviceNodes", [])}
    assert {d["path"] for d in config["linux"]["devices"]} == wanted
    assert set(spec["containerEdits"]["env"]) <= set(config["process"]["env"])
    mounts = {m["destination"] for m in config["mounts"]}
    assert {m["containerPath"] for m in spec["containerEdits"]["mounts"]} <= mounts
    hooks = [h["path"] for h in config["hooks"]["createContainer"]]
    assert hooks == [h["path"] for h in spec["containerEdits"]["hooks"]]


def test_a_renamed_duplicate_and_a_spec_in_etc_beside_var_run_give_no_conflict(tmp_path, image_tar):
    ready = READY.read_text()
    unavailable_spec, _ = cpu_vm_spec(tmp_path)
    spec = yaml.safe_load(ready.split("\n---\n", 1)[-1])
    answers = podman(tmp_path, image_tar,
                     {"nvidia.yaml": ready, "nvidia-old.yaml" + DISABLED_SUFFIX: ready},
                     {"other-nvidia.yaml": unavailable_spec},
                     "nvidia.com/gpu=0", "nvidia.com/gpu=unavailable", nodes=nodes_of(spec))
    for request, answer in answers.items():
        assert "conflicting" not in answer["stderr"], answer["stderr"]
        assert "config" in answer, (request, answer)
    assert answers["nvidia.com/gpu=0"]["config"]["linux"]["devices"]
    assert "PODVM_GPU_STATE=no-gpu" in answers["nvidia.com/gpu=unavailable"]["config"]["process"]["env"]


def test_a_watch_finding_turns_a_gpu_request_podman_accepted_into_one_it_refuses(tmp_path, image_tar):
    """Issue 34: after a ready boot podman (the real CDI library) accepts nvidia.com/gpu=0; once
    the watcher's finding replaced the spec it refuses it at once, and the reason is in
    status.json, the journal line and the spec's env."""
    from scenarios.world import World
    from test_watch import XID_79, append_kmsg, case, spec_env, start_watch, stderr_of, stop, watching

    with World(case("P02", "watch:\n  interval_s: 3600\n")) as world:
        world.run("boot")
        spec_path = Path(world.path("/var/run/cdi/nvidia.yaml"))
        ready = spec_path.read_text()
        nodes = nodes_of(yaml.safe_load(ready.split("\n---\n", 1)[-1]))
        before = podman(tmp_path / "before", image_tar, {"nvidia.yaml": ready}, {},
                        "nvidia.com/gpu=0", nodes=nodes)["nvidia.com/gpu=0"]
        assert before["rc"] == 0 and before["config"]["linux"]["devices"], before
        proc = start_watch(world)
        try:
            assert watching(world, proc), stderr_of(world)
            append_kmsg(world, XID_79)
            assert proc.wait(30) == 0, stderr_of(world)
        finally:
            stop(proc)
        reason = json.loads(Path(world.path("/run/podvm-gpu/status.json")).read_text())["reason"]
        answers = podman(tmp_path / "after", image_tar, {"nvidia.yaml": spec_path.read_text()}, {},
                         "nvidia.com/gpu=0", "nvidia.com/gpu=unavailable", nodes=nodes)
        refused = answers["nvidia.com/gpu=0"]
        said = refused["stderr"] if refused["rc"] else refused.get("init_stderr", "")
        assert "unresolvable CDI devices nvidia.com/gpu=0" in said, refused
        assert "config" not in refused
        env = answers["nvidia.com/gpu=unavailable"]["config"]["process"]["env"]
        assert f"PODVM_GPU_REASON={reason}" in env and "PODVM_GPU_STATE=failed" in env
        assert f"PODVM_GPU_REASON={reason}" in spec_env(world)
        assert reason.startswith("watch: GPU 0000:00:04.0: Xid 79") and reason in stderr_of(world)
