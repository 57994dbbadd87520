"""The ``fabricmanager`` step's room: the step (step.py), the VM's fabric kind from PCI
(fabric_kind.py), the NVLink 5 path before the fabric manager (nvl5.py) and the reader of the
GPUs' fabric state (parse.py). What the NVLink 5 path reads from sysfs and /dev is the host's
(podvm_gpu/host/infiniband.py).

Importing a part of the room does not import the step: the step list (podvm_gpu/steps/__init__.py)
is the only place that names ``step``.
"""
