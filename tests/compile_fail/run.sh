#!/usr/bin/env bash
# Compiles each case in this folder: "// expect-success" cases must compile; the others must fail with a
# diagnostic that matches every "// expect: REGEX" line (the concept's name and the missing member).
# Usage: run.sh INCLUDE_DIR COMPILER [ARGS...]
set -u
here=$(cd "$(dirname "$0")" && pwd)
include=$1; shift
failures=0; count=0
for src in "$here"/*.cpp; do
  count=$((count + 1))
  name=$(basename "$src")
  log=$("$@" -std=c++20 -fsyntax-only -I"$include" "$src" 2>&1); rc=$?
  if grep -q '^// expect-success' "$src"; then
    if [ $rc -ne 0 ]; then echo "FAIL $name: should compile"; echo "$log" | head -20; failures=$((failures + 1)); else echo "ok   $name"; fi
    continue
  fi
  if [ $rc -eq 0 ]; then echo "FAIL $name: compiled, but must not"; failures=$((failures + 1)); continue; fi
  ok=1
  while IFS= read -r pattern; do
    if ! grep -Eq -- "$pattern" <<<"$log"; then echo "FAIL $name: diagnostic lacks /$pattern/"; ok=0; fi
  done < <(sed -n 's|^// expect: ||p' "$src")
  if [ $ok -eq 1 ]; then echo "ok   $name"; else failures=$((failures + 1)); echo "$log" | head -30; fi
done
echo "$((count - failures)) passed, $failures failed"
[ $failures -eq 0 ]
