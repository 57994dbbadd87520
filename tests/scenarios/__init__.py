"""Scenario harness: runs the field cases (``cases/*.yaml``) through the real ``podvm-gpu`` command.

Layout:

- ``world.py``: loads a case, builds its world (fake root, fake tools, umockdev PCI tree, state),
  runs the product in it and ends every process the world started.
- ``expect.py``: judges a run against the case's ``expect`` block and writes the failure report.
- ``effects.py``: the world's state and the effect vocabulary (``EFFECTS-harness.md``).
- ``testbed.py``: umockdev records (VMBus channels, PCI devices), devices added to a live
  testbed, uevents sent to the product's libudev monitors.
- ``fake_tool.py``: what every fake tool in the world's ``bin/`` answers.
- ``fake_server.py``, ``fake_client.c``: how a fake tool call reaches ``fake_tool.py`` (one
  server per test process, a forked worker per call, a static C client as the fake's interpreter).

``effects.py``, ``testbed.py``, ``imex_ctk.py``, ``fake_tool.py`` and ``fake_server.py`` use the
standard library only: the server runs them with ``python -IS``. Keep this file free of imports
for the same reason.
"""
