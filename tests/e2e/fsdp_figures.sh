#!/usr/bin/env bash
# tools/fsdp_figures.py, which makes every figure of docs/fsdp.md, on real 2-rank FSDP runs of
# train_vit (FULL_SHARD and SHARD_GRAD_OP, traced): each of its four modes runs, and what it derives
# agrees with what the runs record:
#   - the step's figures: every section (a)-(f), each unit gathered and its gradient reduce-scattered,
#     no unmatched collectives, the ledger = 16·Ψ/N (its own check says "=", never "≠"), and the
#     bytes the step's collectives carried within 1% of the strategy's theory (the trace names sizes
#     to 4 digits, so the figures carry "≈");
#   - --index: the checkpoint's flat parameters sum to the Ψ train_vit logged, each padded to N;
#   - --step-times: one row per metrics file, over the steps after the 2nd;
#   - --compare: SHARD_GRAD_OP keeps every block gathered from forward to backward (4 units at once)
#     where FULL_SHARD holds at most 2.
#
#   fsdp_figures.sh TRAIN_VIT MPIRUN WORK
set -euo pipefail
train_vit=$(realpath "$1") mpirun=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tool="$here/../../tools/fsdp_figures.py"
rm -rf "$work" && mkdir -p "$work"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

for sharding in full grad-op; do
  dir="$work/$sharding" && mkdir -p "$dir"
  (cd "$dir" && "$mpirun" --oversubscribe --mca btl self,vader -np 2 "$train_vit" --parallel fsdp --sharding "$sharding" \
     --dataset synthetic --synthetic-size 512 --batch-size 16 --steps 5 --threads 1 --eval-every 0 --log-every 1 \
     --trace t.json --trace-steps 2 --metrics m.jsonl --checkpoint-dir ck > train.log 2>&1) ||
    { cat "$dir/train.log"; exit 1; }
done

full="$work/full"
python3 "$tool" --trace "$full/t.rank0.json" --trace "$full/t.rank1.json" --metrics "$full/m.jsonl" \
  --log "$full/train.log" --width 80 > "$work/figures.md"
python3 "$tool" --index "$full/ck/step-00000005/index.json" > "$work/index.md"
python3 "$tool" --step-times "$full/m.jsonl" "$work/grad-op/m.jsonl" > "$work/step_times.md"
python3 "$tool" --compare full="$full" grad-op="$work/grad-op" > "$work/compare.md"

python3 - "$work" <<'PY'
import re, sys
work = sys.argv[1]
fig = open(f"{work}/figures.md").read()
fails = []
def need(cond, what):
    if not cond:
        fails.append(what)

for section in ("(a) The FSDP events of one step", "(b) Timeline", "(c) Units gathered", "(d) Memory ledger",
                "(e) Communication in the step", "(f) "):
    need(f"### {section}" in fig, f"figures: no section '{section}'")
for unit in ("root", "blocks.0", "blocks.1", "blocks.2", "blocks.3"):
    need(re.search(rf"\| gather \(issue → ready\) \| {re.escape(unit)} \|", fig), f"figures: no gather of {unit}")
    need(re.search(rf"\| reduce-scatter \(launch → collected\) \| {re.escape(unit)} \|", fig),
         f"figures: no reduce-scatter of {unit}")
for bad in ("≠", "DIFFERENT", "not matched", "belong to no gather span"):
    need(bad not in fig, f"figures: '{bad}' in them")
need("= the ledger's" in fig, "figures: the ledger's 16·Ψ/N check is missing")

def number(text):
    return int(text.replace(",", ""))
measured = {m.group(1): number(m.group(2))
            for m in re.finditer(r"^\| (all_gather|reduce_scatter) \| \d+ \| ≈?([\d,]+) \|", fig, re.M)}
theory = re.search(r"= ≈?([\d,]+) B all-gathered; every trainable flat reduce-scattered once: [^=]*= ([\d,]+) B", fig)
need(theory and len(measured) == 2, "figures: (e) has no payloads or no theory line")
if theory and len(measured) == 2:
    for name, want in (("all_gather", number(theory.group(1))), ("reduce_scatter", number(theory.group(2)))):
        need(abs(measured[name] - want) <= 0.01 * want, f"figures: {name} carried {measured[name]} B, theory {want} B")

log = open(f"{work}/full/train.log").read()
psi = re.search(r"([\d,]+) parameters", log)
index = open(f"{work}/index.md").read()
row = re.search(r"^\| \| \| \| \| all \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|", index, re.M)
need(psi and row, "index: no 'all' row, or no parameter count in train_vit's log")
if psi and row:
    numel, padded, padding, shard = (number(row.group(i)) for i in range(1, 5))
    need(numel == number(psi.group(1)), f"index: {numel} parameters, train_vit logged {psi.group(1)}")
    need(padded == numel + padding and padded == 2 * shard, f"index: padded {padded}, padding {padding}, shard {shard}")

rows = [l for l in open(f"{work}/step_times.md") if l.startswith(f"| {work}")]
need(len(rows) == 2 and all(l.split("|")[2].strip() == "3" for l in rows), f"step times: {rows}")

most = re.search(r"^\| most units gathered \| (\d+) \| (\d+) \|", open(f"{work}/compare.md").read(), re.M)
need(most and most.groups() == ("2", "4"), f"compare: most units gathered {most.groups() if most else None}, want 2 and 4")

if fails:
    sys.exit("FAIL: " + "; ".join(fails))
print(f"fsdp_figures: every mode ran; all_gather {measured['all_gather']:,} B and reduce_scatter "
      f"{measured['reduce_scatter']:,} B against theory; Ψ {psi.group(1)}; most units gathered 2 (full) and 4 (grad-op)")
PY
