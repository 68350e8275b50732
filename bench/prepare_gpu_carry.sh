#!/usr/bin/env bash
# Copies the header-only dependencies of the tests, examples and tools (doctest, CLI11, nlohmann/json,
# xxHash) into .gpu-carry/include, for a GPU machine that has the CUDA toolkit but no Debian -dev
# packages. bench/gpu_check.sh passes the folder to Meson (-Dextra_include_dir); the folder is ignored
# by git and travels with the working tree to the GPU machine.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.gpu-carry/include
rm -rf "$dest"
mkdir -p "$dest"
copy() {  # copy PATH PACKAGE
  if [ ! -e "$1" ]; then
    echo "prepare_gpu_carry: $1 is missing (Debian: $2)" >&2
    exit 1
  fi
  cp -r "$1" "$dest/"
}
copy /usr/include/doctest doctest-dev
copy /usr/include/CLI libcli11-dev
copy /usr/include/nlohmann nlohmann-json3-dev
copy /usr/include/xxhash.h libxxhash-dev
echo "prepare_gpu_carry: $(du -sh "$dest" | cut -f1) of headers in $dest"
