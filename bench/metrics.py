"""Benchmark of the metrics exporter (issue 11): scrape time, resident memory, once start-up.

Goals: a scrape of 8 GPUs (fake NVML, tests/fake_nvml) under 50 ms median over HTTP; the
serving exporter's resident memory under 60 MB; ``podvm-gpu metrics`` once, on a GPU-less VM
(a no-gpu boot's root), at most 10 x ``-c pass`` of the same interpreter, alternately, median.

Usage: ``python bench/metrics.py [--scrapes N] [--pairs N] [--fresh-venv PYTHON]``.
``--fresh-venv /usr/bin/python3`` first makes a throw-away venv with that interpreter and a plain
install of this checkout with its dependencies, as an image gets it; otherwise the interpreter
running this script is measured; the once command is that venv's ``podvm-gpu metrics``. Needs gcc for the
fake library. Prints the figures and the verdicts; exits 3 when a goal is missed (1: a crash).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCRAPE_GOAL_MS, RSS_GOAL_MB, ONCE_GOAL = 50.0, 60.0, 10.0
# A pod VM's kernel log is a few thousand records; most are not about GPUs.
KERNEL_LOG = [f"virtio_net virtio{i % 4}: rx queue {i} enabled" for i in range(1500)] + [
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build",
    "NVRM: Xid (PCI:0000:28:00): 13, pid=1234, name=python3, Graphics Exception."]


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def fresh_venv(python: str, where: str) -> str:
    """A venv of ``python`` with this checkout and its dependencies installed; its python."""
    subprocess.run([python, "-m", "venv", "--without-pip", where], check=True)
    venv_python = os.path.join(where, "bin", "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", venv_python, "install", "-q", str(REPO)],
                   check=True)
    return venv_python


def once_command(python: str, root: str) -> tuple[list[str], str]:
    """``podvm-gpu metrics`` of the venv's command."""
    script = os.path.join(os.path.dirname(python), "podvm-gpu")
    return [script, "metrics", "--root", root], "podvm-gpu metrics"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def bench_scrapes(python: str, tmp: Path, scrapes: int) -> tuple[list[float], float]:
    sys.path.insert(0, str(REPO / "tests"))
    import fake_nvml

    lib = fake_nvml.build(tmp / "build")
    root = fake_nvml.make_root(tmp / "gpu-root", lib, kernel_log=KERNEL_LOG)
    desc = fake_nvml.describe(tmp / "desc", [fake_nvml.gpu(i) for i in range(8)])
    proc = subprocess.Popen([python, "-m", "podvm_gpu.metrics", "--root", str(root), "--listen",
                             "127.0.0.1:0"], stderr=subprocess.PIPE, text=True,
                            env=fake_nvml.metrics_env(desc))
    try:
        line = proc.stderr.readline()
        url = line.split("serving ", 1)[1].strip()
        times = []
        for i in range(scrapes + 3):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = resp.read()
            if i >= 3:  # the first scrapes initialise NVML and warm the caches
                times.append(time.perf_counter() - t0)
        assert b'DCGM_FI_DEV_GPU_TEMP{' in body and body.count(b"DCGM_FI_DEV_GPU_TEMP{") == 8
        return times, rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--fresh-venv", metavar="PYTHON", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="podvm-gpu-metrics-bench-",
                                     dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as t:
        tmp = Path(t)
        python = fresh_venv(args.fresh_venv, str(tmp / "venv")) if args.fresh_venv else sys.executable
        scrape_times, rss = bench_scrapes(python, tmp, args.scrapes)
        root = tmp / "cpu-root"
        root.mkdir()
        subprocess.run([python, "-m", "podvm_gpu", "boot", "--root", str(root)], check=True,
                       capture_output=True)
        command, name = once_command(python, str(root))
        base, once = [], []
        for i in range(args.pairs + 3):
            b, o = timed([python, "-c", "pass"]), timed(command)
            if i >= 3:
                base.append(b)
                once.append(o)
    scrape_ms = statistics.median(scrape_times) * 1000
    b, o = statistics.median(base), statistics.median(once)
    ratio = o / b
    verdicts = [scrape_ms <= SCRAPE_GOAL_MS, rss <= RSS_GOAL_MB, ratio <= ONCE_GOAL]
    print(f"interpreter        {python}")
    print(f"scrape, 8 GPUs     median {scrape_ms:.1f} ms, max {max(scrape_times) * 1000:.1f} ms "
          f"over {len(scrape_times)} HTTP scrapes (goal <= {SCRAPE_GOAL_MS:g} ms)")
    print(f"exporter RSS       {rss:.1f} MB after the scrapes (goal <= {RSS_GOAL_MB:g} MB)")
    print(f"once command       {name} (GPU-less root: no-gpu boot)")
    print(f"-c pass median     {b * 1000:.1f} ms  (min {min(base) * 1000:.1f})")
    print(f"once median        {o * 1000:.1f} ms  (min {min(once) * 1000:.1f})")
    print(f"ratio              {ratio:.2f}  (goal <= {ONCE_GOAL:g})")
    print("verdict            " + ("ok" if all(verdicts) else "OVER GOAL"))
    return 0 if all(verdicts) else 3


if __name__ == "__main__":
    sys.exit(main())
