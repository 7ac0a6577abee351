#!/usr/bin/env bash
# FSDP checkpoints re-shard (issue 7): a run at 4 ranks × 16 saves its sharded checkpoint at step 10
# of 20; resuming it at 2 ranks × 32 and at 1 rank × 64 (the same 64 images per step) must log the
# same losses for steps 11-20 as the uninterrupted 4-rank run, within TOLERANCE (relative). And from
# an odd world: a run at 3 ranks × 16, whose flat parameters are padded, resumed at 4 ranks × 12 and
# at 2 ranks × 24 (48 images per step).
#
#   fsdp_resume.sh TRAIN_VIT MPIRUN WORK TOLERANCE
set -euo pipefail
train_vit=$1 mpirun=$2 work=$3 tolerance=$4
rm -rf "$work" && mkdir -p "$work"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=("$mpirun" --oversubscribe --mca btl self,vader)
common=(--parallel fsdp --steps 20 --seed 1 --threads 1 --log-every 1000 --eval-every 100000)

run() {  # run NAME NP BATCH extra flags...
  local name=$1 np=$2 batch=$3
  shift 3
  "${mpi[@]}" -np "$np" "$train_vit" "${common[@]}" --batch-size "$batch" --metrics "$work/$name.jsonl" "$@" \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
run full 4 16 --checkpoint-dir "$work/ckpt" --checkpoint-every 10
[[ -f $work/ckpt/step-00000010/index.json && -f $work/ckpt/step-00000010/shard-3-of-4.safetensors ]] \
  || { echo "FAIL: no sharded checkpoint at step 10"; ls -R "$work/ckpt"; exit 1; }
run resume2 2 32 --resume "$work/ckpt/step-00000010"
run resume1 1 64 --resume "$work/ckpt/step-00000010"
run full3 3 16 --checkpoint-dir "$work/ckpt3" --checkpoint-every 10
run resume3to4 4 12 --resume "$work/ckpt3/step-00000010"
run resume3to2 2 24 --resume "$work/ckpt3/step-00000010"

python3 - "$work" "$tolerance" <<'PY'
import json, sys
work, tolerance = sys.argv[1], float(sys.argv[2])
def losses(name):
    return {e["step"]: e["loss"] for e in map(json.loads, open(f"{work}/{name}.jsonl")) if e["event"] == "step"}
for name, original in (("resume2", "full"), ("resume1", "full"), ("resume3to4", "full3"), ("resume3to2", "full3")):
    full, resumed = losses(original), losses(name)
    assert sorted(resumed) == list(range(11, 21)), sorted(resumed)
    gap = max(abs(resumed[s] - full[s]) / abs(full[s]) for s in resumed)
    print(f"{name}: steps 11-20 after resuming the {original} run's checkpoint, largest relative loss difference "
          f"{gap:.3e}")
    if gap > tolerance:
        sys.exit(f"FAIL: above {tolerance}")
PY
