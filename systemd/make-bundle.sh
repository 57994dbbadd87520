#!/bin/sh
# Build the podvm-gpu install bundle on the build host: the agent's wheel plus every dependency
# as a wheel, a pip wheel to install them with, the systemd files and the installer. Image builds (packer/, mkosi/) copy the bundle
# into the image and run its install-podvm-gpu.sh there, which installs with pip --no-index, so
# the image build itself needs no access to PyPI.
#
# usage: make-bundle.sh OUTDIR [SOURCE_DIR]
#   OUTDIR      a folder that does not exist, is empty, or holds a bundle this script made
#               (its marker file .podvm-gpu-bundle): only then is it replaced. Any other
#               non-empty folder is refused and left as it is.
#   SOURCE_DIR  the podvm-gpu source tree (default: the tree this script is in)
# environment:
#   PYTHON                   interpreter that runs pip here (default python3)
#   PODVM_GPU_PYTHON_VERSION the image's Python version, e.g. 3.12, when it differs from the
#                            build host's: dependencies are then downloaded as binary wheels for
#   PODVM_GPU_PLATFORM       that version and this platform (default manylinux2014_x86_64)
set -eu

out=${1:?usage: make-bundle.sh OUTDIR [SOURCE_DIR]}
here=$(cd "$(dirname "$0")" && pwd)
src=${2:-$here/..}
python=${PYTHON:-python3}
pip="$python -m pip --disable-pip-version-check"

marker=.podvm-gpu-bundle
if [ -e "$out" ] || [ -L "$out" ]; then
    if [ ! -d "$out" ] || [ -L "$out" ]; then
        echo "make-bundle.sh: $out is not a folder; refusing to replace it" >&2
        exit 1
    fi
    if [ -f "$out/$marker" ]; then
        rm -rf "$out"
    elif [ -n "$(ls -A "$out")" ]; then
        echo "make-bundle.sh: $out is not empty and not a bundle make-bundle.sh made (no" \
            "$marker in it); refusing to delete it: name a new or empty folder" >&2
        exit 1
    fi
fi
mkdir -p "$out/wheels"
# the marker: a later run may replace this folder (Packer re-running on its bundle_dir)
echo "made by podvm-gpu systemd/make-bundle.sh; a later run replaces this folder" > "$out/$marker"
# The agent itself is pure Python: one wheel fits every image.
$pip wheel --quiet --no-deps --wheel-dir "$out/wheels" "$src"
agent_wheel=$(ls "$out"/wheels/podvm_gpu-*.whl)
if [ -n "${PODVM_GPU_PYTHON_VERSION:-}" ]; then
    $pip download --quiet --only-binary=:all: --dest "$out/wheels" \
        --python-version "$PODVM_GPU_PYTHON_VERSION" --implementation cp \
        --platform "${PODVM_GPU_PLATFORM:-manylinux2014_x86_64}" "$agent_wheel"
else
    $pip wheel --quiet --wheel-dir "$out/wheels" "$agent_wheel"
fi
# The installer runs pip from this wheel, so the image needs neither pip nor ensurepip.
$pip download --quiet --only-binary=:all: --no-deps --dest "$out/wheels" pip

cp "$here/install-podvm-gpu.sh" "$here/podvm-gpu.service" "$here/podvm-gpu-watch.service" "$here/podvm-gpu-metrics.service" "$here/podvm-gpu-pod-labels.service" \
    "$here/podvm-gpu.preset" "$out/"
cp "$here/kata-agent.service.d/10-podvm-gpu.conf" "$out/"
cp "$here/attestation-agent.service.d/10-podvm-gpu.conf" "$out/attestation-agent-10-podvm-gpu.conf"
chmod 0755 "$out/install-podvm-gpu.sh"
echo "podvm-gpu bundle: $out ($(ls "$out/wheels" | wc -l) wheels)"
