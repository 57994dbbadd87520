"""Runs inside the booted test image before the kata-agent stand-in (its ExecStartPre): scrapes
podvm-gpu-metrics.service on loopback until it answers, waits for its textfile, and leaves what
it found (and kernel.dmesg_restrict) under /var/lib/podvm-gpu-metrics-test for the test to read.
The image's python3, standard library only; bounded in time (TCG runs Python about 20x slower
than this host).
"""

import os
import subprocess
import time
import urllib.request

OUT = "/var/lib/podvm-gpu-metrics-test"
WANT = "podvm_gpu_kernel_log_records "


def save(name: str, text: str) -> None:
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        f.write(text)


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    with open("/proc/sys/kernel/dmesg_restrict", encoding="ascii") as f:
        save("dmesg_restrict.txt", f.read())
    deadline = time.monotonic() + 150
    body, textfile = "", ""
    while time.monotonic() < deadline and WANT not in body:
        try:
            with urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=60) as resp:
                body = resp.read().decode()
        except OSError as err:
            body = f"# scrape failed: {err}\n"
            time.sleep(1)
    while time.monotonic() < deadline and WANT not in textfile:
        try:
            with open("/run/podvm-gpu/metrics.prom", encoding="utf-8") as f:
                textfile = f.read()
        except OSError:
            time.sleep(1)
    save("scrape.txt", body)
    save("textfile.prom", textfile)
    for name, argv in (("unit.txt", ["systemctl", "show", "podvm-gpu-metrics.service", "-p",
                                     "ActiveState,SubState,NRestarts,ExecMainStatus,User"]),
                       ("journal.txt", ["journalctl", "-b", "--no-pager", "-u",
                                        "podvm-gpu-metrics.service"])):
        save(name, subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout)


if __name__ == "__main__":
    main()
