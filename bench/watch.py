"""Benchmark of ``podvm-gpu watch`` (issue 34): what the watcher costs while nothing happens,
how its memory stands after many kernel log records, and how fast it reacts to one.

In a scenario world (tests/scenarios: the P02 case, one H100, the fake tools) after a ready
boot, with the default ``watch.interval_s`` (60 s):

- idle CPU: the watcher's own CPU time (``/proc/<pid>/stat`` utime + stime, its threads
  included; the fake nvidia-smi it runs at each poll is another process and not counted) over
  ``--idle-s`` seconds (default 65: at least one poll), as CPU-seconds per hour;
- RSS: ``VmRSS`` after the watcher started; after a first 1,000 kernel records (its one-time
  costs: the kernel log patterns compiled on their first match, the first warning's status
  write); and after ``--records`` (10,000) more, ordinary lines and repeated Xid 13 warnings,
  read and judged (``records_seen_s``: until watch.json's position, saved at most every 10 s
  while records arrive, reached the last);
- reaction: from an Xid 79 record appended to the log to status.json turned ``failed`` (the
  spec is written just before), ``--reactions`` times (a world each), median and worst.

Goals: idle at most 36 CPU-seconds an hour (1 % of a core); RSS after the 10,000 records at
most 10 % above what it was after the first 1,000 (bounded memory); reaction median under 1 s.

Usage: ``python bench/watch.py [--idle-s S] [--records N] [--reactions N] [--json FILE]``.
Prints the figures and the verdicts; exits 3 when a goal is missed (1: a crash). The figures
depend on the machine's load: say what it was when you quote them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

IDLE_GOAL_CPU_S_PER_H, RSS_GROWTH_GOAL_PCT, REACTION_GOAL_S = 36.0, 10.0, 1.0
XID_79 = "NVRM: Xid (PCI:0000:00:04): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:00:04): 13, pid=4242, name=python3, Graphics Exception: ESR 0x404490"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def watched_world(config: str = ""):
    from scenarios.world import World
    from test_watch import case, start_watch, stderr_of, watching

    world = World(case("P02", config or None))
    run = world.run("boot")
    if not run.status or run.status["state"] != "ready":
        world.close()
        raise SystemExit(f"the boot did not end ready: {run.stderr[-2000:]}")
    proc = start_watch(world)
    if not watching(world, proc):
        world.close()
        raise SystemExit(f"the watcher did not start: {stderr_of(world)[-2000:]}")
    return world, proc


def idle_and_memory(idle_s: float, records: int) -> dict:
    from test_watch import next_seq, stop

    world, proc = watched_world()
    try:
        time.sleep(1)
        rss_start = rss_mb(proc.pid)
        cpu0 = cpu_s(proc.pid)
        time.sleep(idle_s)
        cpu = cpu_s(proc.pid) - cpu0
        log = Path(world.path("/dev/kmsg"))
        doc_path = Path(world.path("/run/podvm-gpu/watch.json"))

        def feed(count: int) -> float:
            seq = next_seq(log)
            started = time.monotonic()
            with log.open("a") as f:
                for n in range(count):
                    message = XID_13 if n % 10 == 0 else f"virtio_net virtio0 eth0: record {n}"
                    f.write(f"{3 if n % 10 == 0 else 6},{seq + n},{n},-;{message}\n")
                    if n % 1000 == 999:
                        f.flush()
            while time.monotonic() - started < 60:
                if json.loads(doc_path.read_text()).get("kmsg_seq") == seq + count - 1:
                    break
                time.sleep(0.05)
            time.sleep(0.5)
            return time.monotonic() - started

        feed(1000)
        rss_warm = rss_mb(proc.pid)
        read_s = feed(records)
        rss_after = rss_mb(proc.pid)
        alive = proc.poll() is None
    finally:
        stop(proc)
        world.close()
    return {"idle_s": idle_s, "idle_cpu_s": round(cpu, 3),
            "idle_cpu_s_per_hour": round(cpu / idle_s * 3600, 2),
            "rss_start_mb": round(rss_start, 1), "rss_after_1000_records_mb": round(rss_warm, 1),
            "records": records, "records_seen_s": round(read_s, 2),
            "rss_after_records_mb": round(rss_after, 1),
            "rss_growth_pct": round((rss_after - rss_warm) / rss_warm * 100, 1),
            "alive_after_records": alive}


def reactions(count: int) -> list[float]:
    from test_watch import append_kmsg, stop

    out = []
    for _ in range(count):
        world, proc = watched_world("watch:\n  interval_s: 3600\n")
        try:
            status = Path(world.path("/run/podvm-gpu/status.json"))
            append_kmsg(world, XID_79)
            sent = time.monotonic()
            while time.monotonic() - sent < 30:
                if b'"state": "failed"' in status.read_bytes():
                    break
                time.sleep(0.002)
            out.append(round(time.monotonic() - sent, 4))
        finally:
            stop(proc)
            world.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-s", type=float, default=65.0)
    parser.add_argument("--records", type=int, default=10000)
    parser.add_argument("--reactions", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    before = load()
    figures = idle_and_memory(args.idle_s, args.records)
    times = reactions(args.reactions)
    figures.update({"reaction_s": times, "reaction_median_s": statistics.median(times),
                    "reaction_worst_s": max(times), "load_before": before, "load_after": load()})
    verdicts = {
        "idle": figures["idle_cpu_s_per_hour"] <= IDLE_GOAL_CPU_S_PER_H,
        "memory": figures["rss_growth_pct"] <= RSS_GROWTH_GOAL_PCT and figures[
            "alive_after_records"],
        "reaction": figures["reaction_median_s"] < REACTION_GOAL_S}
    for key, value in figures.items():
        print(f"{key}: {value}")
    for key, ok in verdicts.items():
        print(f"goal {key}: {'met' if ok else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "verdicts": verdicts}, indent=2)
                             + "\n")
    return 0 if all(verdicts.values()) else 3


if __name__ == "__main__":
    sys.exit(main())
