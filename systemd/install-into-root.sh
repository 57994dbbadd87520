#!/bin/sh
# Install podvm-gpu into an image that is a directory tree on the build host (a Packer "null"
# build, a debootstrap/mmdebstrap root, an unpacked disk image). The bundle's installer runs
# inside the tree with systemd-nspawn, so the venv is made by the image's own python3 and
# systemctl enables the units offline; the bundle is bind-mounted, not copied in.
#
# usage: install-into-root.sh ROOT BUNDLE    (as root; needs systemd-nspawn)
set -eu

root=${1:?usage: install-into-root.sh ROOT BUNDLE}
bundle=$(cd "${2:?usage: install-into-root.sh ROOT BUNDLE}" && pwd)

exec systemd-nspawn --quiet --register=no --keep-unit --directory="$root" \
    --bind-ro="$bundle:/run/podvm-gpu-bundle" \
    /bin/sh /run/podvm-gpu-bundle/install-podvm-gpu.sh
