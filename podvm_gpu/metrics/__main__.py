"""``python -m podvm_gpu.metrics``: the exporter's command line (see ``command.main``)."""

import sys

from podvm_gpu.metrics.command import main

sys.exit(main())
