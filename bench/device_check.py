"""The project's device check (issue 33 item 5): one script for a lent GPU machine
(../shared/DEVICE.md) that captures what the real nvidia-smi answers and times the agent there,
in under 2 minutes of the machine's time.

Usage, on the machine, from the checkout's root (no network there: the checkout and what it needs
travel with it)::

    python3 bench/device_check.py --out "$OUT" [--wheels DIR] [--nvidia-ctk PATH]
                                  [--root /] [--budget-s 110]

What it does, each step bounded and the whole run cut at ``--budget-s``:

1. installs the checkout without network: ``--wheels DIR`` (``pip install --no-index
   --find-links DIR``) for what the machine lacks (pyudev, bcrypt), the checkout itself by
   ``PYTHONPATH`` (nothing written into the interpreter);
2. runs every read-only nvidia-smi command line of the agent (podvm_gpu/gpufacts/smi.py), then
   the extra reads of the earlier capture (``-q``, ``-L``, ``--help-query-gpu``, ...), each alone
   and timed; then the fabric query 2, 4 and 8 side by side. **It refuses any command line that
   sets** (:func:`refuse`: an allow-list of reads, and ``-srs``, ``-pm``, ``-r``, ECC, MIG,
   clocks and power refused by name whatever the list says): a lent GPU's settings are left
   alone;
3. boots the agent on ``--root`` (``/`` there) with a persistenced stand-in first on ``PATH``
   (the real daemon would switch persistence mode on) and ``--nvidia-ctk`` when carried, then
   ``check --json``, ``status --json`` and ``metrics``;
4. writes under ``--out``: ``nvidia-smi-capture.json`` (a list of ``{argv, exit, seconds,
   stdout, stderr}``, the format of tests/data/real/h200-580/), ``timings.json`` and
   ``podvm-gpu-status.json``, ``check.json``, ``status.json``, ``metrics.txt``, ``run.json``
   (what ran, what was skipped for time, the driver).

Its logic is tested against a fake nvidia-smi (tests/test_device_check.py); no session has run
it on a lent GPU yet.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from podvm_gpu.gpufacts import smi  # noqa: E402

CALL_TIMEOUT_S = 20  # one nvidia-smi call; the real one answers in 20-110 ms (timings.json)
COMMAND_TIMEOUT_S = 60  # boot, check, status, metrics
SIDE_BY_SIDE = (2, 4, 8)
# nvidia-smi options that change the GPU or the driver, refused whatever else is asked
SETTING_WORDS = ("-srs", "--set-ready-state", "-pm", "--persistence-mode", "-r", "--gpu-reset",
                 "-e", "--ecc-config", "-p", "--reset-ecc-errors", "-mig", "--multi-instance-gpu",
                 "-lgc", "--lock-gpu-clocks", "-lmc", "--lock-memory-clocks", "-rgc", "-rmc",
                 "-ac", "--applications-clocks", "-rac", "-pl", "--power-limit", "-c",
                 "--compute-mode", "-am", "--accounting-mode", "-caa", "-cgi", "-dgi", "-cci",
                 "-dci", "-scc", "--set-cc-mode", "-sgc", "-skr", "-smgm", "--set-multigpu-mode",
                 "-dm", "--driver-model", "-cc", "--cuda-clocks", "-gom")
# reads the earlier capture made beside the agent's own (tests/data/real/h200-580/README.md)
EXTRA_READS = (
    ["nvidia-smi", "-q"], ["nvidia-smi", "-q", "-d", "FABRIC"], ["nvidia-smi", "--version"],
    ["nvidia-smi", "-L"], ["nvidia-smi"], ["nvidia-smi", "conf-compute", "-h"],
    ["nvidia-smi", "conf-compute", "-gc"], ["nvidia-smi", "conf-compute", "-gm"],
    ["nvidia-smi", "conf-compute", "-gkr"], ["nvidia-smi", "--help-query-gpu"],
    ["nvidia-smi", "--help-query-remapped-rows"], ["nvidia-smi", "nvlink", "-s"],
    ["nvidia-smi", "topo", "-m"], ["nvidia-smi", "-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER"],
    ["nvidia-smi", "--query-gpu=index,pci.bus_id,pci.device_id,uuid,name,driver_version,"
     "vbios_version,persistence_mode,fabric.state,fabric.status,fabric.clusterUuid,"
     "fabric.cliqueId", "--format=csv"],
    ["nvidia-smi", "--query-gpu=pci.bus_id,gpu_recovery_action", "--format=csv"],
    ["nvidia-smi", "--query-gpu=pci.bus_id,fabric.health.summary,fabric.health.bandwidth,"
     "fabric.health.route_recovery_in_progress,fabric.health.route_unhealthy,"
     "fabric.health.access_timeout_recovery,fabric.health.incorrect_configuration,"
     "fabric.health.partition_assigned", "--format=csv"],
)
PERSISTENCED_STANDIN = """#!/bin/sh
# a stand-in for nvidia-persistenced (the real one would switch persistence mode on): it forks,
# writes its pid file and holds its socket open (../shared/DEVICE.md)
d=/var/run/nvidia-persistenced
mkdir -p "$d"
(
  exec python3 -c '
import os, socket, sys, time
d = sys.argv[1]
s = socket.socket(socket.AF_UNIX)
try:
    os.unlink(d + "/socket")
except OSError:
    pass
s.bind(d + "/socket"); s.listen(8)
open(d + "/nvidia-persistenced.pid", "w").write(f"{os.getpid()}\\n")
time.sleep(3600)
' "$d"
) >/dev/null 2>&1 &
exit 0
"""


class Refused(ValueError):
    """A command line that could change the GPU: the script never runs it."""


def agent_reads() -> list[list[str]]:
    """Every read-only nvidia-smi command line of the agent (the nvidia-smi back end's)."""
    from podvm_gpu.steps.cc import classify

    return [smi.fabric_argv(), smi.fabric_health_argv(), smi.fabric_detail_argv(),
            smi.remap_argv(), smi.ecc_argv(),
            smi.reset_argv(), smi.action_argv(), smi.mig_mode_argv(), smi.mig_list_argv(),
            smi.full_query_argv(),
            *(smi.conf_compute_argv(q) for q in (*classify.QUERIES, "-grs"))]


def allowed() -> list[list[str]]:
    return [*agent_reads(), *(list(a) for a in EXTRA_READS)]


def refuse(argv: list[str]) -> None:
    """Raise :class:`Refused` unless ``argv`` is one of :func:`allowed` and names no setting
    option (:data:`SETTING_WORDS`; ``conf-compute -e`` reads the environment and stays: only
    outside ``conf-compute`` is ``-e`` ECC's setting)."""
    if not argv or os.path.basename(argv[0]) != "nvidia-smi":
        raise Refused(f"not nvidia-smi: {argv!r}")
    in_cc = len(argv) > 1 and argv[1] == "conf-compute"
    for word in argv[1:]:
        head = word.split("=", 1)[0]
        if head in SETTING_WORDS and not (in_cc and head == "-e"):
            raise Refused(f"{' '.join(argv)}: {head} sets")
    if list(argv) not in allowed():
        raise Refused(f"{' '.join(argv)}: not a read this script knows")


def run_one(argv: list[str], env: dict, timeout: float = CALL_TIMEOUT_S) -> dict:
    """One call, refused first when it could set anything; its capture entry."""
    refuse(argv)
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              timeout=timeout, env=env)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, _text(exc.stdout), _text(exc.stderr) + f"\n(timed out after {timeout} s)"
    except OSError as exc:
        rc, out, err = None, "", str(exc)
    return {"argv": list(argv), "exit": rc, "seconds": round(time.monotonic() - started, 4),
            "stdout": out, "stderr": err}


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


def side_by_side(argv: list[str], n: int, env: dict) -> float:
    """Wall seconds of ``n`` calls of ``argv`` started together."""
    refuse(argv)
    threads = [threading.Thread(target=run_one, args=(argv, env)) for _ in range(n)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return round(time.monotonic() - started, 4)


class Clock:
    """The run's budget: what is left, and what was skipped for want of it."""

    def __init__(self, budget_s: float):
        self.deadline = time.monotonic() + budget_s
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, what: str, needs_s: float = 1.0) -> bool:
        if self.left() >= needs_s:
            return True
        self.skipped.append(what)
        return False


def agent(args: list[str], env: dict, timeout: float) -> dict:
    """``python -m podvm_gpu <args>``: exit, seconds, stdout, stderr."""
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "podvm_gpu", *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=str(REPO))
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, _text(exc.stdout), _text(exc.stderr)
    return {"args": args, "exit": rc, "seconds": round(time.monotonic() - started, 4),
            "stdout": out, "stderr": err[-4000:]}


def install(wheels: str | None, env: dict) -> dict:
    """The checkout by ``PYTHONPATH``; ``--wheels``: the missing packages, without network."""
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not wheels:
        return {"wheels": None}
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links",
                           wheels, "--quiet", *sorted(p.name.split("-")[0] for p in
                                                      Path(wheels).glob("*.whl"))],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return {"wheels": wheels, "exit": done.returncode, "stderr": done.stderr[-2000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--root", default="/")
    parser.add_argument("--wheels")
    parser.add_argument("--nvidia-ctk", dest="nvidia_ctk")
    parser.add_argument("--budget-s", type=float, default=110.0)
    opts = parser.parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(opts.budget_s)
    env = dict(os.environ)
    record: dict = {"install": install(opts.wheels, env), "root": opts.root}
    standins = Path(tempfile.mkdtemp(prefix="podvm-gpu-device-"))
    (standins / "nvidia-persistenced").write_text(PERSISTENCED_STANDIN)
    (standins / "nvidia-persistenced").chmod(0o755)
    if opts.nvidia_ctk:
        shutil.copy(opts.nvidia_ctk, standins / "nvidia-ctk")
        (standins / "nvidia-ctk").chmod(0o755)
    env["PATH"] = f"{standins}{os.pathsep}{env.get('PATH', '')}"

    capture = []
    for argv in allowed():
        if not clock.allows(" ".join(argv), 2 * CALL_TIMEOUT_S / 10):
            continue
        capture.append(run_one(argv, env, min(CALL_TIMEOUT_S, max(clock.left() - 1, 1))))
    (out / "nvidia-smi-capture.json").write_text(json.dumps(capture, indent=1) + "\n")
    timings: dict = {"alone": {" ".join(e["argv"]): e["seconds"] for e in capture}}
    timings["side_by_side"] = {}
    for n in SIDE_BY_SIDE:
        if clock.allows(f"fabric query x{n}", 5):
            timings["side_by_side"][f"{n} x fabric query"] = side_by_side(smi.fabric_argv(), n, env)
    root = ["--root", opts.root]
    for name, args, keep in (("boot", ["boot", *root, "--json"], "podvm-gpu-status.json"),
                             ("check", ["check", *root, "--json"], "check.json"),
                             ("status", ["status", *root, "--json"], "status.json"),
                             ("metrics", ["metrics", *root], "metrics.txt")):
        if not clock.allows(name, 5):
            continue
        done = agent(args, env, min(COMMAND_TIMEOUT_S, clock.left()))
        timings[f"podvm-gpu {name}"] = done["seconds"]
        record[name] = {k: done[k] for k in ("args", "exit", "seconds", "stderr")}
        (out / keep).write_text(done["stdout"])
    driver = next((e["stdout"] for e in capture if e["argv"] == ["nvidia-smi", "--version"]), "")
    record.update(skipped=clock.skipped, driver=driver.strip(),
                  seconds=round(opts.budget_s - clock.left(), 2))
    (out / "timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    (out / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(standins, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
