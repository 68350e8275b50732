#!/usr/bin/env bash
# The end-to-end scripts can fail: each bash script of tests/e2e/, tests/mpi/ and tests/cuda/ is run with
# its first run broken by tests/e2e/e2e.sh (ZERO_E2E_BREAK=1): failing (exit 1, no output) it must fail at
# once, having started no other run; printing nothing with exit 0 it must fail too. The programs
# under test are stand-ins that fail if anything calls them, so the whole check takes seconds and
# needs no build: a script that runs its program outside the helper calls one and is named.
# Usage: e2e_break.sh SOURCE_ROOT
set -euo pipefail
root=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset ZERO_E2E_BREAK ZERO_E2E_BREAK_HOW ZERO_E2E_TRACE

# The stand-in for every program a script is given: it records that it was called and fails.
cat >"$work/program" <<EOF
#!/bin/sh
echo "\$0 \$*" >>"$work/called"
echo "e2e_break: a stand-in program was called (\$0)" >&2
exit 1
EOF
chmod +x "$work/program"

# Scripts that run no program (nothing to break), and the arguments of scripts that read a source
# file before their first run; every other script gets stand-ins for all its arguments.
declare -A exempt=([readme_example.sh]="compares README.md with examples/quickstart.cpp; runs no program")
declare -A arguments=([plan_table.sh]="$root $work/program" [readme_demo.sh]="$root $work/program"
  [train_mlp_cuda_stages.sh]="$work/program $work/program"  # a third argument names the CPU script it runs
  [tool_flags.sh]="$work/program $work/program $work/program $work/program $work/program")

failures=0
checked=0
bad() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run SCRIPT HOW: runs SCRIPT with its first run broken (HOW: fail or empty); sets rc, runs, called, out.
run() {
  local script=$1 how=$2 args
  read -r -a args <<<"${arguments[$(basename "$script")]:-$work/program $work/program $work/program $work/program}"
  : >"$work/trace"
  : >"$work/called"
  rc=0
  out=$(cd "$work" && ZERO_E2E_BREAK=1 ZERO_E2E_BREAK_HOW=$how ZERO_E2E_TRACE=$work/trace \
          timeout -k 5 30 bash "$script" "${args[@]}" 2>&1) || rc=$?
  runs=$(grep -c '^run ' "$work/trace" || true)
  called=$(grep -c . "$work/called" || true)
}

for script in "$root"/tests/e2e/*.sh "$root"/tests/mpi/*.sh "$root"/tests/cuda/*.sh; do
  name=$(basename "$script")
  case $name in e2e.sh | e2e_break.sh) continue ;; esac
  label=${script#"$root"/}
  if [ -n "${exempt[$name]:-}" ]; then
    echo "exempt $label: ${exempt[$name]}"
    continue
  fi
  grep -q 'e2e\.sh"' "$script" || bad "$label does not source tests/e2e/e2e.sh"

  run "$script" fail
  if [ "$rc" -eq 77 ] && [ "$runs" -eq 0 ] && [ "$called" -eq 0 ]; then
    echo "skip   $label: skipped (exit 77) before its first run: $(tail -n1 <<<"$out")"
    continue
  fi
  checked=$((checked + 1))
  if [ "$runs" -eq 0 ]; then
    bad "$label: no run went through tests/e2e/e2e.sh (exit $rc); its programs must run through e2e_run," \
      "e2e_run_rc or e2e_expect. Its output:"$'\n'"$(tail -n 5 <<<"$out")"
  elif [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || [ "$rc" -eq 124 ]; then
    bad "$label: exit $rc with its first run failing (124: it went on until the time limit)"
  elif [ "$runs" -ne 1 ] || [ "$called" -ne 0 ]; then
    bad "$label: went on after its first run failed ($runs runs, $called calls of a program):"$'\n'"$(
      cat "$work/trace")"
  elif ! grep -q "planted failure of run 1" <<<"$out"; then
    bad "$label: exit $rc, but not from the planted failure:"$'\n'"$(tail -n 5 <<<"$out")"
  else
    echo "ok     $label: a failing first run ends it (exit $rc)"
  fi

  run "$script" empty
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || [ "$rc" -eq 124 ]; then
    bad "$label: exit $rc with its first run printing nothing"
  elif [ "$called" -ge "$runs" ]; then
    bad "$label: called a program outside tests/e2e/e2e.sh ($runs runs, $called calls)"
  else
    echo "ok     $label: a first run printing nothing fails it (exit $rc after $runs run(s))"
  fi
done
[ "$checked" -gt 0 ] || bad "no script was checked"
[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
echo "$checked scripts fail when their first run does"
