"""Build the cached test images ahead of the tests, side by side: ``python tests/boot/build_images.py
[NAME ...]`` (default: all). ``.ci/run`` starts it in the background before the benchmarks and the
fast tests, so the image builds (downloads, dpkg, DKMS compiles) overlap with work that needs no
image; a test that wants an image still running its build waits on that variant's lock
(image.variant_rootfs). Prints one line per image: its name, folder and seconds; exits 1 if any
build failed (the tests that need it then fail with mmdebstrap's message).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from boot import image, real_driver  # noqa: E402

VARIANTS = {v.name: v for v in (image.BASE, image.TRIXIE_BASE, real_driver.NVIDIA, real_driver.OPEN,
                                real_driver.TRIXIE)}
# The bases first (the first boot tests need them; about a minute each), then the DKMS images;
# the Debian 13 one last (its tests come late in the run).
ORDER = ("base", "trixie-base", "nvidia", "open", "trixie-open")


def build(name: str, failures: list[str]) -> None:
    started = time.monotonic()
    try:
        path = image.variant_rootfs(VARIANTS[name])
    except BaseException as err:  # pytest.fail raises an Exception subclass outside tests too
        failures.append(name)
        print(f"{name}: build failed after {time.monotonic() - started:.0f} s: {err}", flush=True)
        return
    print(f"{name}: {path} ready after {time.monotonic() - started:.0f} s", flush=True)


def main(names: list[str]) -> int:
    names = names or list(ORDER)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(ORDER)}", file=sys.stderr)
        return 2
    # Cache keys first, one at a time: each resolves versions with apt against the cache's lists.
    for name in names:
        VARIANTS[name].key()
    failures: list[str] = []
    # Two builds at a time: one compiles (DKMS) while the other downloads and unpacks.
    threads: list[threading.Thread] = []
    for name in names:
        while sum(t.is_alive() for t in threads) >= 2:
            time.sleep(1)
        thread = threading.Thread(target=build, args=(name, failures))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
