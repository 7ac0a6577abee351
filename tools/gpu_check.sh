#!/usr/bin/env bash
# The GPU check: one command of at most 8 minutes on one H100 or H200 with 16 host cores.
#
#   bash tools/gpu_check.sh                  the whole check, in the order below (450 s by default)
#   bash tools/gpu_check.sh STAGE...         only those stages, in the order given (a longer GPU rental
#                                            can run them one by one, or rerun one)
#
# The stages, in the order of the whole check, with the time each took on an H200 (the first GPU run,
# or the third, 2026-11-28, where it says so):
#
#   bench          bench_vit for ViT-H/16 at batch 64, 10 steps after 3 warm-up, on an idle GPU: bf16
#                  (13 s on the fourth run, 2026-11-29), bf16 again with each step held 30 ms on the
#                  stream while the host queues it (--head-start 30: the GPU starts with a filled queue;
#                  10 s), fp8 (9 s), fp8 with --fp8-fused-producers off (9 s), bf16 with --recompute
#                  blocks (9 s), bf16 with --gelu tanh (the GELU in cuBLASLt's epilogue; 10 s); then
#                  bf16 and fp8 with --autotune on (cuBLASLt's algorithms and cuDNN's attention engines
#                  timed per shape in the first step; 10 and 9 s) and bf16 with the bias gradients'
#                  design on trial (--bias-grad epilogue; about 10 s), each left out (CUT) when fewer
#                  than 200 s of the check are left for the stages after it. From here on nvidia-smi
#                  samples the GPU's clocks and power every 100 ms, and each run of bench_vit and of
#                  PyTorch (eager, torch.compile) gets a line for its timed steps
#                  (tools/gpu_clocks.py); bench_vit also says how far ahead of the GPU the host queued
#   bench_kernels  bench_kernels, where the build has it (1 s on the third run)
#   chosen         bench_vit bf16 and fp8 again with every trial's winner at once (gpu_check_report.py
#                  choose decides each: autotuning by the step, the bias gradients' design by
#                  bench_kernels' rows): the step the library would run with them as its defaults
#                  (19 s on the fourth run), each left out (CUT) like the trials when time is short
#   eager          bench/pytorch_reference.py --mode eager, plain and fused SGD (14 s), then plain SGD
#                  with the tanh GELU (11 s)
#   compile        starts torch.compile in the background (--start-gate): its cold compile (about
#                  170 s alone, more beside the tests) runs on the host's cores while the next stages
#                  use the GPU; it is released, timed on an idle GPU and waited for before the first
#                  later stage that needs the GPU to itself (ncu, table), or at the end
#   tests          the GPU tests as 4 GoogleTest shards at once (43 s on the third run), each under a
#                  timeout; a shard
#                  that crashes or hangs is named with the test it stopped in, and the tests it never
#                  reached run afterwards (--gtest_filter). Meanwhile the CPU twins of the train runs
#                  start on the host's cores. One verdict covers every shard and rerun.
#   train          train_vit on the GPU against its CPU twin (gpu_check_report.py track, then falls):
#                  bf16, fp8, DDP and FSDP over NCCL, FSDP fp8 with --fp8-all-gather (and against
#                  FSDP fp8 with bf16 gathers), LoRA under FSDP, hybrid sharding at world size 1
#                  (2-3 s each, 26 s in all on the third run)
#   mpi            2 ranks sharing the GPU over MPI: test_gpu_shared_mpi, test_collectives on CUDA
#                  tensors, and train_vit DDP, FSDP and FSDP fp8 with --fp8-all-gather against
#                  their 2-rank CPU twins (16 s on the third run)
#   ncu            where Nsight Compute's ncu exists: first the kernels still under 0.75 of a copy
#                  profiled once each with the sections that say why (bench_kernels --profile;
#                  DRAM bytes, occupancy, waves, stall reasons: gpu_check_report.py metrics; about
#                  15 s, skipped under 50 s left, never failed), then one steady-state ViT-H step of
#                  bf16 and one of fp8 under ncu (bench_vit --profile-last-step after one warm-up
#                  step; 30 and 35 s on the third run, a capture is skipped when less than 60 s are
#                  left), summed
#                  per kernel category and per kernel (gpu_check_report.py kernels)
#   table          the benchmark table in bench/RESULTS.md's format, with the goals
#
# and one stage that runs only when named, for a GPU rental of its own (it does not fit the whole check's
# 8 minutes): bash tools/gpu_check.sh nccl_ranks
#
#   nccl_ranks     NCCL with every rank on the one GPU, at 2, 4 and 8 ranks, against CPU twins over
#                  MPI, with the fault tests: tools/gpu_check_runs.sh says what it runs and what it took
#
# The fourth run (2026-11-29, an H200) did the whole check in 344 s of its 450: the benchmarks, the
# trials and the winners until 160 s, the tests, train and 2-rank runs until 250 s while torch.compile
# compiled (ready 66 s after it started, timed at 95 s), then the kernel metrics and both step
# captures (90 s); nccl_ranks took 214 s on the same machine right after. (Since then two of its
# five trials are settled and gone, about 20 s less.)
#
# It writes at most 8 files to the output folder ($OUT when set, else /tmp/octet-gpu-check), and
# rewrites the first two after every step, so that a kill at any moment leaves what ran so far:
#   summary.txt     every step with PASS, FAIL, SKIP or CUT and its wall time, the numbers, and last
#                   a short verdict
#   logs.tar.gz     every step's log, and the metrics of each train run and its twin
#   results.md      the benchmark table, for bench/RESULTS.md
#   kernels.txt     bench_kernels' table, the ncu kernel metrics, and the ncu captures summed
#   ncu_bf16.csv.gz, ncu_fp8.csv.gz   the captures
#
# The check fails (exit 1) when a GPU test fails, crashes, hangs or skips although the machine has
# a GPU (unless it needs more GPUs or memory than this machine has, which the verdict names); when
# cuDNN's fused attention falls back to the unfused kernels (train_vit and bench_vit run with
# OCTET_REQUIRE_FUSED_ATTENTION=1, and their logs are searched for the fallback's warning); when a
# train run leaves its CPU twin's bounds or its loss does not fall; when a program fails or times
# out; or, on a GPU machine, when PyTorch is missing. Without ncu there is no kernel table, and the
# summary says so. A torch.compile that the deadline cuts is reported as such (CUT), not as a failure.
#
# Run it from the repository root of a GPU machine. It takes the programs from the bundle that
# tools/gpu_bundle.sh made on a development machine (build-gpu-bundle/, beside the checkout), or
# else from build/ on a machine that built Octet itself.
#
# Settings (environment):
#   OCTET_CHECK_SECONDS=450     the whole check's deadline; every step's timeout comes from what is left
#   OCTET_PYTHON=python3        the python with torch and timm for bench/pytorch_reference.py
#   MODEL, BATCH, STEPS, WARMUP the benchmarks' model (vit_huge_patch16_224), batch (64) and steps (10, 3)
#   OCTET_GPU_CHECK_DEVICE=cpu  rehearses the mechanics on a machine without a GPU: bench_vit and the
#                               train runs go to the CPU (NCCL becomes the local group), the GPU tests
#                               skip, saying why; ncu is skipped, and PyTorch unless its torch
#                               sees a GPU (tests/tools/fake_torch_python.py, which CI uses as
#                               OCTET_PYTHON, does). CI runs it
#                               (tools/gpu_bundle_check.sh), with these to keep it short:
#   OCTET_CHECK_TRAIN_STEPS     every train run's steps (then the loss's fall is shown, not judged)
#   OCTET_CHECK_DATA_DIR        the Fashion-MNIST folder of the train runs (default: the bundle's)
#   OCTET_CHECK_GTEST           the GoogleTest program of the tests stage (default: test_cuda)
#   OCTET_CHECK_SHARD_SECONDS   each shard's timeout (default 150: the four took 64 s on an H200)
#   OCTET_CHECK_NCCL_RANKS      nccl_ranks' rank counts (default "2 4 8"); OCTET_CHECK_NCCL_STEPS its
#                               runs' steps (10); OCTET_CHECK_NCCL_RUN_SECONDS each run's timeout (120);
#                               OCTET_CHECK_NCCL_MAX_CTAS the NCCL_MAX_CTAS above 2 ranks (2; empty:
#                               NCCL's own); OCTET_CHECK_NCCL_BACKEND what --dist-backend nccl becomes
#                               (nccl; rehearsing on the CPU, auto, i.e. MPI; tools/gpu_bundle_check.sh
#                               sets nccl there, so that NCCL fails and the fallbacks run)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
repo=$PWD
out=${OUT:-/tmp/octet-gpu-check}
mkdir -p "$out"
bundle_dir=${OCTET_BUNDLE_DIR:-build-gpu-bundle}
device=${OCTET_GPU_CHECK_DEVICE:-cuda:0}
rehearsal=0
[[ $device == cpu ]] && rehearsal=1
check_seconds=${OCTET_CHECK_SECONDS:-450}
reserve=15  # seconds kept back at the end for the table, the verdict and the last flush
py=${OCTET_PYTHON:-python3}
model=${MODEL:-vit_huge_patch16_224} batch=${BATCH:-64} bench_steps=${STEPS:-10} bench_warmup=${WARMUP:-3}
train_steps_override=${OCTET_CHECK_TRAIN_STEPS:-}
shard_seconds=${OCTET_CHECK_SHARD_SECONDS:-150}
gpu_backend=nccl
((rehearsal)) && gpu_backend=auto
report=(python3 "$repo/tools/gpu_check_report.py")
# train_vit and bench_vit must run cuDNN's fused attention (a fallback is an error); the GPU tests run
# the unfused kernels on purpose where they test them (f32 cases), and count the paths themselves, so
# the tests stage runs without it.
export GTEST_COLOR=no PYTHONUNBUFFERED=1 OCTET_REQUIRE_FUSED_ATTENTION=1

all_stages=(bench bench_kernels chosen eager compile tests train mpi ncu table)
optional_stages=(nccl_ranks)  # run only when named: they do not fit the whole check's 8 minutes
if (($# == 0)); then
  stages=("${all_stages[@]}")
else
  stages=("$@")
  for s in "${stages[@]}"; do
    [[ " ${all_stages[*]} ${optional_stages[*]} " == *" $s "* ]] ||
      { echo "gpu_check: unknown stage '$s' (stages: ${all_stages[*]}; none: all of them; and, when named," \
             "${optional_stages[*]})" >&2; exit 2; }
  done
fi
in_stages() { [[ " ${stages[*]} " == *" $1 "* ]]; }

# ---- the programs ------------------------------------------------------------------------------------------
if [[ -f $bundle_dir/bundle.tar.xz ]]; then
  unpacked=/tmp/octet-bundle-$(cksum < "$bundle_dir/bundle.tar.xz" | cut -d' ' -f1)
  if [[ ! -f $unpacked/env.sh ]]; then
    rm -rf "$unpacked.part" && mkdir -p "$unpacked.part"
    # xz may be missing on a bare machine: Python's lzma reads the same stream.
    if command -v xz > /dev/null; then
      tar -C "$unpacked.part" -xJf "$bundle_dir/bundle.tar.xz"
    else
      python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' "$bundle_dir/bundle.tar.xz" "$unpacked.part"
    fi && mv "$unpacked.part" "$unpacked" ||
      { echo "gpu_check: could not unpack $bundle_dir/bundle.tar.xz" >&2; exit 3; }
  fi
  # shellcheck source=tools/gpu_bundle_env.sh
  source "$unpacked/env.sh" || exit 3
  bin=$unpacked/bin
  data_dir=$unpacked/fashion-mnist
  commit=$(sed -n 's/^commit //p' "$unpacked/MANIFEST")
  origin="the bundle (commit $commit; this checkout is at $(git rev-parse --short HEAD 2> /dev/null || echo '?'));
GCC runtime: the $OCTET_BUNDLE_GCC's; CUDA libraries from ${OCTET_BUNDLE_CUDA_DIRS:-the system library cache}"
  if [[ -n $OCTET_BUNDLE_CUDA_MISSING ]]; then
    echo "gpu_check: this machine has no $OCTET_BUNDLE_CUDA_MISSING (searched NVIDIA's wheels beside python3 and" \
         "/usr/local/cuda); set OCTET_CUDA_LIBS to the folders that hold them" >&2
    exit 3
  fi
elif [[ -x build/bin/test_cuda ]]; then
  bin=$repo/build/bin
  data_dir=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
  commit="$(git rev-parse HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD 2> /dev/null || echo ' (with uncommitted changes)')"
  origin="build/ (this machine's own build, commit $commit)"
else
  echo "gpu_check: no programs: make the bundle on a development machine (bash tools/gpu_bundle.sh) and put" \
       "$bundle_dir/ beside this checkout, or build here (bash tools/test.sh)" >&2
  exit 3
fi
commit_short=${commit:0:7}
[[ $commit == *uncommitted* ]] && commit_short+=" (with uncommitted changes)"
data_dir=${OCTET_CHECK_DATA_DIR:-$data_dir}
[[ -d $data_dir ]] || data_dir=""
gtest_program=${OCTET_CHECK_GTEST:-$bin/test_cuda}
mpirun_cmd=()
command -v mpirun > /dev/null && mpirun_cmd=(mpirun --oversubscribe)
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ncu_bin=$(command -v ncu || { [[ -x /usr/local/cuda/bin/ncu ]] && echo /usr/local/cuda/bin/ncu; } || true)

# ---- the summary, the logs, the clock -------------------------------------------------------------------------
# Our files only: an earlier check's are replaced, anything else in $OUT is left alone.
rm -f "$out"/{summary.txt,logs.tar.gz,results.md,kernels.txt,ncu_bf16.csv.gz,ncu_fp8.csv.gz} "$out"/.*.part
work=$(mktemp -d /tmp/octet-gpu-check.XXXXXX)
logs=$work/logs
mkdir -p "$logs"
summary=$work/summary.txt
started=0  # the deadline counts from the script's start (SECONDS), the bundle's unpacking included
deadline=$((started + check_seconds))
failures=0 checks=0
failed=() cut=() skipped=() fell_back=() stage_times=()
time_left() { echo $((deadline - SECONDS)); }
cap() {  # LIMIT: the timeout a step may have now: LIMIT, or what is left before the reserve
  local left=$(($(time_left) - reserve))
  echo $(($1 < left ? $1 : left))
}
note() {  # KIND TEXT: a line of the summary and of the terminal
  local kind=$1
  shift
  case $kind in
    PASS) checks=$((checks + 1)) ;;
    FAIL) checks=$((checks + 1)) failures=$((failures + 1)) failed+=("${*%%[:(]*}") ;;
    SKIP) skipped+=("$*") ;;
    CUT) cut+=("$*") ;;
  esac
  printf '%-5s %s\n' "$kind" "$*" | tee -a "$summary"
}
indent() { sed 's/^/      /' | tee -a "$summary" > /dev/null; }
verdict() {  # the summary's last lines
  local t=$((SECONDS - started))
  local so_far=""
  ((failures)) && so_far=": $(printf '%s; ' "${failed[@]}")" so_far=${so_far%; }
  if [[ ${1:-} == running ]]; then
    echo "VERDICT SO FAR, at $t s (the check is still running; a kill now leaves this): $failures of $checks checks failed$so_far"
  elif [[ ${1:-} == stopped ]]; then
    echo "VERDICT: INCOMPLETE, stopped by a signal at $t s: $failures of $checks checks failed so far$so_far"
  elif ((failures)); then
    echo "VERDICT: FAILED, $failures of $checks checks failed in $t s of the ${check_seconds} s budget:"
    printf '  failed: %s\n' "${failed[@]}"
  else
    echo "VERDICT: PASSED, $checks checks in $t s of the ${check_seconds} s budget"
  fi
  ((${#cut[@]})) && printf '  cut: %s\n' "${cut[@]}"
  ((${#fell_back[@]})) && printf '  fell back to the MPI backend: %s\n' "${fell_back[@]}"
  ((${#skipped[@]})) && printf '  skipped: %s\n' "${skipped[@]}"
  return 0
}
flush() {  # rewrites summary.txt and logs.tar.gz in $OUT (each written aside, then renamed)
  { cat "$summary"; echo; verdict "${1:-running}"; } > "$out/.summary.txt.part" && mv -f "$out/.summary.txt.part" "$out/summary.txt"
  # A log still being written may change while tar reads it: tar says so, and the next flush has it whole.
  tar -C "$logs" --warning=no-file-changed -czf "$out/.logs.tar.gz.part" . 2> /dev/null
  [[ -s $out/.logs.tar.gz.part ]] && mv -f "$out/.logs.tar.gz.part" "$out/logs.tar.gz"
  return 0
}
mark() {  # LOG RC LIMIT: what tools/gpu_check_report.py reads at the end of a log when RC is not 0
  if (($2 == 124 || $2 == 137)); then echo "gpu_check: timed out after $3s" >> "$1"
  elif (($2 != 0)); then echo "gpu_check: exit $2" >> "$1"; fi
}
ended() {  # RC LIMIT: how a step ended, in words
  if (($1 == 124 || $1 == 137)); then echo "timed out after $2 s"; else echo "exit $1"; fi
}
# step NAME LIMIT COMMAND...: COMMAND in the foreground, its output in NAME.log, under a timeout of
# LIMIT seconds or what is left of the check; PASS or FAIL with its wall time.
step() {
  local name=$1 limit t0=$SECONDS rc
  limit=$(cap "$2")
  shift 2
  if ((limit < 5)); then
    echo "gpu_check: not run: the check's ${check_seconds} s are spent" > "$logs/$name.log"
    note FAIL "$name: not run: the check's ${check_seconds} s are spent"
    flush
    return 1
  fi
  # In the background, so that a signal to the check interrupts the wait at once.
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1 &
  echo $! > "$work/step.pid"
  wait $! 2> /dev/null
  rc=$?
  rm -f "$work/step.pid"
  mark "$logs/$name.log" "$rc" "$limit"
  if ((rc == 0)); then
    note PASS "$name ($((SECONDS - t0)) s)"
  else
    note FAIL "$name: $(ended "$rc" "$limit") after $((SECONDS - t0)) s (log: $name.log)"
    tail -n 12 "$logs/$name.log" | indent
  fi
  flush
  return $rc
}
# launch NAME LIMIT COMMAND...: the same in the background; `landed NAME` waits for it and sets
# landed_secs (how it ended is at the end of its log). Its pid is kept in NAME.pid, so that a stopped check ends it.
launch() {
  local name=$1 limit
  limit=$(cap "$2")
  shift 2
  if ((limit < 5)); then
    echo "gpu_check: not run: the check's ${check_seconds} s are spent" > "$logs/$name.log"
    echo "-1 0" > "$work/$name.landed"
    return
  fi
  (
    t0=$SECONDS
    timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1 &
    echo $! > "$work/$name.pid"
    wait $! 2> /dev/null  # (the shell's own "Segmentation fault" line: the log says it)
    rc=$?
    mark "$logs/$name.log" "$rc" "$limit"
    echo "$rc $((SECONDS - t0))" > "$work/$name.landed"
  ) &
  echo $! > "$work/$name.waiter"
}
landed() {  # NAME: waits for a launched command (never in $(...): a subshell cannot wait for it)
  [[ -f $work/$1.waiter ]] && wait "$(cat "$work/$1.waiter")" 2> /dev/null
  rm -f "$work/$1.waiter" "$work/$1.pid"
  landed_secs=0
  [[ -f $work/$1.landed ]] && read -r _ landed_secs < "$work/$1.landed"
  return 0
}
judge() {  # NAME COMMAND...: a verdict of gpu_check_report.py; FAIL when it exits non-zero
  local name=$1 text
  shift
  if text=$("$@" 2>&1); then note PASS "$name: $text"; else note FAIL "$name: $text"; fi
  flush
}
gtest_verdict() {  # NAME LOG...: no failures, crashes or hangs, no skips that this machine should have run
  local name=$1 allow=()
  shift
  ((rehearsal)) && allow=(--allow-skips)  # no GPU: every GPU test skips, saying so
  judge "$name results" "${report[@]}" gtest "$@" --gpus "$gpus" --free-gib "$free_gib" "${allow[@]}"
}
stop_everything() {  # on a signal: end what this check started, by pid, and leave the summary
  local f
  for f in "$work"/*.pid; do [[ -f $f ]] && kill "$(cat "$f")" 2> /dev/null; done
  [[ -n ${compile_pid:-} ]] && kill "$compile_pid" 2> /dev/null
  note INFO "stopped by a signal at $((SECONDS - started)) s"
  flush stopped
  rm -rf "$work"
  exit 143
}
trap stop_everything INT TERM

stage_begin() { stage=$1 stage_t0=$SECONDS; echo "---- $1" | tee -a "$summary"; }
stage_end() { stage_times+=("$stage $((SECONDS - stage_t0)) s"); flush; }

# ---- the machine -------------------------------------------------------------------------------------------
{
  echo "Octet GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ): bash tools/gpu_check.sh ${*:-(the whole check)}"
  echo "stages: ${stages[*]}; deadline ${check_seconds} s"
  echo "programs: $origin"
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2> /dev/null |
    sed 's/^/nvidia-smi: /'
} > "$summary"
cat "$summary"
timeout 60 "$bin/gpu_info" 2>&1 | tee "$logs/gpu_info.txt" >> "$summary"
timeout 60 "$bin/gpu_info" --json > "$logs/gpu_info.json" 2>&1
gpus=0 free_gib=0
if ((rehearsal)); then
  note INFO "a rehearsal on the CPU (OCTET_GPU_CHECK_DEVICE=cpu): the runs go to the CPU and the GPU tests skip"
elif ! timeout 60 "$bin/gpu_info" --require-gpu > /dev/null 2>&1; then
  note FAIL "no GPU visible: every GPU step below would only skip (gpu_info above says why)"
else
  gpus=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device_count"])' "$logs/gpu_info.json")
  free_gib=$(timeout 30 nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2> /dev/null | head -n 1 | awk '{printf "%d", $1 / 1024}')
fi
gpu_name=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -n 1)
flush

# ---- the GPU's clocks and power while the benchmarks run (start_clock_samples, clock_report) ---------------
# shellcheck source=tools/gpu_check_clocks.sh
source "$repo/tools/gpu_check_clocks.sh"

# ---- the benchmarks: bench, bench_kernels, chosen, eager, compile, ncu, table (tools/gpu_check_bench.sh) ----
# shellcheck source=tools/gpu_check_bench.sh
source "$repo/tools/gpu_check_bench.sh"

# ---- train, mpi and nccl_ranks: runs on the GPU against their CPU twins (tools/gpu_check_runs.sh) -----------
# shellcheck source=tools/gpu_check_runs.sh
source "$repo/tools/gpu_check_runs.sh"

# ---- tests: the GPU tests in 4 shards, past crashes and hangs ---------------------------------------------------
stage_tests() {
  stage_begin tests
  # The host's cores are idle while the GPU tests run: the twins start now.
  in_stages train || in_stages mpi && start_twins
  local program=$gtest_program list=$logs/test_cuda_list.txt i round line logs_so_far=()
  if ! timeout 60 "$program" --gtest_list_tests > "$list" 2>&1; then
    note FAIL "test_cuda: --gtest_list_tests failed (log: test_cuda_list.txt)"
    tail -n 12 "$list" | indent
    stage_end
    return
  fi
  # A quarter of the cores each for the tests' CPU references, and no OpenMP thread spinning while it
  # waits: the twins and the compile share the host.
  for i in 0 1 2 3; do
    GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=$(((cores + 3) / 4)) OMP_WAIT_POLICY=passive \
      launch "test_cuda_s$i" "$shard_seconds" env -u OCTET_REQUIRE_FUSED_ATTENTION "$program" --gtest_brief=0
  done
  for i in 0 1 2 3; do
    landed "test_cuda_s$i"
    logs_so_far+=("$logs/test_cuda_s$i.log")
  done
  note INFO "test_cuda: 4 shards at once, $((SECONDS - stage_t0)) s"
  "${report[@]}" shards "$list" "${logs_so_far[@]}" --unreached "$work/unreached.txt" | indent
  flush
  # A shard that crashed or hung left tests it never started: run them, past further crashes.
  for round in 1 2 3 4 5 6; do
    [[ -s $work/unreached.txt ]] || break
    launch "test_cuda_rerun$round" "$shard_seconds" env -u OCTET_REQUIRE_FUSED_ATTENTION "$program" --gtest_brief=0 \
      --gtest_filter="$(paste -sd: "$work/unreached.txt")"
    landed "test_cuda_rerun$round"
    logs_so_far+=("$logs/test_cuda_rerun$round.log")
    note INFO "test_cuda: rerun $round, the $(wc -l < "$work/unreached.txt") tests no shard reached ($landed_secs s)"
    "${report[@]}" shards "$list" "${logs_so_far[@]}" --unreached "$work/unreached.txt" | tail -n 2 | indent
    flush
  done
  if ((rehearsal)); then
    line=$(grep -h -m1 -A1 ': Skipped$' "${logs_so_far[@]}" 2> /dev/null | sed -n 2p)
    [[ -n $line ]] && note INFO "test_cuda: the tests skip on the CPU, saying: $line"
  fi
  gtest_verdict test_cuda "${logs_so_far[@]}" --list "$list"
  stage_end
}

# ---- the check ------------------------------------------------------------------------------------------------
for s in "${stages[@]}"; do "stage_$s"; done
compile_finish
stop_clock_samples
wait_twins
# The fallback's warning anywhere in the train and bench logs is a failure even where the run went on
# (the GPU suite's f32 cases take the unfused path by design, so the test logs are not searched).
fallbacks=$(grep -l "attention: no fused cuDNN plan" "$logs"/*.log 2> /dev/null | grep -v -e '/test_cuda' -e '/mpi_' -e '/test_nccl_ranks' |
            xargs -r -n1 basename | paste -sd' ')
[[ -n $fallbacks ]] && note FAIL "cuDNN fused attention fell back to the unfused kernels in: $fallbacks"
{
  echo
  echo "stage times: $(IFS=';'; echo "${stage_times[*]}" | sed 's/;/, /g')"
} | tee -a "$summary"
flush final
echo
verdict final
echo "gpu_check: $(ls "$out" | wc -l) files in $out"
rm -rf "$work"
((failures == 0))
