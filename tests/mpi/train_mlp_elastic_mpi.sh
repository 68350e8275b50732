#!/bin/bash
# scripts/elastic_mpirun.py: train_mlp --backend mpi under mpirun -np 3, a process planted to fail (--fail), the
# job started again at -np 2 from the newest checkpoint, ends on the param_hash of the run that never failed
# (--reproducible); the launches it reports; a job grown from np 2 to 3 at a checkpoint (--grow), to the same
# bits; where it gives up (too few processes left, a job refusing its arguments) with the checkpoints kept;
# its usage errors.
# Usage: train_mlp_elastic_mpi.sh MPIRUN TRAIN_MLP SUPERVISOR
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/e2e.sh"
mpirun=$1
exe=$2
supervisor=$3
work=$e2e_work
common=(--layers 3 --hidden 48 --batch 24 --micro-batch 2 --reproducible --steps 12 --json)
sup=(python3 "$supervisor" --mpirun "$mpirun" --report "$work/report.json")

e2e_run "$exe" --backend threads --ranks 3 --stage 3 "${common[@]}"
e2e_json want param_hash hex
for stage in 3 1; do
  rm -rf "$work/ckpt"
  e2e_run "${sup[@]}" -np 3 --oversubscribe -- "$exe" --backend mpi --stage $stage "${common[@]}" --save "$work/ckpt" \
    --save-every 3 --fail 1:8
  e2e_json got param_hash hex
  echo "stage $stage: np 3 -> 2 through the supervisor: $got (threads, 3 ranks, no failure: $want)"
  e2e_same "$got" "$want" "stage $stage: param_hash after np 3 -> 2"
  grep -q "elastic_mpirun: the job failed (exit [0-9]*); 2 processes go on from the checkpoint of step 6" <<<"$e2e_err" ||
    e2e_fail "stage $stage: no line of the restart"$'\n'"$e2e_err"
  python3 - "$work/report.json" <<'PY' || e2e_fail "stage $stage: the report"
import json, sys
launches = json.load(open(sys.argv[1]))["launches"]
assert [l["np"] for l in launches] == [3, 2], launches
assert launches[0]["exit"] != 0 and launches[1]["exit"] == 0, launches
assert launches[1]["resumed_at"] == 6, launches
PY
done

# Growing: np 2 saves step 4, and np 3 goes on from it (--grow 4).
rm -rf "$work/ckpt"
e2e_run "${sup[@]}" --grow 4 -np 2 --oversubscribe -- "$exe" --backend mpi --stage 3 "${common[@]}" --save "$work/ckpt"
e2e_json got param_hash hex
echo "np 2 -> 3 by --grow 4: $got (threads, 3 ranks: $want)"
e2e_same "$got" "$want" "param_hash after np 2 -> 3"
grep -q "elastic_mpirun: the job of 2 processes saved step 4; 3 processes go on from it" <<<"$e2e_err" ||
  e2e_fail "no line of the growth"$'\n'"$e2e_err"
python3 - "$work/report.json" <<'PY' || e2e_fail "the report of the growth"
import json, sys
launches = json.load(open(sys.argv[1]))["launches"]
assert [(l["np"], l["exit"], l["resumed_at"]) for l in launches] == [(2, 0, None), (3, 0, 4)], launches
PY

# Gives up, keeping the checkpoints: too few processes would be left...
rm -rf "$work/ckpt"
e2e_expect 1 "giving up: fewer than --min-np 2 processes" "${sup[@]}" --min-np 2 -np 2 --oversubscribe -- "$exe" \
  --backend mpi --stage 2 "${common[@]}" --save "$work/ckpt" --save-every 3 --fail 0:5
[ -f "$work/ckpt/v-00000001/manifest.json" ] || e2e_fail "the checkpoint of step 3 was not kept"
# ... or the smaller job refuses its arguments (16 rows do not split over 3 processes in micro-batches of 2).
rm -rf "$work/ckpt"
e2e_expect 1 "giving up: the job refused its arguments" "${sup[@]}" -np 4 --oversubscribe -- "$exe" --backend mpi \
  --layers 3 --hidden 48 --batch 16 --micro-batch 2 --reproducible --steps 6 --save "$work/ckpt" --save-every 2 \
  --fail 0:4
e2e_expect 2 "needs --save DIR" "${sup[@]}" -np 2 -- "$exe" --backend mpi "${common[@]}"
e2e_expect 2 "needs --steps S" "${sup[@]}" -np 2 -- "$exe" --backend mpi --save "$work/x"
e2e_expect 2 "-np N" "${sup[@]}" -- "$exe" --backend mpi "${common[@]}" --save "$work/x"
e2e_expect 2 "--grow 12: the run trains steps 1-12" "${sup[@]}" --grow 12 -np 2 -- "$exe" --backend mpi "${common[@]}" \
  --save "$work/x"
e2e_expect 2 "--grow 3 is given twice" "${sup[@]}" --grow 3 --grow 3 -np 2 -- "$exe" --backend mpi "${common[@]}" \
  --save "$work/x"
echo "elastic_mpirun: every case passed"
