#!/usr/bin/env bash
# Build the trainer's Apptainer image: bash containers/build.sh resources/sacglam.sif (from the repository root).
#
# Unprivileged (--fakeroot unless root), with Apptainer's temporary and cache folders under resources/ (login
# nodes often have a small /tmp; set APPTAINER_TMPDIR / APPTAINER_CACHEDIR to override). The image is written
# under a temporary name and renamed: jobs using the previous image keep it.
# Where this node cannot build (no apptainer, no fakeroot, no internet), build on another Linux machine with the
# same command and copy the .sif here (README, "The image").
set -euo pipefail
image=${1:?usage: containers/build.sh IMAGE.sif}
cd "$(dirname "$0")/.."
if ! command -v apptainer >/dev/null; then
    echo "build.sh: apptainer is not installed on $(hostname): build $image on a machine that has it (same command)" \
        "and copy it here (README, \"The image\")" >&2
    exit 2
fi
export APPTAINER_TMPDIR=${APPTAINER_TMPDIR:-$PWD/resources/.apptainer/tmp}
export APPTAINER_CACHEDIR=${APPTAINER_CACHEDIR:-$PWD/resources/.apptainer/cache}
mkdir -p "$APPTAINER_TMPDIR" "$APPTAINER_CACHEDIR" "$(dirname "$image")"
fakeroot=(--fakeroot)
[ "$(id -u)" = 0 ] && fakeroot=()
tmp="$image.tmp-$$"
trap 'rm -f "$tmp"' EXIT
apptainer build "${fakeroot[@]}" "$tmp" containers/sacglam.def
apptainer test "$tmp"
mv "$tmp" "$image"
trap - EXIT
echo "build.sh: $image built"
