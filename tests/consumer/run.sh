#!/usr/bin/env bash
# Builds tests/consumer against this source tree as a Meson subproject and runs it.
# Usage: run.sh SOURCE_ROOT
set -eu
root=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$root/tests/consumer/meson.build" "$root/tests/consumer/consumer.cpp" "$work/"
mkdir "$work/subprojects"
ln -s "$root" "$work/subprojects/zero"
meson setup "$work/build" "$work" >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
meson compile -C "$work/build" >"$work/compile.log" 2>&1 || { cat "$work/compile.log"; exit 1; }
"$work/build/consumer"
