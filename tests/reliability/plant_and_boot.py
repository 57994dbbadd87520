"""Launcher for the symlink and permission attacks: ``python plant_and_boot.py boot ...``.

Plants the links named in ``PODVM_GPU_PLANT`` (JSON: ``{"<path under the root>": "<target>"}``,
replacing a file that is there,
``{pid}`` in a path replaced by this process's pid, which the product keeps: atomic writes name
their temporary files after it), sets the umask ``PODVM_GPU_UMASK`` (octal) when given, then
execs ``python -m podvm_gpu`` with the same arguments, so the product runs with this pid.
Standard library only; it runs as the harness's ``PODVM_GPU_CMD``.
"""

import json
import os
import sys

root = sys.argv[sys.argv.index("--root") + 1]
for path, target in json.loads(os.environ.get("PODVM_GPU_PLANT", "{}")).items():
    link = os.path.join(root, path.format(pid=os.getpid()).lstrip("/"))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.unlink(link)  # a file of the world (its /dev/kmsg) is replaced by the link
    os.symlink(target, link)
if os.environ.get("PODVM_GPU_UMASK"):
    os.umask(int(os.environ["PODVM_GPU_UMASK"], 8))
os.execv(sys.executable, [sys.executable, "-m", "podvm_gpu", *sys.argv[1:]])
