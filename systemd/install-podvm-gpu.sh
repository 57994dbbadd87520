#!/bin/sh
# Install podvm-gpu into the image this script runs in (as root: in the image's chroot, in an
# mkosi post-install script, or on the VM a Packer builder booted). It runs from a bundle made
# by make-bundle.sh and needs only the image's own python3: the venv gets no pip of its own
# (no ensurepip, so Debian/Ubuntu need no python3-venv package); pip runs from the bundle's
# pip wheel, and the agent's venv holds the agent and its dependencies only.
#
#   /opt/podvm-gpu                  venv with the agent (installed with pip --no-index)
#   /usr/local/bin/podvm-gpu        link for engineers
#   /usr/lib/systemd/system/podvm-gpu.service, enabled (multi-user.target.wants)
#   /usr/lib/systemd/system/podvm-gpu-watch.service, enabled (runs after a ready boot)
#   /usr/lib/systemd/system/podvm-gpu-metrics.service, disabled (the image enables it if wanted)
#   /usr/lib/systemd/system/podvm-gpu-pod-labels.service, enabled into the metrics unit's wants
#   /usr/lib/systemd/system/kata-agent.service.d/10-podvm-gpu.conf
#   /usr/lib/systemd/system/attestation-agent.service.d/10-podvm-gpu.conf
#   /usr/lib/systemd/system-preset/40-podvm-gpu.preset
#   nvidia-cdi-refresh.path/.service masked: only the agent writes /var/run/cdi/nvidia.yaml
#   nvidia-persistenced.service and nvidia-fabricmanager.service disabled where installed:
#   the agent starts both daemons itself (docs/install.md says why)
#
# environment: PODVM_GPU_PYTHON  the image's interpreter (default python3; needs 3.11 or later)
set -eu

bundle=$(cd "$(dirname "$0")" && pwd)
python=${PODVM_GPU_PYTHON:-python3}
prefix=/opt/podvm-gpu
unitdir=/usr/lib/systemd/system

pip_wheel=$(ls "$bundle"/wheels/pip-*.whl)
"$python" -m venv --clear --without-pip "$prefix"
# The bytecode pip compiles here matters: the unit's file system is read-only at run time
# (ProtectSystem=strict), and the CPU fast path should not compile on every boot.
"$prefix/bin/python" "$pip_wheel/pip" install --quiet --no-index --no-cache-dir \
    --disable-pip-version-check --find-links "$bundle/wheels" podvm-gpu
mkdir -p /usr/local/bin
ln -sfn "$prefix/bin/podvm-gpu" /usr/local/bin/podvm-gpu

install -D -m 0644 "$bundle/podvm-gpu.service" "$unitdir/podvm-gpu.service"
install -D -m 0644 "$bundle/podvm-gpu-watch.service" "$unitdir/podvm-gpu-watch.service"
install -D -m 0644 "$bundle/podvm-gpu-metrics.service" "$unitdir/podvm-gpu-metrics.service"
install -D -m 0644 "$bundle/podvm-gpu-pod-labels.service" "$unitdir/podvm-gpu-pod-labels.service"
install -D -m 0644 "$bundle/10-podvm-gpu.conf" "$unitdir/kata-agent.service.d/10-podvm-gpu.conf"
install -D -m 0644 "$bundle/attestation-agent-10-podvm-gpu.conf" \
    "$unitdir/attestation-agent.service.d/10-podvm-gpu.conf"
install -D -m 0644 "$bundle/podvm-gpu.preset" /usr/lib/systemd/system-preset/40-podvm-gpu.preset

# A config already in the image is checked now (an invalid one fails the build) and compiled:
# boot then reads it without PyYAML (docs/operating.md, "Config"). After a later change to it, run
# "podvm-gpu config --compile" again (check --image warns about a stale compiled form).
if [ -e /etc/podvm-gpu/config.yaml ]; then
    "$prefix/bin/podvm-gpu" config --compile
fi

systemctl enable podvm-gpu.service
systemctl enable podvm-gpu-watch.service  # its ExecCondition= skips it after a failed boot
systemctl enable podvm-gpu-pod-labels.service  # runs only with the metrics unit (WantedBy=)
systemctl mask nvidia-cdi-refresh.path nvidia-cdi-refresh.service
for unit in nvidia-persistenced.service nvidia-fabricmanager.service; do
    if systemctl is-enabled --quiet "$unit" 2>/dev/null; then
        systemctl disable "$unit"
    fi
done
