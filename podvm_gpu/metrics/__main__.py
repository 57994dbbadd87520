"""``python -m podvm_gpu.metrics``: the same as ``podvm-gpu metrics``."""

import sys

from podvm_gpu.cli import main

sys.exit(main(["metrics", *sys.argv[1:]]))
