#!/usr/bin/env bash
# Hybrid sharding in train_vit: 4 ranks as 2 shard groups of 2 (--sharding hybrid --shard-group-size 2)
# must log the losses of --sharding full at the same per-rank batch within TOLERANCE (relative), hold
# 16 bytes per parameter over 2 in its memory ledger (plus padding), and log its groups. A hybrid
# checkpoint saved at step 10 of 20 resumes under --sharding full at 3 ranks × 16 (the same 48 images
# per step), and a full 3-rank checkpoint resumes under hybrid at 4 × 12; each must match the run it
# continues, steps 11-20, within TOLERANCE. Bad combinations of the flags exit with code 2, saying why.
#
#   fsdp_hybrid.sh TRAIN_VIT MPIRUN WORK TOLERANCE
set -euo pipefail
train_vit=$1 mpirun=$2 work=$3 tolerance=$4
rm -rf "$work" && mkdir -p "$work"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=("$mpirun" --oversubscribe --mca btl self,vader)
common=(--parallel fsdp --steps 20 --seed 1 --threads 1 --log-every 1000 --eval-every 100000)
hybrid=(--sharding hybrid --shard-group-size 2)

run() {  # run NAME NP BATCH extra flags...
  local name=$1 np=$2 batch=$3
  shift 3
  "${mpi[@]}" -np "$np" "$train_vit" "${common[@]}" --batch-size "$batch" --metrics "$work/$name.jsonl" "$@" \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
run hybrid 4 12 "${hybrid[@]}" --checkpoint-dir "$work/ckpt" --checkpoint-every 10
run full 4 12
run hybrid_grad_op 4 12 --sharding hybrid-grad-op --shard-group-size 2
grep -q "2 shard groups of 2 ranks: {0,1} {2,3}; 2 replicate groups of 2 ranks: {0,2} {1,3}" "$work/hybrid.log" \
  || { echo "FAIL: the log does not name the groups"; cat "$work/hybrid.log"; exit 1; }
# One copy of each of the 2 shards.
ls "$work/ckpt/step-00000010" | grep -x 'shard-.*' | sort | tr '\n' ' ' | grep -qx "shard-0-of-2.safetensors shard-1-of-2.safetensors " \
  || { echo "FAIL: expected the 2 shard files of the hybrid checkpoint"; ls "$work/ckpt/step-00000010"; exit 1; }
run hybrid_to_full3 3 16 --resume "$work/ckpt/step-00000010"
run full3 3 16 --checkpoint-dir "$work/ckpt3" --checkpoint-every 10
run full3_to_hybrid 4 12 "${hybrid[@]}" --resume "$work/ckpt3/step-00000010"

# Flags that do not fit: exit code 2 and a message naming the problem.
expect_refused() {  # expect_refused MESSAGE command... (exit code 2, as for every bad flag)
  local message=$1
  shift
  local status=0
  "$@" > "$work/refused.log" 2>&1 || status=$?
  if [ "$status" -ne 2 ] || ! grep -qF -- "$message" "$work/refused.log"; then
    echo "FAIL: exit $status, expected exit 2 and an error saying: $message"; cat "$work/refused.log"; exit 1
  fi
}
expect_refused "--sharding hybrid shards FSDP's units within groups of ranks, so it needs --parallel fsdp" \
  "$train_vit" --sharding hybrid --steps 1
expect_refused "--shard-group-size 2 sets the shard groups of --sharding hybrid" \
  "$train_vit" --parallel fsdp --shard-group-size 2 --steps 1
expect_refused "the world size 4 is not a multiple of the shard group size 3" \
  "${mpi[@]}" -np 4 "$train_vit" "${common[@]}" --sharding hybrid --shard-group-size 3

python3 - "$work" "$tolerance" <<'PY'
import json, sys
work, tolerance = sys.argv[1], float(sys.argv[2])
def events(name):
    return [json.loads(line) for line in open(f"{work}/{name}.jsonl")]
def losses(name):
    return {e["step"]: e["loss"] for e in events(name) if e["event"] == "step"}
def gap(a, b):
    assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)
failed = False
hybrid, full = losses("hybrid"), losses("full")
assert sorted(hybrid) == list(range(1, 21)), sorted(hybrid)
for name, got, expected in (("hybrid vs full, 4 ranks", hybrid, full),
                            ("hybrid-grad-op vs full, 4 ranks", losses("hybrid_grad_op"), full),
                            ("hybrid checkpoint resumed by full at 3 ranks", losses("hybrid_to_full3"),
                             {s: hybrid[s] for s in range(11, 21)}),
                            ("full 3-rank checkpoint resumed by hybrid at 4 ranks", losses("full3_to_hybrid"),
                             {s: losses("full3")[s] for s in range(11, 21)})):
    g = gap(got, expected)
    print(f"{name}: largest relative loss difference {g:.3e} over {len(got)} steps")
    failed |= g > tolerance
ledger = next(e["memory_ledger"] for e in events("hybrid") if "memory_ledger" in e)
full_ledger = next(e["memory_ledger"] for e in events("full") if "memory_ledger" in e)
psi = next(e["parameters"] for e in events("hybrid") if e["event"] == "start")
print(f"ledger, hybrid 2x2: {ledger}")
print(f"ledger, full at 4: {full_ledger}")
assert ledger["shard_group_size"] == 2 and full_ledger["shard_group_size"] == 4, (ledger, full_ledger)
assert ledger["sharded_total_bytes"] == 4 * ledger["parameters_bytes"], ledger  # AdamW: 16 B per shard element
padding = ledger["parameters_bytes"] // 4 * 2 - psi  # shard elements × G − Ψ
assert 0 <= padding < 2 * 10, (padding, psi)  # under G per flat, 10 flats
print(f"16·Ψ/G = 16 × {psi} / 2 = {16 * psi // 2} B; the ledger holds {ledger['sharded_total_bytes']} B "
      f"({padding} padding elements)")
if failed:
    sys.exit(f"FAIL: above {tolerance}")
PY
