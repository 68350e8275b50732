#!/usr/bin/env bash
# Shared set-up of demo.sh and test.sh: installs the Debian packages that are missing, then configures
# and builds the project with Meson in build/ (or $ZERO_BUILD_DIR), MPI required (-Dmpi=enabled).
# --no-build: the packages only (demo.sh, which builds its one target in build-demo/).
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZERO_BUILD_DIR:-$root/build}

packages=(meson ninja-build g++ pkg-config cmake python3 python3-matplotlib doctest-dev libcli11-dev nlohmann-json3-dev libxxhash-dev
          libopenmpi-dev openmpi-bin libopenblas-dev bc iproute2 clang libclang-rt-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

[ "${1:-}" != --no-build ] || exit 0
# MPI is a package of record (installed above): -Dmpi=enabled makes its absence a configuration error
# instead of a build without the mpi suite (a plain `meson setup` has mpi=auto and goes without it).
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" -Dmpi=enabled >&2
elif [ "$(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "mpi"))')" != enabled ]; then
  meson configure "$build" -Dmpi=enabled >&2
fi
meson compile -C "$build" >&2
