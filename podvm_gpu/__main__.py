import sys

from podvm_gpu.cli import main

sys.exit(main())
