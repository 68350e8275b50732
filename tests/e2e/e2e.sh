# The end-to-end scripts' shared helper: a run that fails, or a value that is missing or malformed,
# ends the script at once with exit 1 and a message saying which run and what was found.
#
# Use (bash; sourced, never run):
#   source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"         # tests/mpi, tests/cuda: .../../e2e/e2e.sh
#   e2e_run PROGRAM ARGS...        runs it, requires exit 0; its stdout in $e2e_out, its stderr in $e2e_err
#   e2e_run_rc PROGRAM ARGS...     runs it whatever its exit: $e2e_rc, $e2e_out, $e2e_err (the script checks)
#   e2e_expect CODE ERE PROGRAM ARGS...    requires exit CODE (a refusal, or 0) and ERE (grep -E) in its stdout + stderr
#   e2e_json VAR FIELD [KIND]      VAR = FIELD of the JSON object on the last line of $e2e_out
#   e2e_sed VAR SED-EXPR [KIND]    VAR = sed -n SED-EXPR of $e2e_out, one non-empty line
#   e2e_filter VAR KIND CMD...     VAR = CMD's stdout, CMD reading $e2e_out on stdin and exiting 0
#                                  (a python3 check that asserts and prints a value)
#   e2e_value NAME VALUE KIND      requires VALUE to be of KIND
#   e2e_same A B WHAT | e2e_differ A B WHAT   both non-empty, and equal | different
#   e2e_fail MESSAGE...            prints "FAIL: MESSAGE" and ends the script with exit 1
#   $e2e_work                      a temporary directory, removed at exit; a script that needs more
#                                  clean-up defines e2e_cleanup (the helper owns the EXIT trap)
# KIND: hex (a non-empty run of hex digits), int (a decimal integer, sign allowed), number (a finite
# decimal or scientific number), or any (non-empty); the default is any.
# E2E_TIMEOUT=SECONDS (optional, set by the script): every run under `timeout`; exit 124 means it hung.
#
# The helper never prints a result to be captured: it assigns variables, so no run or check hides in
# a subshell (`x=$(...)` in a `read`, a `local` or a pipe, where a failure is lost). Called in a
# subshell anyway, a failure still ends the script: the helper signals the sourcing shell.
# Sourcing it sets -e, -u and pipefail.
#
# Planted failures (tests/e2e/e2e_break.sh): ZERO_E2E_BREAK=N replaces the script's N-th run (e2e_run,
# e2e_run_rc or e2e_expect) by one that fails (exit 1, no output) or, with ZERO_E2E_BREAK_HOW=empty,
# exits 0 having printed nothing; a script that goes on as if that run had worked has a hole.
# ZERO_E2E_TRACE=FILE appends one line per run started.

set -euo pipefail

e2e_out=""
e2e_err=""
e2e_rc=0
_e2e_runs=0
_e2e_main=$$
e2e_work=$(mktemp -d)
_e2e_errfile=$e2e_work/.e2e-stderr
_e2e_on_exit() {
  local rc=$?
  if declare -F e2e_cleanup >/dev/null; then e2e_cleanup || true; fi
  rm -rf "$e2e_work"
  exit "$rc"
}
trap _e2e_on_exit EXIT
# A failure in a subshell (a pipe, a command substitution) ends the sourcing shell through this signal.
trap 'exit 1' USR1

e2e_fail() {
  echo "FAIL: $*" >&2  # stderr: a misused helper's stdout may be captured
  if [ "$BASHPID" != "$_e2e_main" ]; then kill -USR1 "$_e2e_main" 2>/dev/null || true; fi
  exit 1
}

# _e2e_exec PROGRAM ARGS...: one counted run; sets e2e_rc, e2e_out, e2e_err.
_e2e_exec() {
  _e2e_runs=$((_e2e_runs + 1))
  [ -z "${ZERO_E2E_TRACE:-}" ] || echo "run $_e2e_runs: $*" >>"$ZERO_E2E_TRACE"
  if [ "${ZERO_E2E_BREAK:-0}" = "$_e2e_runs" ]; then
    e2e_out=""
    if [ "${ZERO_E2E_BREAK_HOW:-fail}" = empty ]; then
      e2e_err=""
      e2e_rc=0
    else
      e2e_err="e2e: planted failure of run $_e2e_runs (ZERO_E2E_BREAK)"
      e2e_rc=1
    fi
    echo "e2e: planted $([ $e2e_rc -eq 0 ] && echo "empty output" || echo failure) of run $_e2e_runs: $*" >&2
    return 0
  fi
  local timeout=()
  [ -z "${E2E_TIMEOUT:-}" ] || timeout=(timeout -k 5 "$E2E_TIMEOUT")
  e2e_rc=0
  e2e_out=$("${timeout[@]}" "$@" 2>"$_e2e_errfile") || e2e_rc=$?
  e2e_err=$(cat "$_e2e_errfile")
}

_e2e_tail() {  # the last lines of a run's output, for a failure message
  local text=$1
  [ -n "$text" ] || { echo "(nothing)"; return; }
  tail -n 15 <<<"$text" | cut -c 1-400
}

e2e_run() {
  _e2e_exec "$@"
  if [ "$e2e_rc" -ne 0 ]; then
    e2e_fail "exit $e2e_rc$([ "$e2e_rc" -eq 124 ] && [ -n "${E2E_TIMEOUT:-}" ] && echo " (timed out)") from run" \
      "$_e2e_runs: $*"$'\n'"stderr: $(_e2e_tail "$e2e_err")"$'\n'"stdout: $(_e2e_tail "$e2e_out")"
  fi
}

e2e_run_rc() {
  _e2e_exec "$@"
}

e2e_expect() {
  local code=$1 pattern=$2
  shift 2
  _e2e_exec "$@"
  if [ "$e2e_rc" -ne "$code" ]; then
    e2e_fail "run $_e2e_runs: $*: exit $e2e_rc, expected $code"$'\n'"output: $(_e2e_tail "$e2e_out"$'\n'"$e2e_err")"
  fi
  if ! grep -Eq -- "$pattern" <<<"$e2e_out"$'\n'"$e2e_err"; then
    e2e_fail "run $_e2e_runs: $*: exit $e2e_rc, but no /$pattern/ in its output:"$'\n'"$(
      _e2e_tail "$e2e_out"$'\n'"$e2e_err")"
  fi
}

e2e_value() {
  local name=$1 value=$2 kind=${3:-any} re
  case $kind in
    hex) re='^[0-9a-fA-F]+$' ;;
    int) re='^[-+]?[0-9]+$' ;;
    number) re='^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$' ;;
    any) re='.' ;;
    *) e2e_fail "e2e_value: unknown kind '$kind'" ;;
  esac
  [[ $value =~ $re ]] || e2e_fail "$name: '$value' is not $([ "$kind" = any ] && echo "a value" || echo "a $kind")"
}

e2e_json() {
  local var=$1 field=$2 kind=${3:-any} value
  value=$(python3 -c '
import json, sys
lines = sys.stdin.read().strip().splitlines()
if not lines:
    sys.exit("no output")
try:
    j = json.loads(lines[-1])
except ValueError as e:
    sys.exit("the last line is not JSON (%s): %s" % (e, lines[-1][:300]))
if not isinstance(j, dict) or sys.argv[1] not in j:
    sys.exit("no field %r in: %s" % (sys.argv[1], lines[-1][:300]))
v = j[sys.argv[1]]
print(json.dumps(v) if isinstance(v, (dict, list, bool)) or v is None else v)' "$field" <<<"$e2e_out" 2>&1) ||
    e2e_fail "run $_e2e_runs: field $field: $value"
  e2e_value "$field" "$value" "$kind"
  printf -v "$var" '%s' "$value"
}

e2e_sed() {
  local var=$1 expr=$2 kind=${3:-any} value
  value=$(sed -n "$expr" <<<"$e2e_out")
  local found
  found=$(grep -c . <<<"$value" || true)
  [ "$found" -eq 1 ] ||
    e2e_fail "run $_e2e_runs: sed -n '$expr' found $found values, expected one, in:"$'\n'"$(_e2e_tail "$e2e_out")"
  e2e_value "$expr" "$value" "$kind"
  printf -v "$var" '%s' "$value"
}

e2e_filter() {
  local var=$1 kind=$2 value rc=0
  shift 2
  value=$("$@" <<<"$e2e_out" 2>"$_e2e_errfile") || rc=$?
  [ "$rc" -eq 0 ] || e2e_fail "check of run $_e2e_runs exited $rc: $(_e2e_tail "$(cat "$_e2e_errfile")")"
  e2e_value "check of run $_e2e_runs" "$value" "$kind"
  printf -v "$var" '%s' "$value"
}

e2e_same() {
  [ -n "$1" ] && [ -n "$2" ] || e2e_fail "$3: an empty value ('$1', '$2')"
  [ "$1" = "$2" ] || e2e_fail "$3: '$1' differs from '$2'"
}

e2e_differ() {
  [ -n "$1" ] && [ -n "$2" ] || e2e_fail "$3: an empty value ('$1', '$2')"
  [ "$1" != "$2" ] || e2e_fail "$3: both are '$1'"
}
