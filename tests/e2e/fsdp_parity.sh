#!/usr/bin/env bash
# FSDP against DDP (issue 7, "Done when"): at the same per-rank batch, `--parallel fsdp` (FULL_SHARD)
# and `--parallel ddp` must log the same losses within TOLERANCE (relative), at 4 ranks and at 3
# (an odd world, so every flat parameter is padded). Both average the same per-rank gradients; FSDP
# only gathers and shards around them.
#
#   fsdp_parity.sh TRAIN_VIT MPIRUN WORK STEPS TOLERANCE
set -euo pipefail
train_vit=$1 mpirun=$2 work=$3 steps=$4 tolerance=$5
rm -rf "$work" && mkdir -p "$work"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
common=(--batch-size 16 --steps "$steps" --seed 1 --threads 1 --log-every 1000 --eval-every 100000)

for np in 4 3; do
  for parallel in fsdp ddp; do
    "$mpirun" --oversubscribe --mca btl self,vader -np "$np" "$train_vit" --parallel "$parallel" "${common[@]}" \
      --metrics "$work/$parallel$np.jsonl" > "$work/$parallel$np.log" 2>&1 || { cat "$work/$parallel$np.log"; exit 1; }
  done
  grep -q "memory ledger (rank 0, bytes)" "$work/fsdp$np.log" || { echo "FAIL: no memory ledger in the log"; exit 1; }
done

python3 - "$work" "$steps" "$tolerance" <<'PY'
import json, sys
work, steps, tolerance = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
def events(name):
    return [json.loads(line) for line in open(f"{work}/{name}.jsonl")]
for np in (4, 3):
    fsdp, ddp = events(f"fsdp{np}"), events(f"ddp{np}")
    a = [e["loss"] for e in fsdp if e["event"] == "step"]
    b = [e["loss"] for e in ddp if e["event"] == "step"]
    assert len(a) == len(b) == steps, (len(a), len(b))
    gap = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    print(f"{np} ranks: FSDP vs DDP, largest relative loss difference {gap:.3e} over {steps} steps")
    if gap > tolerance:
        sys.exit(f"FAIL: above {tolerance}")
    ledger = next(e["memory_ledger"] for e in fsdp if "memory_ledger" in e)
    shard_bytes = ledger["parameters_bytes"]
    assert ledger["sharded_total_bytes"] == 4 * shard_bytes, ledger  # 16 bytes per shard element with AdamW
    print(f"{np} ranks: ledger {ledger}")
PY
