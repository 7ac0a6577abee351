#!/usr/bin/env bash
# The GPU check, in stages that each finish well inside 10 minutes on one H100 or H200:
#
#   bash tools/gpu_check.sh tests     ~6 min (estimated): gpu_info, every GPU test, the CPU suites,
#                                     the mpi suites at 2 ranks on the one GPU (CUDA tensors over MPI)
#   bash tools/gpu_check.sh train     ~5 min (estimated): train_vit bf16 and fp8 on the GPU against the
#                                     CPU emulation, DDP and FSDP over NCCL at world size 1 and over MPI
#                                     with 2 ranks sharing the GPU
#   bash tools/gpu_check.sh bench     ~8 min (estimated): bench_vit bf16 and fp8 for ViT-H/16 at batch
#                                     64 beside PyTorch eager and torch.compile (plain and fused SGD),
#                                     then fp8 again with --fp8-fused-producers off, and bf16 with
#                                     --recompute blocks
#
# (The times are estimates from the work each stage does: no stage has run on a GPU yet. Replace
# them with measured ones after the first run. On the 2-core development machine, rehearsed with
# OCTET_GPU_CHECK_DEVICE=cpu below, train took 186 s and tests 7 s with every GPU test skipping.)
# Whatever hangs, a stage stops its steps after OCTET_STAGE_SECONDS (540) and still writes its files,
# so one stage fits one 10-minute command; several stages may be named where there is time for them.
#
# Run it from the repository root of a GPU machine. It takes the programs from the bundle that
# tools/gpu_bundle.sh made on a development machine (build-gpu-bundle/, beside the checkout; for a
# machine that cannot build Octet: no Debian packages, no network), or else from build/ on a
# machine that built Octet itself. Each stage writes exactly two files to the output folder ($OUT
# when set, else /tmp/octet-gpu-check): STAGE-summary.txt, what passed and failed with the numbers,
# and STAGE-logs.tar.gz, every log. Three stages in one call write six files.
#
# A stage exits non-zero, and says so in its summary, when
#   - a GPU test fails, or skips although the machine has a GPU (unless it needs more GPUs or more
#     memory than this machine has, which the summary names);
#   - cuDNN's fused attention falls back to the unfused kernels: the GPU tests count which path each
#     bf16 and fp8 case took, and train_vit and bench_vit run with OCTET_REQUIRE_FUSED_ATTENTION=1,
#     which makes a fallback an error (their logs are also searched for the fallback's warning; the
#     GPU suite's f32 cases go unfused by design, so its log is not);
#   - a training run diverges from its CPU reference, or its loss does not fall;
#   - a program or the PyTorch comparator fails.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:-/tmp/octet-gpu-check}
mkdir -p "$out"
bundle_dir=${OCTET_BUNDLE_DIR:-build-gpu-bundle}
# OCTET_GPU_CHECK_DEVICE=cpu rehearses the stages' mechanics on a machine without a GPU: the train
# runs go to the CPU (and NCCL becomes the local group), so everything but the GPU itself is tried.
device=${OCTET_GPU_CHECK_DEVICE:-cuda:0}
# Each stage stops its steps by this many seconds, so that it always writes its summary and logs
# inside one 10-minute command, whatever hangs.
stage_seconds=${OCTET_STAGE_SECONDS:-540}
gpu_backend=nccl
[[ $device == cpu ]] && gpu_backend=auto
report=(python3 "$repo/tools/gpu_check_report.py")
export GTEST_COLOR=no PYTHONUNBUFFERED=1

if (($# == 0)); then
  echo "usage: bash tools/gpu_check.sh STAGE...   (STAGE: tests, train or bench; see the header)" >&2
  exit 2
fi
for s in "$@"; do
  [[ $s == tests || $s == train || $s == bench ]] || { echo "gpu_check: unknown stage '$s' (tests, train, bench)" >&2; exit 2; }
done

# ---- the programs ---------------------------------------------------------------------------------------
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
  origin="the bundle ($(sed -n 's/^commit //p' "$unpacked/MANIFEST"); this checkout is at $(git rev-parse --short HEAD 2> /dev/null || echo '?'));
GCC runtime: the $OCTET_BUNDLE_GCC's; CUDA libraries from ${OCTET_BUNDLE_CUDA_DIRS:-the system library cache}"
  if [[ -n $OCTET_BUNDLE_CUDA_MISSING ]]; then
    echo "gpu_check: this machine has no $OCTET_BUNDLE_CUDA_MISSING (searched NVIDIA's wheels beside python3 and" \
         "/usr/local/cuda); set OCTET_CUDA_LIBS to the folders that hold them" >&2
    exit 3
  fi
elif [[ -x build/bin/test_cuda ]]; then
  bin=$repo/build/bin
  data_dir=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
  origin="build/ (this machine's own build)"
else
  echo "gpu_check: no programs: make the bundle on a development machine (bash tools/gpu_bundle.sh) and put" \
       "$bundle_dir/ beside this checkout, or build here (bash tools/test.sh)" >&2
  exit 3
fi
[[ -d $data_dir ]] || data_dir=""
mpirun_cmd=()
command -v mpirun > /dev/null && mpirun_cmd=(mpirun --oversubscribe)
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ---- what every stage shares ------------------------------------------------------------------------------
# step NAME TIMEOUT COMMAND...: runs COMMAND with its output in $logs/NAME.log; records PASS or FAIL.
step() {
  local name=$1 limit=$2 started=$SECONDS rc left
  shift 2
  left=$(time_left)
  if ((left < 10)); then
    note FAIL "$name: not run, the stage's ${stage_seconds}s are spent"
    return 1
  fi
  ((limit > left)) && limit=$left
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1
  rc=$?
  ((rc == 124)) && echo "(timed out after ${limit}s)" >> "$logs/$name.log"
  if ((rc == 0)); then note PASS "$name ($((SECONDS - started))s)"; else note FAIL "$name: exit $rc after $((SECONDS - started))s (log: $name.log)"; tail -n 15 "$logs/$name.log" | sed 's/^/      /' | tee -a "$summary" > /dev/null; fi
  return $rc
}
time_left() { echo $((stage_deadline - SECONDS - 20)); }  # seconds a step may still take
note() {  # KIND TEXT: a line of the summary (and of the terminal)
  local kind=$1
  shift
  [[ $kind == FAIL ]] && failures=$((failures + 1))
  printf '%-5s %s\n' "$kind" "$*" | tee -a "$summary"
}
judge() {  # NAME COMMAND...: a check whose output is its verdict line(s); FAIL when it exits non-zero
  local name=$1 text
  shift
  if text=$("$@" 2>&1); then note PASS "$name: $text"; else note FAIL "$name: $text"; fi
}
gtest_verdict() {  # NAME LOG [--allow-skips]: no failures, no skips that this machine should have run
  judge "$1 results" "${report[@]}" gtest "$logs/$2" --gpus "$gpus" --free-gib "$free_gib" "${@:3}"
}
begin_stage() {
  stage=$1
  logs=$(mktemp -d "/tmp/octet-gpu-check-$stage.XXXXXX")
  summary=$logs/summary.txt
  failures=0
  stage_start=$SECONDS
  stage_deadline=$((SECONDS + stage_seconds))
  {
    echo "Octet GPU check, stage '$stage', $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "programs: $origin"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2> /dev/null | sed 's/^/nvidia-smi: /'
  } > "$summary"
  cat "$summary"
  "$bin/gpu_info" | tee "$logs/gpu_info.txt" | tee -a "$summary"
  "$bin/gpu_info" --json > "$logs/gpu_info.json" 2>&1
  if ! "$bin/gpu_info" --require-gpu > /dev/null 2>&1; then
    note FAIL "no GPU visible: every GPU step below would only skip (gpu_info above says why)"
    gpus=0 free_gib=0
  else
    gpus=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device_count"])' "$logs/gpu_info.json")
    free_gib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2> /dev/null | head -n 1 | awk '{printf "%d", $1 / 1024}')
  fi
}
end_stage() {
  # In train and bench, the fallback's warning anywhere in the logs is a failure even where the run went on.
  local fallbacks
  if [[ $stage != tests ]]; then
    fallbacks=$(grep -l "attention: no fused cuDNN plan" "$logs"/*.log 2> /dev/null | xargs -r -n1 basename | paste -sd' ')
    [[ -n $fallbacks ]] && note FAIL "cuDNN fused attention fell back to the unfused kernels in: $fallbacks"
  fi
  local verdict="stage '$stage': $failures failed, $((SECONDS - stage_start))s"
  echo "$verdict" | tee -a "$summary"
  cp "$summary" "$out/$stage-summary.txt"
  tar -C "$logs" -czf "$out/$stage-logs.tar.gz" .
  rm -rf "$logs"
  all_failures=$((all_failures + failures))
}

# ---- tests ---------------------------------------------------------------------------------------------------
stage_tests() {
  begin_stage tests
  # Every GPU test; the unfused attention kernels are tested where a test calls them directly.
  step test_cuda 420 "$bin/test_cuda" --gtest_brief=0
  gtest_verdict test_cuda test_cuda.log
  # The CPU suites, side by side (16 cores).
  local t pids=() cpu=(test_core test_kernels test_autograd test_nn test_optim test_models test_data test_apps
             test_local_group test_nccl_mapping)
  for t in "${cpu[@]}"; do
    (OMP_NUM_THREADS=2 timeout "$(time_left)" "$bin/$t" > "$logs/$t.log" 2>&1; echo $? > "$logs/$t.rc") &
    pids+=($!)
  done
  wait "${pids[@]}"
  for t in "${cpu[@]}"; do
    if [[ $(cat "$logs/$t.rc") == 0 ]]; then note PASS "$t"; else note FAIL "$t: exit $(cat "$logs/$t.rc") (log: $t.log)"; fi
    gtest_verdict "$t" "$t.log" --allow-skips  # a CPU suite may skip what this machine lacks (its data set)
  done
  if ((${#mpirun_cmd[@]} == 0)); then
    note FAIL "no mpirun (neither the bundle's nor this machine's): the mpi suites did not run"
  else
    # CUDA tensors at 2 ranks sharing the GPU over the MPI backend: every collective, reduction,
    # dtype and odd size of test_collectives, then the shared-GPU tests.
    OCTET_TEST_DEVICE=cuda:0 step mpi_collectives_cuda 180 "${mpirun_cmd[@]}" -np 2 "$bin/test_collectives"
    gtest_verdict mpi_collectives_cuda mpi_collectives_cuda.log
    step mpi_gpu_shared 180 "${mpirun_cmd[@]}" -np 2 "$bin/test_gpu_shared_mpi"
    gtest_verdict mpi_gpu_shared mpi_gpu_shared.log
    # The CPU mpi suites at 2 ranks from the same mpirun (DDP and FSDP on CUDA run in the train stage).
    for t in test_collectives test_ddp test_fsdp test_fsdp_fp8; do
      OMP_NUM_THREADS=1 step "mpi_$t" 240 "${mpirun_cmd[@]}" -np 2 "$bin/$t"
    done
  fi
  end_stage
}

# ---- train -----------------------------------------------------------------------------------------------------
# Each GPU run has a CPU twin with the same flags, seed and data (and the same --steps, which set the
# learning-rate schedule): the CPU emulates bf16 and FP8 exactly at tensor boundaries with f32
# accumulation, so the two differ only in accumulation order, by rounding. Their first 6 steps are
# compared; gpu_check_report.py's `track` states and applies the tolerance.
stage_train() {
  begin_stage train
  export OCTET_REQUIRE_FUSED_ATTENTION=1
  local data=(--dataset synthetic --synthetic-size 512)
  [[ -n $data_dir ]] && data=(--dataset fashion-mnist --data-dir "$data_dir")
  # No stochastic depth: the GPU and the CPU would draw their masks differently.
  local common=("${data[@]}" --seed 7 --batch-size 64 --log-every 25 --eval-every 100000 --drop-path 0)
  local compare_steps=6 run
  # NAME PRECISION STEPS [FLAGS...]: the GPU run, its CPU twin, and the comparison of their first steps
  run_pair() {
    local name=$1 precision=$2 steps=$3
    shift 3
    local twin=("${@/#nccl/auto}")  # the twin's world of one on the CPU: no NCCL there
    step "$name" 240 "$bin/train_vit" --device "$device" --precision "$precision" "${common[@]}" --steps "$steps" \
      --metrics "$logs/$name.jsonl" "${@/#nccl/$gpu_backend}" &&
      step "${name}_cpu" 240 "$bin/train_vit" --device cpu --precision "$precision" "${common[@]}" \
        --steps "$steps" --metrics "$logs/${name}_cpu.jsonl" "${twin[@]}" &&
      judge "$name tracks the CPU" "${report[@]}" track "$logs/$name.jsonl" "$logs/${name}_cpu.jsonl" \
        --precision "$precision" --steps "$compare_steps"
    [[ -f $logs/$name.jsonl ]] && judge "$name loss falls" "${report[@]}" falls "$logs/$name.jsonl"
  }
  run_pair bf16 bf16 300
  run_pair fp8 fp8 300
  run_pair ddp_nccl bf16 100 --parallel ddp --dist-backend nccl
  run_pair fsdp_nccl bf16 100 --parallel fsdp --dist-backend nccl
  run_pair fsdp_fp8_nccl fp8 60 --parallel fsdp --dist-backend nccl
  run_pair fsdp_fp8_gather_nccl fp8 60 --parallel fsdp --dist-backend nccl --fp8-all-gather
  [[ -f $logs/fsdp_fp8_nccl.jsonl && -f $logs/fsdp_fp8_gather_nccl.jsonl ]] &&
    judge "fsdp fp8: --fp8-all-gather against bf16 gathers" "${report[@]}" track "$logs/fsdp_fp8_gather_nccl.jsonl" \
      "$logs/fsdp_fp8_nccl.jsonl" --precision same-gpu --steps 60
  if ((${#mpirun_cmd[@]} == 0)); then
    note FAIL "no mpirun: the 2-rank runs sharing the GPU did not run"
  else
    # 2 ranks x 32 images share cuda:0 over the MPI backend; the twin is the same 2 ranks on the CPU.
    local two=("${data[@]}" --seed 7 --batch-size 32 --log-every 25 --eval-every 100000 --drop-path 0 --dist-backend mpi)
    for run in "ddp bf16" "fsdp bf16" "fsdp fp8 --fp8-all-gather"; do
      read -r parallel precision extra <<< "$run"
      local name=mpi2_${parallel}_${precision}${extra:+_gather}
      step "$name" 240 "${mpirun_cmd[@]}" -np 2 "$bin/train_vit" --parallel "$parallel" --device "$device" \
        --precision "$precision" $extra "${two[@]}" --steps 60 --metrics "$logs/$name.jsonl" &&
        OMP_NUM_THREADS=1 step "${name}_cpu" 240 "${mpirun_cmd[@]}" -np 2 "$bin/train_vit" --parallel "$parallel" \
          --device cpu --precision "$precision" $extra "${two[@]}" --steps 60 --metrics "$logs/${name}_cpu.jsonl" &&
        judge "$name tracks the CPU" "${report[@]}" track "$logs/$name.jsonl" "$logs/${name}_cpu.jsonl" \
          --precision "$precision" --steps "$compare_steps"
      [[ -f $logs/$name.jsonl ]] && judge "$name loss falls" "${report[@]}" falls "$logs/$name.jsonl"
    done
  fi
  end_stage
}

# ---- bench -----------------------------------------------------------------------------------------------------
stage_bench() {
  begin_stage bench
  export OCTET_REQUIRE_FUSED_ATTENTION=1
  local model=${MODEL:-vit_huge_patch16_224} batch=${BATCH:-64} steps=${STEPS:-20}
  step bench_vit_bf16 200 "$bin/bench_vit" --device cuda --model "$model" --batch-size "$batch" --precision bf16 \
    --steps "$steps" --warmup 5
  step bench_vit_fp8 200 "$bin/bench_vit" --device cuda --model "$model" --batch-size "$batch" --precision fp8 \
    --steps "$steps" --warmup 5
  step pytorch_reference 420 python3 "$repo/bench/pytorch_reference.py" --model "$model" --batch-size "$batch" \
    --steps "$steps" --warmup 5 --mode both --optimizer both
  grep -h '^{"' "$logs"/bench_vit_bf16.log "$logs"/bench_vit_fp8.log "$logs"/pytorch_reference.log > "$logs/bench.jsonl" 2> /dev/null
  "${report[@]}" table "$logs/bench.jsonl" --device "$(head -n 1 "$logs/gpu_info.txt")" --model "$model" \
    --batch "$batch" | tee "$logs/table.md" | tee -a "$summary"
  # Last, where the stage's time may run out: fp8 with the separate casts, to time the fused producers.
  step bench_vit_fp8_unfused 200 "$bin/bench_vit" --device cuda --model "$model" --batch-size "$batch" \
    --precision fp8 --fp8-fused-producers off --steps "$steps" --warmup 5
  { echo "fp8 with --fp8-fused-producers off (the separate casts):"; grep -h '^{"' "$logs/bench_vit_fp8_unfused.log" | tail -n 1; } 2> /dev/null | tee -a "$summary"
  # And bf16 with activation recompute: its step time against bench_vit_bf16's, and the saved bytes.
  step bench_vit_bf16_recompute 200 "$bin/bench_vit" --device cuda --model "$model" --batch-size "$batch" \
    --precision bf16 --recompute blocks --steps "$steps" --warmup 5
  { echo "bf16 with --recompute blocks:"; grep -h '^{"' "$logs/bench_vit_bf16_recompute.log" | tail -n 1; } 2> /dev/null | tee -a "$summary"
  end_stage
}

all_failures=0
for s in "$@"; do "stage_$s"; done
echo "gpu_check: $* done; $all_failures failed; summaries and logs in $out"
((all_failures == 0))
