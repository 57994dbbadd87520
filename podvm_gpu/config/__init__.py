"""The optional config file ``/etc/podvm-gpu/config.yaml`` (contract section 7).

Rooms: :mod:`~podvm_gpu.config.fields` (how a value is checked), :mod:`~podvm_gpu.config.model`
(the sections, their keys and defaults), :mod:`~podvm_gpu.config.load` (finding, trusting,
reading and compiling the file), :mod:`~podvm_gpu.config.command` (``podvm-gpu config``).

Every key has a default; unknown keys are errors that name the key. The keys ``budget_s``,
``timeouts``, ``persistenced``, ``confidential_computing`` and ``unavailable_spec`` are fixed by
the contract (the field cases use them); the rest are this project's. One contract default
was changed on purpose: ``confidential_computing.set_ready_state`` is true since issue 26 (it
was false), so a pod VM's GPUs get their ready state at boot, after attestation in a
confidential guest; an image that left it to another component says ``set_ready_state:
false`` (docs/interface.md 3.11, "Migration"; docs/operating.md).

The validator is a small table of fields rather than a pydantic model: every CPU pod VM whose
image ships a config file validates it at boot, before kata-agent starts, and importing pydantic
and building the models cost about 100 ms and 180 ms here (``python -c pass`` is 13-16 ms; see
bench/run.py). Only the standard library is imported at the top; PyYAML when a file is read.
Values are taken strictly: a boolean is not a number, a string is not a number, a number is not
a boolean (YAML's ``true`` would otherwise read as 1 second, ``"30"`` as 30).
"""
