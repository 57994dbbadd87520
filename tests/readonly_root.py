"""Run a podvm-gpu command with its ``--root`` bind-mounted read-only (a test helper).

Usage (inside a private mount namespace): ``unshare -m --propagation private python
tests/readonly_root.py -- <command ...> --root DIR ...``. Any write the command tries under DIR
fails with EROFS, so a command that completes normally has written nothing there.
"""

import os
import shutil
import subprocess
import sys

# PATH holds only the fake tools in a scenario world: find mount where the system keeps it.
MOUNT = shutil.which("mount", path="/usr/bin:/bin:/usr/sbin:/sbin") or "mount"


def main() -> None:
    command = sys.argv[sys.argv.index("--") + 1:]
    root = command[command.index("--root") + 1]
    subprocess.run([MOUNT, "--bind", root, root], check=True)
    subprocess.run([MOUNT, "-o", "remount,bind,ro", root, root], check=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
