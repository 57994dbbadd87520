"""Scenario harness: runs the field cases (``cases/*.yaml``) through the real ``podvm-gpu`` command.

Layout:

- ``world.py``: loads a case, builds its world (fake root, fake tools, umockdev PCI tree, state),
  runs the product in it and ends every process the world started.
- ``expect.py``: judges a run against the case's ``expect`` block and writes the failure report.
- ``effects.py``: the world's state and the effect vocabulary (``EFFECTS-harness.md``).
- ``testbed.py``: umockdev records (VMBus channels, PCI devices), devices added to a live
  testbed, uevents sent to the product's libudev monitors.
- ``fake_tool.py``: the program behind every fake tool in the world's ``bin/``.

``effects.py``, ``testbed.py`` and ``fake_tool.py`` use the standard library only: the fake
tools import them at every call. Keep this file free of imports for the same reason.
"""
