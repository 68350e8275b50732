#!/usr/bin/env bash
# The README's zero_plan table is what its command prints: the command (the line starting with
# build/tools/zero_plan) is run with this build's zero_plan and its output compared with the block after it.
# Usage: readme_plan.sh SOURCE_ROOT ZERO_PLAN
set -eu
root=$1 zero_plan=$2
readme="$root/README.md"
cmd=$(grep -m1 '^build/tools/zero_plan ' "$readme") || { echo "FAIL: no zero_plan command in README.md"; exit 1; }
# The first plain ``` block after the command is its output.
table=$(awk -v cmd="$cmd" '$0 == cmd {found=1; next} found && /^```$/ {n++; if (n == 2) {on=1; next} if (n == 3) exit} on' "$readme")
[ -n "$table" ] || { echo "FAIL: no output block after: $cmd"; exit 1; }
read -r -a args <<<"${cmd#build/tools/zero_plan }"
if [ "$table" != "$("$zero_plan" "${args[@]}")" ]; then
  echo "FAIL: README.md's table differs from the output of: $cmd"
  diff <(echo "$table") <("$zero_plan" "${args[@]}") || true
  exit 1
fi
echo "README's zero_plan table matches: $cmd"
