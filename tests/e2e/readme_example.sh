#!/usr/bin/env bash
# The README's usage example is examples/quickstart.cpp, word for word (the quickstart test runs it).
# Usage: readme_example.sh SOURCE_ROOT
set -eu
root=$1
block=$(awk '/^```cpp$/{on=1; next} /^```$/{if (on) exit} on' "$root/README.md")
if [ "$block" != "$(cat "$root/examples/quickstart.cpp")" ]; then
  echo "FAIL: the first cpp block of README.md differs from examples/quickstart.cpp:"
  diff <(echo "$block") "$root/examples/quickstart.cpp" || true
  exit 1
fi
echo "README example matches examples/quickstart.cpp"
