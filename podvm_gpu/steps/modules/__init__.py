"""The ``modules`` step's room: the step (step.py), why the driver cannot attach a GPU
(attach.py), what DKMS did with the module sources (dkms.py) and whether a kernel can load its
xz-compressed modules (modcompress.py). What ``modprobe`` loads is read by the host
(podvm_gpu/host/kmod.py), which the versions step and the NVLink 5 path read too.

Importing a part of the room does not import the step: the step list (podvm_gpu/steps/__init__.py)
is the only place that names ``step``.
"""
