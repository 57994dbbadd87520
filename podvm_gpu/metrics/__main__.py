"""``python -m podvm_gpu.metrics``: the same as ``podvm-gpu metrics`` (``python -m podvm_gpu
metrics``), which this process becomes: one parser for the command (cli.py), and the metrics
package imports nothing above it (docs/design.md, "Layers"). The interpreter's own options
(``-X``, ``-I``, ...) are passed on; the pid stays the same (a service manager or a test that
signals it sees no difference).
"""

import os
import sys

_interpreter = sys.orig_argv[1:sys.orig_argv.index("-m")] if "-m" in sys.orig_argv else []
os.execv(sys.executable, [sys.executable, *_interpreter, "-m", "podvm_gpu", "metrics", *sys.argv[1:]])
