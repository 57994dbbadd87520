"""Run the real NVIDIA programs of the real-driver image inside a booted VM and record what they did.

Runs as ``podvm-gpu-capture.service`` in a qemu boot of the real-driver image (see
tests/boot/real/capture.py, which installs it and reads the result back). Each command entry of a plan
(``/usr/local/lib/podvm-gpu-capture/plan.json``) is one command as the agent runs it, argv only,
with a timeout; the record keeps its exit status, stdout, stderr, the kernel-log records the
kernel wrote while it ran (``/dev/kmsg``, raw, with their ``prio,seq,usec,flags;`` prefix) and,
for daemons, what journald got from them (syslog lines only a real journald has). Other entries
read files (``read``: glob patterns) or change the guest between commands (``write``,
``remove``), so no shell is needed. Writes
``/var/lib/podvm-gpu-capture/result.json``. Standard library only: the image's own python3.
"""

import json
import os
import subprocess
import sys
import time

PLAN = "/usr/local/lib/podvm-gpu-capture/plan.json"
OUT = "/var/lib/podvm-gpu-capture"


def kmsg_records():
    """Every record in the kernel log now, raw (continuation lines dropped)."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue
            if not chunk:
                break
            records.extend(line for line in chunk.decode(errors="replace").splitlines()
                           if line and not line.startswith(" "))
    finally:
        os.close(fd)
    return records


def seq(record):
    return int(record.split(",", 2)[1])


def journal_entries(identifier):
    """Every journal entry of this boot under a syslog identifier."""
    out = subprocess.run(["journalctl", "-b", "--no-pager", "-o", "json", f"SYSLOG_IDENTIFIER={identifier}"],
                         capture_output=True, text=True, timeout=30).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def files_of(patterns):
    """path -> text (or link target, ``-> target``) of every file the glob patterns match."""
    import glob

    found = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern, recursive=True)):
            if os.path.islink(path):
                found[path] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                try:
                    with open(path, errors="replace") as f:
                        found[path] = f.read(65536)
                except OSError as err:  # sysfs attributes that only root-writes (uevent)
                    found[path] = f"! {err.strerror}"
    return found


def change(entry):
    """A plan entry that changes the guest instead of running a command: write or remove a file."""
    if "write" in entry:
        os.makedirs(os.path.dirname(entry["write"]), exist_ok=True)
        with open(entry["write"], "w") as f:
            f.write(entry["text"])
    else:
        os.unlink(entry["remove"])
    return {"name": entry["name"], "changed": entry.get("write") or entry["remove"]}


def run_one(entry):
    if "read" in entry:
        return {"name": entry["name"], "files": files_of(entry["read"])}
    if "write" in entry or "remove" in entry:
        return change(entry)
    before = kmsg_records()
    last = seq(before[-1]) if before else -1
    since_us = time.time_ns() // 1000
    started = time.monotonic()
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    try:
        done = subprocess.run(entry["argv"], capture_output=True, text=True, errors="replace",
                              timeout=entry.get("timeout", 60), env=env, stdin=subprocess.DEVNULL)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as err:
        rc, stdout, stderr = "timeout", (err.stdout or b"").decode(errors="replace"), \
            (err.stderr or b"").decode(errors="replace")
    except OSError as err:
        rc, stdout, stderr = "oserror", "", str(err)
    took = time.monotonic() - started
    time.sleep(entry.get("settle", 0))
    record = {"name": entry["name"], "argv": entry["argv"], "rc": rc, "stdout": stdout,
              "stderr": stderr, "duration_s": round(took, 3),
              "kmsg": [r for r in kmsg_records() if seq(r) > last]}
    if entry.get("journal"):
        record["journal_window_us"] = [since_us, time.time_ns() // 1000]
    return record


def attach_journal(plan, runs):
    """Give each daemon run the journal entries its syslog identifier got while it ran. Read once
    at the end: journald writes the syslog lines asynchronously, a query right after the run can
    miss the first ones."""
    for entry, run in zip(plan, runs):
        if not entry.get("journal"):
            continue
        low, high = run.pop("journal_window_us")
        run["journal"] = [{k: e.get(k) for k in ("SYSLOG_IDENTIFIER", "PRIORITY", "SYSLOG_FACILITY",
                                                 "MESSAGE", "_PID")}
                          for e in journal_entries(entry["journal"])
                          if low <= int(e["__REALTIME_TIMESTAMP"]) <= high]


def main():
    with open(PLAN) as f:
        plan = json.load(f)
    results = {"kernel_log_at_start": kmsg_records(), "runs": []}
    for entry in plan:
        results["runs"].append(run_one(entry))
    time.sleep(1)
    attach_journal(plan, results["runs"])
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "result.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
