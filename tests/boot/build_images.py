"""Build the cached test images ahead of the tests: ``python tests/boot/build_images.py [--jobs N]
[NAME ...]`` (default: all, one at a time). ``.ci/run`` starts it in the background beside the
tests, so the image builds (downloads, dpkg, DKMS compiles) overlap with tests that need no
image; a test that wants an image still being built waits on that variant's lock
(image.variant_rootfs). On 2 cores two builds at once save little (DKMS compiles with make -j2)
and slow the tests beside them. Prints one line per image: its name, folder and seconds; exits 1
if any build failed (the tests that need it then fail with mmdebstrap's message). First (about
20 s from an empty cache, nothing when warm) it fetches NVIDIA's real nvidia-smi builds
(tests/realsmi/fetch.py) for tests/test_real_nvidia_smi.py, unless names are given.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from boot import image, real_driver  # noqa: E402
from realsmi import fetch as realsmi  # noqa: E402

VARIANTS = {v.name: v for v in (image.BASE, image.TRIXIE_BASE, real_driver.NVIDIA, real_driver.OPEN,
                                real_driver.TRIXIE, real_driver.BOTH)}
# The bases first (the first boot tests need them; about a minute each), then the DKMS images;
# the Debian 13 one, then Debian 12 with both module packages (issue 46 item 7: 387 s to build
# here, which tests/test_module_flavour.py would otherwise spend inside the test run) last.
ORDER = ("base", "trixie-base", "nvidia", "open", "trixie-open", "both")


def build(name: str, failures: list[str]) -> None:
    started = time.monotonic()
    try:
        path = image.variant_rootfs(VARIANTS[name])
    except BaseException as err:  # pytest.fail raises an Exception subclass outside tests too
        failures.append(name)
        print(f"{name}: build failed after {time.monotonic() - started:.0f} s: {err}", flush=True)
        return
    print(f"{name}: {path} ready after {time.monotonic() - started:.0f} s", flush=True)


def main(args: list[str]) -> int:
    jobs = 1
    if args[:1] == ["--jobs"] and len(args) > 1:
        jobs, args = int(args[1]), args[2:]
    names = args or list(ORDER)
    realsmi_failed = False
    if not args:
        realsmi_failed = realsmi.main() != 0
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(ORDER)}", file=sys.stderr)
        return 2
    # Cache keys first, one at a time: each resolves versions with apt against the cache's lists.
    for name in names:
        VARIANTS[name].key()
    failures: list[str] = []
    threads: list[threading.Thread] = []
    for name in names:
        while sum(t.is_alive() for t in threads) >= jobs:
            time.sleep(1)
        thread = threading.Thread(target=build, args=(name, failures))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return 1 if failures or realsmi_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
