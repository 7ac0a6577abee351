# The GPU check's runs against their CPU twins: the stages train, mpi and nccl_ranks of
# tools/gpu_check.sh, which sources this file (it runs nothing alone, and uses the check's settings,
# clock and summary: note, step, launch, judge, flush, ...). tools/gpu_check.sh's header lists every
# stage; nccl_ranks, which runs only when named, in full:
#
#   nccl_ranks     NCCL with every rank on the one GPU (NCCL 2.30 or newer: the bundle's, made with
#                  OCTET_BUNDLE_NCCL; the check sets NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL_DEBUG=WARN,
#                  and NCCL_MAX_CTAS=2 at more than 2 ranks, and says so). First gpu_info's verdict
#                  on ranks sharing a GPU; test_nccl_ranks at 2 ranks (every collective at odd sizes,
#                  split, FSDP's FP8 all-gather); then at N = 2, 4 and 8 (OCTET_CHECK_NCCL_RANKS),
#                  mpirun -np N train_vit --dist-backend nccl --device cuda:0, 10 steps, with
#                  --parallel ddp, and --parallel fsdp at --sharding full and hybrid (shard groups of
#                  N/2), each in bf16 and in fp8 with --fp8-all-gather, against its CPU twin at N ranks
#                  over MPI (first 6 steps; the loss's fall is shown, not judged, over 10 steps); after
#                  every train run, fault_test.sh over NCCL (a rank throws in an all_reduce at 2 ranks,
#                  with an all_reduce in flight and in a subgroup at 4) and a rank killed (SIGKILL)
#                  mid-step at 4 ranks: each job must end, non-zero, within 60 s (a hang is ended at
#                  75 s). Where a train run over NCCL is refused or hangs (its timeout is 120 s,
#                  OCTET_CHECK_NCCL_RUN_SECONDS), the summary gets NCCL's and Octet's words, that run
#                  goes again over the MPI backend on the same GPU, the verdict lists it under "fell
#                  back", and the rank count's later runs go over MPI directly; a fault that fails over
#                  NCCL is run over MPI too. A run that would not fit before the deadline is CUT,
#                  saying how long the last run at that rank count took. On an H200 (2026-11-29, the
#                  fourth run): gpu_info and test_nccl_ranks 30 s, each train run 5-9 s at 2 and 4
#                  ranks and 9-30 s at 8 (ranks on one GPU without MPS take turns, and every
#                  collective needs them all), the CPU twins beside them (17-22 s at 2 ranks, 2-4 s
#                  at 4 and 8), the faults and the kill 2 s each: 214 s in all. Give it
#                  OCTET_CHECK_SECONDS=300 or more, or split it by OCTET_CHECK_NCCL_RANKS.

# ---- train and mpi: runs on the GPU against their CPU twins ----------------------------------------------------
# Each GPU run has a CPU twin with the same flags, seed and data: the CPU emulates bf16 and FP8
# exactly at tensor boundaries with f32 accumulation, so the two differ only in accumulation order,
# by rounding. Their first 6 steps are compared (gpu_check_report.py track states the tolerance),
# so a twin runs those 6 steps only. The learning rate of step k (from 0) is base·(k+1)/W during the
# warmup and a cosine over the steps after it, and train_vit clamps the warmup to the run's steps:
# with --warmup-steps 6 given to both, a run of 6 steps and a run of 300 use base·(k+1)/6 for steps
# 0-5 alike, so the twin needs no more steps than it is compared over. Checked on the CPU:
# bf16 and fp8 runs of 6 and of 300 steps, and FSDP fp8 with --fp8-all-gather of 6 and 60 steps,
# log bit-identical losses for steps 1-6 (track: "bit for bit: True").
compare_steps=6
train_common=(--seed 7 --eval-every 100000 --drop-path 0 --warmup-steps "$compare_steps")
if [[ -n $data_dir ]]; then
  train_common+=(--dataset fashion-mnist --data-dir "$data_dir")
else
  train_common+=(--dataset synthetic --synthetic-size 512)
fi
# NAME PRECISION RANKS STEPS FLAGS: 64 images a step over RANKS ranks; "nccl" becomes the local
# group on the CPU.
train_runs=(
  "bf16 bf16 1 300"
  "fp8 fp8 1 300"
  "ddp_nccl bf16 1 150 --parallel ddp --dist-backend nccl"
  "fsdp_nccl bf16 1 150 --parallel fsdp --dist-backend nccl"
  "fsdp_fp8_gather_nccl fp8 1 150 --parallel fsdp --dist-backend nccl --fp8-all-gather"
  "fsdp_lora_nccl bf16 1 150 --parallel fsdp --dist-backend nccl --lora-rank 8"
  "fsdp_hybrid_nccl bf16 1 150 --parallel fsdp --dist-backend nccl --sharding hybrid --shard-group-size 1"
)
mpi_runs=(
  "mpi2_ddp_bf16 bf16 2 150 --parallel ddp --dist-backend mpi"
  "mpi2_fsdp_bf16 bf16 2 150 --parallel fsdp --dist-backend mpi"
  "mpi2_fsdp_fp8_gather fp8 2 150 --parallel fsdp --dist-backend mpi --fp8-all-gather"
)
# nccl_ranks: at each N, every rank on the one GPU over NCCL, and the twins at N ranks over MPI on the
# CPU. Hybrid sharding in shard groups of N/2, so that there are two replicas (at N = 2, groups of one).
nccl_steps=${OCTET_CHECK_NCCL_STEPS:-10}
read -r -a nccl_rank_counts <<< "${OCTET_CHECK_NCCL_RANKS:-2 4 8}"
nccl_runs=()
for n in "${nccl_rank_counts[@]}"; do
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 2 || 64 % n != 0)); then
    echo "gpu_check: OCTET_CHECK_NCCL_RANKS holds '$n': each must be 2 or more and divide the global batch of 64" >&2
    exit 2
  fi
  g=$((n / 2))
  nccl_runs+=("nccl${n}_ddp bf16 $n $nccl_steps --parallel ddp --dist-backend nccl"
              "nccl${n}_fsdp bf16 $n $nccl_steps --parallel fsdp --sharding full --dist-backend nccl"
              "nccl${n}_fsdp_fp8_gather fp8 $n $nccl_steps --parallel fsdp --sharding full --dist-backend nccl --fp8-all-gather"
              "nccl${n}_hybrid bf16 $n $nccl_steps --parallel fsdp --sharding hybrid --shard-group-size $g --dist-backend nccl"
              "nccl${n}_hybrid_fp8_gather fp8 $n $nccl_steps --parallel fsdp --sharding hybrid --shard-group-size $g --dist-backend nccl --fp8-all-gather")
done
cores=$(nproc)
twin_threads=$((cores < 4 ? cores : 4))
twin_jobs=$((cores / 5 > 0 ? cores / 5 : 1))  # 3 on 16 cores: the rest feed the GPU tests and the compile
((twin_jobs > 3)) && twin_jobs=3
run_threads=()
if ((rehearsal)); then
  # The "GPU" runs are CPU runs too: one thread each beside one twin, so that two OpenMP teams never
  # spin against each other on a small machine.
  twin_threads=1 twin_jobs=1 run_threads=(--threads 1)
fi

run_twin() {  # NAME PRECISION RANKS STEPS FLAGS...: the CPU twin, 6 steps (in the twins' pool)
  local name=$1 precision=$2 ranks=$3
  shift 4
  local launcher=() threads=$twin_threads
  ((ranks > 1)) && launcher=("${mpirun_cmd[@]}" -np "$ranks") threads=$((twin_threads / ranks > 0 ? twin_threads / ranks : 1))
  OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive launch "${name}_cpu" 240 "${launcher[@]}" "$bin/train_vit" --device cpu \
    --precision "$precision" "${train_common[@]}" --log-every 25 --batch-size $((64 / ranks)) --steps "$compare_steps" \
    --threads "$threads" --metrics "$logs/${name}_cpu.jsonl" "${@/#nccl/auto}"
  landed "${name}_cpu"
}
twin_pool() {  # SPEC...: every twin, twin_jobs at a time (runs in the background)
  local spec
  for spec in "$@"; do
    while (($(jobs -rp | wc -l) >= twin_jobs)); do wait -n; done
    # shellcheck disable=SC2086  # spec: words
    run_twin $spec &
  done
  wait
}
twin_pool_pid=""
start_twins() {
  [[ -n $twin_pool_pid ]] && return
  local specs=()
  in_stages train && specs+=("${train_runs[@]}")
  in_stages mpi && ((${#mpirun_cmd[@]})) && specs+=("${mpi_runs[@]}")
  in_stages nccl_ranks && ((${#mpirun_cmd[@]})) && specs+=("${nccl_runs[@]}")
  ((${#specs[@]})) || return
  twin_pool "${specs[@]}" &
  twin_pool_pid=$!
  note INFO "the CPU twins of ${#specs[@]} train runs started, $twin_jobs at a time with $twin_threads threads each"
}
twins_landed=""
wait_twins() {  # once: waits for the pool (each twin has its own timeout) and notes each twin
  [[ -n $twin_pool_pid && -z $twins_landed ]] || return 0
  local t0=$SECONDS spec name rc secs
  wait "$twin_pool_pid"
  twins_landed=yes
  for spec in "${train_runs[@]}" "${mpi_runs[@]}" "${nccl_runs[@]}"; do
    name=${spec%% *}_cpu
    [[ -f $work/$name.landed ]] || continue
    read -r rc secs < "$work/$name.landed"
    if ((rc == 0)); then note PASS "$name ($secs s, on the CPU beside the GPU work)"
    else note FAIL "$name: $(ended "$rc" "?") after $secs s (log: $name.log)"; tail -n 8 "$logs/$name.log" | indent; fi
  done
  note INFO "the GPU runs waited $((SECONDS - t0)) s for their twins"
  flush
}
# gpu_run NAME PRECISION RANKS STEPS FLAGS...: the run on the GPU (or, rehearsing, the CPU). The
# caller may set run_log_every (default 25), run_env (a command prefix such as env VAR=value) and
# run_backend (what --dist-backend nccl becomes; default: nccl on a GPU, auto rehearsing).
gpu_run() {
  local name=$1 precision=$2 ranks=$3 steps=${train_steps_override:-$4}
  shift 4
  local launcher=() prefix=()
  ((ranks > 1)) && launcher=("${mpirun_cmd[@]}" -np "$ranks")
  [[ -n ${run_env:-} ]] && read -r -a prefix <<< "$run_env"
  step "$name" "${run_limit:-120}" "${prefix[@]}" "${launcher[@]}" "$bin/train_vit" --device "$device" \
    --precision "$precision" "${train_common[@]}" --log-every "${run_log_every:-25}" --batch-size $((64 / ranks)) \
    --steps "$steps" --metrics "$logs/$name.jsonl" "${run_threads[@]}" "${@/#nccl/${run_backend:-$gpu_backend}}"
}
judge_pair() {  # NAME PRECISION [TWIN] [judge_falls|no_falls]: the GPU run against its twin (NAME_cpu), and its loss's fall
  local name=$1 precision=$2 twin=${3:-${1}_cpu} falls=${4:-judge_falls}
  if [[ -s $logs/$name.jsonl && -s $logs/$twin.jsonl ]]; then
    judge "$name tracks its CPU twin" "${report[@]}" track "$logs/$name.jsonl" "$logs/$twin.jsonl" \
      --precision "$precision" --steps "$compare_steps"
  else
    note FAIL "$name tracks its CPU twin: no metrics from $([[ -s $logs/$name.jsonl ]] && echo the twin || echo the GPU run)"
  fi
  [[ -s $logs/$name.jsonl ]] || return 0
  if [[ -n $train_steps_override ]]; then
    note INFO "$name loss (not judged: OCTET_CHECK_TRAIN_STEPS=$train_steps_override shortens the run): $("${report[@]}" falls "$logs/$name.jsonl")"
  elif [[ $falls == no_falls ]]; then
    note INFO "$name loss (not judged: a run of $nccl_steps steps): $("${report[@]}" falls "$logs/$name.jsonl")"
  else
    judge "$name loss falls" "${report[@]}" falls "$logs/$name.jsonl"
  fi
}

stage_train() {
  stage_begin train
  start_twins
  local spec
  for spec in "${train_runs[@]}"; do
    # shellcheck disable=SC2086  # spec: words
    gpu_run $spec
  done
  # FSDP fp8 with bf16 gathers: on the CPU it is bit for bit --fp8-all-gather's run, so on the GPU
  # only non-deterministic kernels may part them.
  gpu_run fsdp_fp8_nccl fp8 1 150 --parallel fsdp --dist-backend nccl
  wait_twins
  for spec in "${train_runs[@]}"; do
    read -r name precision _ <<< "$spec"
    judge_pair "$name" "$precision"
  done
  local same=60
  ((${train_steps_override:-60} < same)) && same=$train_steps_override
  [[ -s $logs/fsdp_fp8_nccl.jsonl && -s $logs/fsdp_fp8_gather_nccl.jsonl ]] &&
    judge "fsdp fp8: --fp8-all-gather against bf16 gathers" "${report[@]}" track "$logs/fsdp_fp8_gather_nccl.jsonl" \
      "$logs/fsdp_fp8_nccl.jsonl" --precision same-gpu --steps "$same"
  stage_end
}

stage_mpi() {
  stage_begin mpi
  if ((${#mpirun_cmd[@]} == 0)); then
    note FAIL "mpi: no mpirun (neither the bundle's nor this machine's): the 2-rank runs did not run"
    stage_end
    return
  fi
  start_twins
  step mpi_gpu_shared 120 "${mpirun_cmd[@]}" -np 2 "$bin/test_gpu_shared_mpi"
  gtest_verdict mpi_gpu_shared "$logs/mpi_gpu_shared.log"
  # Every collective, reduction, dtype and odd size of the MPI backend on CUDA tensors, 2 ranks on cuda:0.
  step mpi_collectives_cuda 120 env OCTET_TEST_DEVICE="$device" "${mpirun_cmd[@]}" -np 2 "$bin/test_collectives"
  gtest_verdict mpi_collectives_cuda "$logs/mpi_collectives_cuda.log"
  local spec
  for spec in "${mpi_runs[@]}"; do
    # shellcheck disable=SC2086  # spec: words
    gpu_run $spec
  done
  wait_twins
  for spec in "${mpi_runs[@]}"; do
    read -r name precision _ <<< "$spec"
    judge_pair "$name" "$precision"
  done
  stage_end
}

# ---- nccl_ranks: NCCL with every rank on the one GPU (only when named) -------------------------------------------
# At each N of OCTET_CHECK_NCCL_RANKS, train_vit over NCCL with every rank on cuda:0 against its CPU
# twin at N ranks over MPI; the 2-rank NCCL tests; a rank that throws, and a rank killed mid-step, ending
# the job. Where NCCL refuses or hangs, its words (NCCL_DEBUG=WARN) and Octet's go into the summary, that
# part runs again over the MPI backend on the same GPU, and the verdict lists it.
nccl_backend=${OCTET_CHECK_NCCL_BACKEND:-$gpu_backend}
nccl_max_ctas=${OCTET_CHECK_NCCL_MAX_CTAS-2}
nccl_run_seconds=${OCTET_CHECK_NCCL_RUN_SECONDS:-120}
nccl_given_up=()  # the rank counts at which NCCL refused or hung: their remaining parts go over MPI
nccl_pairs=()     # "RUN TWIN PRECISION": runs to judge against their twins once those have landed
declare -A nccl_took=()  # seconds the last run took at each rank count, to foresee whether the next fits
nccl_words() {  # LOG: NCCL's own words and Octet's about NCCL in a failed run's log, each line once
  grep -E "$nccl_refusal|NcclProcessGroup|nccl[A-Z][A-Za-z]+ (failed|has not finished)|share one GPU|noticed that process" \
    "$1" 2> /dev/null | awk '!seen[$0]++' | head -n 6
}
nccl_env() {  # RANKS: the command prefix for a run of RANKS ranks on one GPU
  if ((${1} > 2)) && [[ -n $nccl_max_ctas ]]; then echo "env NCCL_MAX_CTAS=$nccl_max_ctas"; fi
}
nccl_gave_up_at() { [[ " ${nccl_given_up[*]} " == *" $1 "* ]]; }
# After a part failed over NCCL at RANKS ranks: its words into the summary; at a refusal (NCCL's
# warning, a failed ncclCommInitRank, Octet's check of ranks sharing a GPU, no GPU for NCCL at all) or
# a hang the rank count is given up (its later parts go straight to MPI, not through another timeout).
nccl_refusal='NCCL WARN|ncclCommInitRank|which refuses several ranks|accepts that only with|NCCL backend needs|NcclProcessGroup: cuda:[0-9]+ does not exist'
nccl_failed() {  # NAME RANKS LOG RC [keep]: with keep, the rank count is not given up whatever happened
  local how words
  words=$(nccl_words "$3")
  if (($4 == 124 || $4 == 137)); then
    how="hung (timed out)"
  elif grep -Eq "$nccl_refusal" "$3" 2> /dev/null; then
    how="refused"
  else
    how="failed"
  fi
  note INFO "$1 over NCCL at $2 ranks: $how; $([[ -n $words ]] && echo "its log says:" || echo "no NCCL message in its log (see $1.log)")"
  [[ -n $words ]] && indent <<< "$words"
  if [[ $how != failed && ${5:-} != keep ]] && ! nccl_gave_up_at "$2"; then
    nccl_given_up+=("$2")
    note INFO "NCCL $how at $2 ranks: the remaining parts at $2 ranks run over the MPI backend only"
  fi
}
nccl_fits() {  # NAME RANKS: whether a run at RANKS ranks still fits before the deadline; CUT if not
  local need=${nccl_took[$2]:-$((10 * $2))} left=$(($(time_left) - reserve))
  ((left >= need + 10)) && return 0
  note CUT "$1: not started, $left s left and a run at $2 ranks takes about $need s (OCTET_CHECK_SECONDS for more)"
  return 1
}
nccl_train() {  # SPEC words: one train run over NCCL; where NCCL refuses or hangs, the same over MPI
  local name=$1 precision=$2 ranks=$3 rc t0
  shift 4
  nccl_fits "$name" "$ranks" || return 0
  if ! nccl_gave_up_at "$ranks"; then
    t0=$SECONDS
    run_env=$(nccl_env "$ranks") run_log_every=1 run_backend=$nccl_backend run_limit=$nccl_run_seconds \
      gpu_run "$name" "$precision" "$ranks" "$nccl_steps" "$@"
    rc=$?
    nccl_took[$ranks]=$((SECONDS - t0))
    if ((rc == 0)); then
      nccl_pairs+=("$name ${name}_cpu $precision")
      return 0
    fi
    nccl_failed "$name" "$ranks" "$logs/$name.log" "$rc"
  else
    note INFO "$name: not run over NCCL (NCCL refused or hung at $ranks ranks above)"
  fi
  fell_back+=("$name")
  nccl_fits "${name}_mpi" "$ranks" || return 0
  t0=$SECONDS
  run_log_every=1 run_backend=mpi gpu_run "${name}_mpi" "$precision" "$ranks" "$nccl_steps" "$@"
  nccl_took[$ranks]=$((SECONDS - t0))
  nccl_pairs+=("${name}_mpi ${name}_cpu $precision")
}
nccl_fault() {  # NP FAILING_RANK COLLECTIVE: tests/distributed/fault_test.sh over NCCL; over MPI where NCCL fails
  local np=$1 failing=$2 what=$3 name=fault_np$1_rank$2_$3 rc backend=nccl
  [[ $nccl_backend == nccl ]] || backend=mpi  # rehearsing on the CPU
  if [[ ! -x $bin/fault_rank_throws ]]; then
    note FAIL "$name: no fault_rank_throws in $bin (a bundle from before it was packed)"
    return
  fi
  if (($(time_left) - reserve < 100)); then
    note CUT "$name: not started, $(($(time_left) - reserve)) s left and a fault test may take 85 s (OCTET_CHECK_SECONDS for more)"
    return
  fi
  if [[ $backend == nccl ]] && ! nccl_gave_up_at "$np"; then
    # shellcheck disable=SC2046  # nccl_env: words
    step "$name" 100 $(nccl_env "$np") bash "$repo/tests/distributed/fault_test.sh" "$(command -v mpirun)" \
      "$bin/fault_rank_throws" "$np" "$failing" "$what" nccl
    rc=$?
    ((rc == 0)) && { grep -h '^PASS' "$logs/$name.log" | indent; return; }
    # A fault that hangs is a finding about ending a job, not NCCL refusing these ranks: the rank
    # count's train runs stay on NCCL (the 2026-11-28 run's faults hung, every one, for a cause in
    # Octet: distributed/nccl_process_group.cpp ~Communicator).
    nccl_failed "$name" "$np" "$logs/$name.log" "$rc" keep
    fell_back+=("$name")
  elif [[ $backend == nccl ]]; then
    note INFO "$name: not run over NCCL (NCCL refused or hung at $np ranks above)"
    fell_back+=("$name")
  fi
  if (($(time_left) - reserve < 100)); then  # the retry too: cut, not failed by a timeout it never had
    note CUT "${name}_mpi: not started, $(($(time_left) - reserve)) s left and a fault test may take 85 s"
    return
  fi
  step "${name}_mpi" 100 bash "$repo/tests/distributed/fault_test.sh" "$(command -v mpirun)" "$bin/fault_rank_throws" \
    "$np" "$failing" "$what" mpi && grep -h '^PASS' "$logs/${name}_mpi.log" | indent
}
# NP BACKEND: train_vit (FSDP) at NP ranks on the GPU; once rank 0 has logged 3 steps, rank 1 is killed
# (SIGKILL, mid-step: the steps follow each other at once, and the ranks keep in step through their
# collectives). The job must end, non-zero, within 60 s of the kill, by itself: where the run's own
# timeout ended it, it did not (a CUT when that timeout was all the check had left, under the up to
# 90 s to step 3 and 70 s of watching after the kill that the run may take; else a FAIL).
nccl_kill_run() {
  local np=$1 backend=$2 name=kill_np$1_$2 tag="octet-check-$$-$RANDOM" pid victim="" t0 t_kill rc=0 steps=0
  local log=$logs/$name.log metrics=$logs/$name.jsonl limit
  limit=$(cap 200)
  if ((limit < 90)); then
    note CUT "$name: not started, $limit s left and it needs up to 90"
    return 1
  fi
  t0=$SECONDS
  # shellcheck disable=SC2046  # nccl_env: words
  OCTET_CHECK_KILL_TAG=$tag timeout -k 10 "$limit" $([[ $backend == nccl ]] && nccl_env "$np") "${mpirun_cmd[@]}" \
    -np "$np" "$bin/train_vit" --device "$device" --precision bf16 "${train_common[@]}" --log-every 1 \
    --batch-size $((64 / np)) --steps 100000 --metrics "$metrics" "${run_threads[@]}" --parallel fsdp \
    --dist-backend "$backend" > "$log" 2>&1 &
  pid=$!
  echo "$pid" > "$work/$name.pid"
  while kill -0 "$pid" 2> /dev/null && ((SECONDS - t0 < 90)); do
    steps=$(grep -c '"event":"step"' "$metrics" 2> /dev/null)
    ((${steps:-0} >= 3)) && break
    sleep 0.2
  done
  local p
  for p in $(pgrep -f "$bin/train_vit"); do
    # grep -z reads the NUL-separated environ itself: no pipe, whose writer grep -q's early exit could
    # kill with SIGPIPE (and pipefail then turn a match into a miss).
    grep -qxz "OCTET_CHECK_KILL_TAG=$tag" "/proc/$p/environ" 2> /dev/null || continue
    grep -qxz "OMPI_COMM_WORLD_RANK=1" "/proc/$p/environ" 2> /dev/null && victim=$p && break
  done
  if ((${steps:-0} < 3)) || [[ -z $victim ]]; then
    kill "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    rc=$?
    rm -f "$work/$name.pid"
    mark "$log" "$rc" "$limit"
    note FAIL "$name: $([[ -z $victim ]] && echo "no rank 1 to kill" || echo "rank 1 never reached step 3") ($(ended "$rc" "$limit") after $((SECONDS - t0)) s; log: $name.log)"
    tail -n 8 "$log" | indent
    flush
    return 2
  fi
  t_kill=$(date +%s.%N)
  kill -KILL "$victim"
  while kill -0 "$pid" 2> /dev/null && awk -v s="$t_kill" -v n="$(date +%s.%N)" 'BEGIN { exit !(n - s < 70) }'; do
    sleep 0.2
  done
  local took
  took=$(awk -v s="$t_kill" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  if kill -0 "$pid" 2> /dev/null; then
    kill "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    rm -f "$work/$name.pid"
    note FAIL "$name: the job still ran $took s after rank 1 was killed at step $steps (log: $name.log)"
    tail -n 8 "$log" | indent
    flush
    return 1
  fi
  wait "$pid"
  rc=$?
  rm -f "$work/$name.pid"
  echo "gpu_check: rank 1 (pid $victim) killed with SIGKILL after $steps steps; the job ended $took s later with exit $rc" >> "$log"
  # Whether the run's timeout ended it: 124 is timeout's own code, but 137 is also how mpirun reports a
  # rank killed by SIGKILL, so the time it ran decides (the timeout cannot fire before `limit` s).
  local timed_out=0
  ((rc == 124 || SECONDS - t0 >= limit)) && timed_out=1
  if ((timed_out && limit < 170)); then
    note CUT "$name: rank 1 killed after $steps steps; $took s later the run's timeout ($limit s, what the check had left) ended the job: not judged"
    flush
    return 1
  elif ((timed_out)); then
    note FAIL "$name: rank 1 killed after $steps steps; the job did not end by itself: the run's timeout ended it $took s later (exit $rc)"
  elif ((rc != 0)) && awk -v t="$took" 'BEGIN { exit !(t < 60) }'; then
    note PASS "$name: rank 1 killed (SIGKILL) after $steps steps; the job of $np ranks ended $took s later, exit $rc"
    grep -m1 'noticed that process rank' "$log" | indent
  else
    note FAIL "$name: rank 1 killed after $steps steps; the job ended $took s later with exit $rc (it must end within 60 s, non-zero)"
  fi
  flush
  [[ $rc != 0 ]]
}
nccl_kill() {  # NP: the kill over NCCL, or over MPI where NCCL fails
  local np=$1 rc
  if [[ $nccl_backend == nccl ]] && ! nccl_gave_up_at "$np"; then
    nccl_kill_run "$np" nccl
    rc=$?
    ((rc == 0 || rc == 1)) && return  # it ran (and passed, or did not end in time: a finding, not NCCL refusing)
    nccl_failed "kill_np${np}_nccl" "$np" "$logs/kill_np${np}_nccl.log" 1
    fell_back+=("kill_np${np}_nccl")
  elif [[ $nccl_backend == nccl ]]; then
    note INFO "kill_np${np}_nccl: not run over NCCL (NCCL refused or hung at $np ranks above)"
    fell_back+=("kill_np${np}_nccl")
  fi
  nccl_kill_run "$np" "$([[ $nccl_backend == nccl ]] && echo mpi || echo "$nccl_backend")"
}

stage_nccl_ranks() {
  stage_begin nccl_ranks
  if ((${#mpirun_cmd[@]} == 0)); then
    note FAIL "nccl_ranks: no mpirun (neither the bundle's nor this machine's): the stage did not run"
    stage_end
    return
  fi
  local old=${NCCL_MULTI_RANK_GPU_ENABLE-unset} info verdict_line driver_line n spec name twin precision np4=2 ctas
  export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  info=$(timeout 60 "$bin/gpu_info" 2>&1)
  verdict_line=$(grep '^ranks sharing a GPU over NCCL' <<< "$info")
  driver_line=$(grep -m1 '^driver:' <<< "$info")
  # What decides whether ncclCommAbort waits for the peers (a failing rank then goes on without it
  # after 15 s, distributed/nccl_communicator.h), so that a slow fault test can be told apart.
  note INFO "nccl_ranks: gpu_info's ${driver_line:-driver: (no line)}; NCCL_CUMEM_HOST_ENABLE=${NCCL_CUMEM_HOST_ENABLE-unset} (NCCL's cuMem host memory, on by default with a driver of CUDA 12.6 or later: without it ncclCommAbort waits for the other ranks)"
  ctas="NCCL_MAX_CTAS=$nccl_max_ctas for runs of more than 2 ranks (NVIDIA's advice for several ranks on one GPU)"
  [[ -z $nccl_max_ctas ]] && ctas="NCCL's own NCCL_MAX_CTAS (OCTET_CHECK_NCCL_MAX_CTAS is empty)"
  note INFO "nccl_ranks: the check sets NCCL_MULTI_RANK_GPU_ENABLE=1 (it was $old) and NCCL_DEBUG=$NCCL_DEBUG for this stage, and $ctas; $nccl_steps steps a run over --dist-backend $nccl_backend; gpu_info: ${verdict_line:-no verdict (an older gpu_info)}"
  if [[ $nccl_backend == nccl && $verdict_line == *refused* ]]; then
    note FAIL "nccl_ranks: the NCCL loaded refuses several ranks on one GPU: ${verdict_line#*refused: }"
    nccl_given_up=("${nccl_rank_counts[@]}")
    note INFO "every part of this stage runs over the MPI backend instead"
  fi
  start_twins
  for n in "${nccl_rank_counts[@]}"; do ((n >= 4)) && np4=4; done

  # The NCCL tests at 2 ranks (every collective at odd sizes, split, FSDP's FP8 all-gather).
  if [[ ! -x $bin/test_nccl_ranks ]]; then
    note FAIL "test_nccl_ranks: not in $bin (a bundle from before it was packed)"
  else
    # (Without OCTET_REQUIRE_FUSED_ATTENTION, as the GPU tests run: its tiny ViT's attention is not what
    # this checks.)
    step test_nccl_ranks 150 env -u OCTET_REQUIRE_FUSED_ATTENTION "${mpirun_cmd[@]}" -np 2 "$bin/test_nccl_ranks"
    gtest_verdict test_nccl_ranks "$logs/test_nccl_ranks.log"
    if ((rehearsal)); then
      note INFO "test_nccl_ranks: the tests skip on the CPU, saying: $(grep -h -m1 -A1 ': Skipped$' "$logs/test_nccl_ranks.log" | sed -n 2p)"
    elif grep -q 'would refuse these ranks' "$logs/test_nccl_ranks.log" || ! grep -q '^\[  PASSED  \]' "$logs/test_nccl_ranks.log"; then
      note INFO "test_nccl_ranks did not pass over NCCL: its collectives run over the MPI backend on $device instead"
      fell_back+=("test_nccl_ranks")
      step nccl_fallback_collectives 120 env OCTET_TEST_DEVICE="$device" "${mpirun_cmd[@]}" -np 2 "$bin/test_collectives"
      gtest_verdict nccl_fallback_collectives "$logs/nccl_fallback_collectives.log"
    fi
  fi

  # Train runs, the smallest rank count first; then the faults, which the deadline cuts first (a
  # fault that hangs costs 75 s).
  for n in "${nccl_rank_counts[@]}"; do
    for spec in "${nccl_runs[@]}"; do
      read -r name _ np _ <<< "$spec"
      ((np == n)) || continue
      # shellcheck disable=SC2086  # spec: words
      nccl_train $spec
    done
  done
  nccl_fault 2 1 all_reduce
  nccl_fault "$np4" "$((np4 - 1))" in_flight
  nccl_fault "$np4" 1 subgroup
  nccl_kill "$np4"

  wait_twins
  for spec in "${nccl_pairs[@]}"; do
    read -r name twin precision <<< "$spec"
    judge_pair "$name" "$precision" "$twin" no_falls
  done
  stage_end
}
