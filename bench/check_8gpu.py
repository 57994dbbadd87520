"""Benchmark: ``podvm-gpu check`` on the 8 x H200 + 4 NVSwitch scenario with instant fake tools.

Goal (issue 4): at most 1 s of wall time. The field case P03 is booted once through the scenario
harness (tests/scenarios: umockdev PCI tree, fake tools that answer at once), then ``check`` runs
N times on the booted root. Printed: the median and worst wall time of the whole ``check``
process as the harness runs it (inside ``umockdev-run``), and of ``umockdev-run -- true`` alone,
so the agent's own share can be read off.

Usage: ``.venv/bin/python bench/check_8gpu.py [--runs N]``; exits 3 when the median is over 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from scenarios.world import DATA, SHARED, World, load_case  # noqa: E402

GOAL_S = 1.0
CASE = "P03-hgx-h200-8gpu-4nvswitch-ready.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    path = next(p for p in (SHARED / "cases" / CASE, DATA / "cases" / CASE) if p.exists())
    walls, checks = [], None
    with World(load_case(path)) as world:
        boot = world.run("boot")
        assert (boot.status or {}).get("state") == "ready", "P03 must boot ready first"
        for _ in range(args.runs):
            run = world.run("check")
            walls.append(run.wall_s)
            checks = json.loads(run.stdout)["summary"]
        bare = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([shutil.which("umockdev-run"), "-d", world.layout.tree, "--", "true"],
                           check=True)
            bare.append(time.perf_counter() - t0)
    median = statistics.median(walls)
    print(f"case                       {path.name}")
    print(f"runs                       {args.runs}")
    print(f"check summary              {checks}")
    print(f"check wall median          {median:.3f} s  (worst {max(walls):.3f} s)")
    print(f"umockdev-run -- true       {statistics.median(bare):.3f} s")
    print(f"check minus umockdev       {median - statistics.median(bare):.3f} s")
    print(f"verdict                    {'ok' if median <= GOAL_S else 'OVER GOAL'} (goal <= {GOAL_S} s)")
    return 0 if median <= GOAL_S else 3


if __name__ == "__main__":
    sys.exit(main())
