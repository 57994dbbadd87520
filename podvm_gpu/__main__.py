import sys

try:
    from podvm_gpu.cli import main
except KeyboardInterrupt:  # Ctrl-C while the program loads: one line, no traceback; a boot
    # has written nothing yet (docs/interface.md 1.3: boot exits 1, any other command 130)
    print("podvm-gpu: interrupted while starting", file=sys.stderr)
    sys.exit(1 if sys.argv[1:2] == ["boot"] else 130)

sys.exit(main())
