"""The ``cdi`` step's room: the step (step.py: generate, validate, install the spec) and the
health gate between generation and installation (health.py). The spec itself is podvm_gpu/cdi/.

Importing a part of the room does not import the step: the step list (podvm_gpu/steps/__init__.py)
is the only place that names ``step``.
"""
