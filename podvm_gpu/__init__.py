"""podvm-gpu: the GPU boot agent of a confidential-containers pod VM.

Kept tiny on purpose: the CPU fast path imports this package on every pod VM boot.
"""

__version__ = "0.1.0"
