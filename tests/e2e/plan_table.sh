#!/usr/bin/env bash
# docs/memory-and-communication.md's zero_plan tables are what their commands print: each command (a line
# starting with build/tools/zero_plan) is run with this build's zero_plan and its output compared with the
# block after it.
# Usage: plan_table.sh SOURCE_ROOT ZERO_PLAN
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
root=$1 zero_plan=$2
doc="$root/docs/memory-and-communication.md"
mapfile -t commands < <(grep '^build/tools/zero_plan ' "$doc")
[ "${#commands[@]}" -gt 0 ] || e2e_fail "no zero_plan command in $doc"
for cmd in "${commands[@]}"; do
  # The first plain ``` block after the command is its output.
  table=$(awk -v cmd="$cmd" '$0 == cmd {found=1; next} found && /^```$/ {n++; if (n == 2) {on=1; next} if (n == 3) exit} on' "$doc")
  [ -n "$table" ] || e2e_fail "no output block after: $cmd"
  read -r -a args <<<"${cmd#build/tools/zero_plan }"
  e2e_run "$zero_plan" "${args[@]}"
  if [ "$table" != "$e2e_out" ]; then
    diff <(echo "$table") <(echo "$e2e_out") || true
    e2e_fail "the table in $doc differs from the output of: $cmd"
  fi
  echo "docs/memory-and-communication.md's zero_plan table matches: $cmd"
done
