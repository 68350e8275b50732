#!/usr/bin/env bash
# The README's zero_plan table is what its command prints: the command (the line starting with
# build/tools/zero_plan) is run with this build's zero_plan and its output compared with the block after it.
# Usage: readme_plan.sh SOURCE_ROOT ZERO_PLAN
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
root=$1 zero_plan=$2
readme="$root/README.md"
cmd=$(grep -m1 '^build/tools/zero_plan ' "$readme") || e2e_fail "no zero_plan command in README.md"
# The first plain ``` block after the command is its output.
table=$(awk -v cmd="$cmd" '$0 == cmd {found=1; next} found && /^```$/ {n++; if (n == 2) {on=1; next} if (n == 3) exit} on' "$readme")
[ -n "$table" ] || e2e_fail "no output block after: $cmd"
read -r -a args <<<"${cmd#build/tools/zero_plan }"
e2e_run "$zero_plan" "${args[@]}"
if [ "$table" != "$e2e_out" ]; then
  diff <(echo "$table") <(echo "$e2e_out") || true
  e2e_fail "README.md's table differs from the output of: $cmd"
fi
echo "README's zero_plan table matches: $cmd"
