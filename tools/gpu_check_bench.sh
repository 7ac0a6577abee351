# The GPU check's benchmarks: the stages bench, bench_kernels, chosen, eager, compile, ncu and table of
# tools/gpu_check.sh, which sources this file (it runs nothing alone, and uses the check's settings,
# clock and summary: note, step, indent, flush, $logs, $work, $bin, ...). tools/gpu_check.sh's header
# lists every stage and what it took.

# ---- bench, bench_kernels, eager: the benchmarks, on an idle GPU ---------------------------------------------
bench_device=cuda
((rehearsal)) && bench_device=cpu
bench_trials="bf16_autotune fp8_autotune bf16_bias_epilogue" bench_trials_reserve=0
{ in_stages tests || in_stages train || in_stages mpi; } && bench_trials_reserve=200
bench_vit_limit=90  # seconds a bench_vit run may take (a steady run takes 10-25)
# The limit of a trial's run: what the reserve leaves, at most bench_vit_limit, so that even a trial
# that hangs leaves the reserve to the stages after the benchmarks. Under 40 s: not run.
trial_limit() {
  local limit=$(($(time_left) - bench_trials_reserve))
  ((limit > bench_vit_limit)) && limit=$bench_vit_limit
  echo "$limit"
}
trial_cut_reason() {
  if ((bench_trials_reserve > 0)); then
    echo "$(time_left) s left of the check, $bench_trials_reserve of them kept for the stages after the benchmarks"
  else
    echo "$(time_left) s left of the check, too few for a run"
  fi
}
stage_bench() {
  stage_begin bench
  compile_finish
  start_clock_samples
  local spec name run flags limit
  for spec in "bf16 octet --precision bf16" "bf16_head_start octet-head-start --precision bf16 --head-start 30" \
              "fp8 octet-fp8 --precision fp8" \
              "fp8_unfused octet-fp8-unfused --precision fp8 --fp8-fused-producers off" \
              "bf16_recompute octet-recompute --precision bf16 --recompute blocks" \
              "bf16_gelu_tanh octet-gelu-tanh --precision bf16 --gelu tanh" \
              "bf16_autotune octet-autotune --precision bf16 --autotune on" \
              "fp8_autotune octet-fp8-autotune --precision fp8 --autotune on" \
              "bf16_bias_epilogue octet-bias-epilogue --precision bf16 --bias-grad epilogue"; do
    read -r name run flags <<< "$spec"
    if ((rehearsal)) && [[ $flags == *--head-start* ]]; then
      note SKIP "bench_vit_$name: skipped: no GPU stream to hold (a rehearsal)"
      continue
    fi
    if ((rehearsal)) && [[ $flags == *--autotune* ]]; then
      note SKIP "bench_vit_$name: skipped: the CPU has no GPU algorithms to time (a rehearsal)"
      continue
    fi
    if ((rehearsal)) && [[ $flags == *--bias-grad* ]]; then
      note SKIP "bench_vit_$name: skipped: the CPU has one kernel per op, no designs to choose (a rehearsal)"
      continue
    fi
    # The runs of bench_vit's own options (autotuning, the design on trial) give way to the stages
    # after this one when time is short: the tests, train and mpi stages need about 150 s (the third run).
    limit=$bench_vit_limit
    if [[ " $bench_trials " == *" $name "* ]]; then
      limit=$(trial_limit)
      if ((limit < 40)); then
        note CUT "bench_vit_$name: not run: $(trial_cut_reason)"
        continue
      fi
    fi
    # shellcheck disable=SC2086  # flags: words
    bench_vit_limit=$limit bench_vit_run "$name" "$run" $flags
  done
  stage_end
}
bench_vit_run() {  # NAME RUN FLAGS...: bench_vit with FLAGS as step bench_vit_NAME, its row tagged RUN
  local name=$1 run=$2
  shift 2
  if step "bench_vit_$name" "$bench_vit_limit" "$bin/bench_vit" --device "$bench_device" --model "$model" --batch-size "$batch" \
       --steps "$bench_steps" --warmup "$bench_warmup" "$@"; then
    grep -E '^(step|host|training|memory|activations)' "$logs/bench_vit_$name.log" | indent
    clock_report "$logs/bench_vit_$name.log"
    # What autotuning chose for each problem, against the heuristics' first (kernels/autotune.h).
    { grep -o 'autotune: .*' "$logs/bench_vit_$name.log" || true; } | indent
  fi
  # The table's row: bench_vit's JSON line, tagged with the run it is (the line does not say
  # whether the fused FP8 producers were on) and the flags it was given.
  grep -h '^{"' "$logs/bench_vit_$name.log" 2> /dev/null | tail -n 1 |
    sed "s/^{/{\"run\":\"$run\",\"flags\":\"$*\",/" > "$logs/bench_vit_$name.jsonl"
}

write_kernels_txt() {  # kernels.txt: bench_kernels' table, then the ncu captures summed
  # p is local: stage_ncu calls this inside its own loop over p (the 2026-11-28 run: without it, the
  # bf16 capture's summary read the fp8 capture before it existed).
  local p
  {
    echo "Octet GPU check, $(date -u +%Y-%m-%d), ${gpu_name:-no GPU}, commit $commit_short"
    if [[ -s $logs/bench_kernels.log ]]; then
      echo
      echo "== bench_kernels"
      grep -v '^{"' "$logs/bench_kernels.log"
    fi
    if [[ -s $work/metrics.txt ]]; then
      echo
      echo "== ncu metrics: the kernels under 0.75 of a copy, and layernorm_forward and gelu_forward to compare;"
      echo "   one launch each (bench_kernels --profile), DRAM bytes as measured, stalls in cycles per instruction"
      cat "$work/metrics.txt"
    fi
    local csvs=()
    for p in bf16 fp8; do [[ -s $work/ncu_$p.csv ]] && csvs+=("$work/ncu_$p.csv"); done
    if ((${#csvs[@]})); then
      echo
      echo "== ncu: one steady-state training step of $model (batch $batch) per capture, after one unprofiled"
      echo "   warm-up step; gpu__time_duration.sum of every kernel, each run alone"
      "${report[@]}" kernels "${csvs[@]}"
    fi
  } > "$out/.kernels.txt.part" && mv -f "$out/.kernels.txt.part" "$out/kernels.txt"
}

stage_bench_kernels() {
  stage_begin bench_kernels
  compile_finish
  # Without a GPU it says it skipped and exits 0, so the rehearsal runs it too.
  if [[ ! -x $bin/bench_kernels ]]; then
    note SKIP "bench_kernels: not in this build"
  elif step bench_kernels 90 "$bin/bench_kernels"; then
    write_kernels_txt
  fi
  stage_end
}

# ---- chosen: the trials' winners together ------------------------------------------------------------------
# Each trial of the bench stage is decided on its own (gpu_check_report.py choose: autotuning by the
# step, the bias gradients' design by bench_kernels' rows of the kernels it changes); this times
# bf16 and fp8 once more with every winner at once, the step the library would run with them as its
# defaults. Nothing runs for a precision whose defaults won every trial.
stage_chosen() {
  stage_begin chosen
  compile_finish
  start_clock_samples
  cat "$logs"/bench_vit_*.jsonl > "$work/trials.jsonl" 2> /dev/null
  if ! "${report[@]}" choose "$work/trials.jsonl" --kernels "$logs/bench_kernels.log" > "$logs/choose.txt" 2>&1; then
    note FAIL "choose: gpu_check_report.py choose failed (log: choose.txt)"
    tail -n 5 "$logs/choose.txt" | indent
    stage_end
    return
  fi
  indent < "$logs/choose.txt"
  local p run flags
  for p in bf16 fp8; do
    flags=$(sed -n "s/^$p: *//p" "$logs/choose.txt")
    run=octet-chosen
    [[ $p == fp8 ]] && run=octet-fp8-chosen
    if [[ -z $flags ]]; then
      note INFO "bench_vit_${p}_chosen: not run: no trial of $p beat the library's defaults, or none ran"
    elif (($(trial_limit) < 40)); then
      note CUT "bench_vit_${p}_chosen: not run: $(trial_cut_reason)"
    else
      # shellcheck disable=SC2086  # flags: words
      bench_vit_limit=$(trial_limit) bench_vit_run "${p}_chosen" "$run" --precision "$p" $flags
    fi
  done
  stage_end
}

torch_state=""
torch_ok() {  # WHAT: whether PyTorch can run WHAT here (torch and timm import, torch sees a GPU); says why not
  if [[ -z $torch_state ]]; then
    torch_state=$(timeout 120 "$py" -c 'import torch, timm; print("gpu" if torch.cuda.is_available() else "no-gpu")' 2> "$logs/torch_import.log")
    [[ $torch_state == *gpu ]] || torch_state=missing
  fi
  local why
  case $torch_state in
    gpu) return 0 ;;
    no-gpu) why="torch sees no GPU" ;;
    *) why="no torch: $py cannot import torch and timm ($(tail -n 1 "$logs/torch_import.log")); set OCTET_PYTHON to a python that can" ;;
  esac
  if ((rehearsal)); then note SKIP "$1: skipped: $why"; else note FAIL "$1: $why"; fi
  return 1
}

stage_eager() {
  stage_begin eager
  compile_finish
  start_clock_samples
  torch_ok "PyTorch eager" &&
    step pytorch_eager 150 "$py" "$repo/bench/pytorch_reference.py" --model "$model" --batch-size "$batch" \
      --steps "$bench_steps" --warmup "$bench_warmup" --mode eager --optimizer both &&
    grep -E '^pytorch-[a-z-]+: step' "$logs/pytorch_eager.log" | indent &&
    clock_report "$logs/pytorch_eager.log"
  # The tanh form's baseline for bench_vit --gelu tanh (plain SGD only).
  torch_ok "PyTorch eager, GELU tanh" &&
    step pytorch_eager_gelu_tanh 90 "$py" "$repo/bench/pytorch_reference.py" --model "$model" --batch-size "$batch" \
      --steps "$bench_steps" --warmup "$bench_warmup" --mode eager --optimizer sgd --gelu tanh &&
    grep -E '^pytorch-[a-z-]+: step' "$logs/pytorch_eager_gelu_tanh.log" | indent &&
    clock_report "$logs/pytorch_eager_gelu_tanh.log"
  stage_end
}

# ---- compile: torch.compile beside the tests, timed on an idle GPU ---------------------------------------------
compile_pid=""
stage_compile() {
  stage_begin compile
  if torch_ok "torch.compile"; then
    compile_gate=$work/compile.gate
    rm -f "$compile_gate"
    compile_t0=$SECONDS
    # Plain and fused SGD: the optimizer step is not compiled, so the second costs 13 steps, not a compile.
    timeout -k 10 "$(cap 100000)" "$py" "$repo/bench/pytorch_reference.py" --model "$model" --batch-size "$batch" \
      --steps "$bench_steps" --warmup "$bench_warmup" --mode compile --optimizer both --start-gate "$compile_gate" \
      > "$logs/pytorch_compile.log" 2>&1 &
    compile_pid=$!
    note INFO "torch.compile started in the background: it compiles and warms up beside the next stages, then waits for an idle GPU to time its steps"
  fi
  stage_end
}
compile_finish() {  # releases the gate, waits for torch.compile (until the reserve), says how it ended
  [[ -n $compile_pid ]] || return 0
  local ready rc t_ready
  ready=$(grep -m1 '^ready:' "$logs/pytorch_compile.log" 2> /dev/null)
  t_ready=$(sed -n 's/.*warmed up \([0-9]*\) s after.*/\1/p' <<< "$ready")
  note INFO "torch.compile released $((SECONDS - compile_t0)) s after its start; $([[ -n $ready ]] && echo "it had been ready since $t_ready s" || echo "it was still compiling")"
  touch "$compile_gate"
  while kill -0 "$compile_pid" 2> /dev/null && (($(time_left) > reserve)); do sleep 1; done
  kill -0 "$compile_pid" 2> /dev/null && kill "$compile_pid" 2> /dev/null  # the deadline: timeout passes it on
  wait "$compile_pid"
  rc=$?
  compile_pid=""
  local spent=$((SECONDS - compile_t0))
  ready=$(grep -m1 '^ready:' "$logs/pytorch_compile.log")
  t_ready=$(sed -n 's/.*warmed up \([0-9]*\) s after.*/\1/p' <<< "$ready")
  if ((rc == 0)); then
    note PASS "pytorch_compile ($spent s from its start; compiled and warmed up by ${t_ready:-?} s, timed on an idle GPU)"
    grep -E '^pytorch-[a-z-]+: step' "$logs/pytorch_compile.log" | indent
    clock_report "$logs/pytorch_compile.log"
  elif [[ -z $ready ]] && ((rc == 124 || rc == 137 || rc == 143)); then
    note CUT "torch.compile cut short after $spent s (cold compile): still compiling at the check's deadline (log: pytorch_compile.log)"
  elif ((rc == 124 || rc == 137 || rc == 143)); then
    note CUT "torch.compile cut short after $spent s: compiled by ${t_ready:-?} s, but its timed steps had not finished at the deadline"
  else
    note FAIL "pytorch_compile: exit $rc after $spent s (log: pytorch_compile.log)"
    tail -n 12 "$logs/pytorch_compile.log" | indent
  fi
  flush
}

# ---- ncu: the kernel table ------------------------------------------------------------------------------------
stage_ncu() {
  stage_begin ncu
  compile_finish
  if [[ -z $ncu_bin ]]; then
    note SKIP "kernel table: no ncu (not on PATH, not at /usr/local/cuda/bin/ncu)"
  elif ((rehearsal)); then
    note SKIP "kernel table: no GPU to profile (rehearsal on the CPU; ncu is at $ncu_bin)"
  else
    local p rc limit
    # Why the kernels still under 0.75 of a copy are (two at or above it beside them, to compare, and
    # the newest): each profiled once (bench_kernels --profile) with the sections that show the DRAM
    # bytes really moved, occupancy, waves and stall reasons; its table goes into kernels.txt.
    # Diagnostic only: a failed capture is said, not failed. About 15 s on an H200 (2026-11-28).
    if (($(time_left) - reserve < 50)); then
      note SKIP "ncu kernel metrics: not captured, only $(($(time_left) - reserve)) s left (it takes about 15 s)"
    elif [[ -x $bin/bench_kernels ]]; then
      limit=$(cap 75)
      timeout -k 10 "$limit" "$ncu_bin" --profile-from-start off --clock-control none --section SpeedOfLight \
        --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw "$bin/bench_kernels" --profile \
        --filter "layernorm_forward bf16" --filter layernorm_backward --filter layernorm_fp8_forward \
        --filter "gelu_forward bf16, erf" --filter gelu_backward_and_forward --filter gelu_fp8_forward \
        --filter dgelu_fp8 --filter "over the rows (dbias)" > "$logs/ncu_metrics.csv" 2>&1
      rc=$?
      if "${report[@]}" metrics "$logs/ncu_metrics.csv" > "$work/metrics.txt"; then
        note INFO "ncu kernel metrics: $(($(wc -l < "$work/metrics.txt") - 2)) kernels profiled (kernels.txt)"
        write_kernels_txt
      else
        rm -f "$work/metrics.txt"
        note INFO "ncu kernel metrics: none captured, ncu $(ended "$rc" "$limit") (log: ncu_metrics.csv)"
        grep -v '^"' "$logs/ncu_metrics.csv" | tail -n 5 | indent
      fi
      flush
    fi
    for p in bf16 fp8; do
      if (($(time_left) - reserve < 60)); then
        note SKIP "ncu $p: not captured, only $(($(time_left) - reserve)) s left (a capture takes about 40 s)"
        continue
      fi
      # One steady-state step: the warm-up step (master weights, FP8 state, momentum buffers made
      # once) runs unprofiled, and bench_vit brackets the next with cudaProfilerStart/Stop. ncu runs
      # each kernel alone and times it.
      step "ncu_$p" 90 "$ncu_bin" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
        --csv --page raw "$bin/bench_vit" --device cuda --model "$model" --batch-size "$batch" --precision "$p" \
        --steps 1 --warmup 1 --profile-last-step
      rc=$?
      # The CSV goes to $OUT as it is; the log keeps the program's and ncu's own lines.
      mv "$logs/ncu_$p.log" "$work/ncu_$p.csv"
      grep -v '^"' "$work/ncu_$p.csv" > "$logs/ncu_$p.log"
      if grep -q '^"ID",' "$work/ncu_$p.csv"; then
        gzip -c "$work/ncu_$p.csv" > "$out/.ncu_$p.csv.gz.part" && mv -f "$out/.ncu_$p.csv.gz.part" "$out/ncu_$p.csv.gz"
        write_kernels_txt
        "${report[@]}" kernels "$work/ncu_$p.csv" --top 8 | indent
      elif ((rc == 0)); then
        note FAIL "ncu $p: no kernels in the capture (log: ncu_$p.log)"
        tail -n 5 "$logs/ncu_$p.log" | indent
      fi
      flush
    done
  fi
  stage_end
}

# ---- table: the benchmark table -------------------------------------------------------------------------------
stage_table() {
  stage_begin table
  compile_finish
  cat "$logs"/bench_vit_*.jsonl > "$logs/bench.jsonl" 2> /dev/null
  grep -h '^{"bench": "pytorch-' "$logs"/pytorch_*.log >> "$logs/bench.jsonl" 2> /dev/null
  local lib libs=() device_text
  for lib in cublaslt cudnn nccl; do
    libs+=("$lib $(awk -v l="$lib" '$1 == l {print $2; exit}' "$logs/gpu_info.txt")")
  done
  if ((rehearsal)); then
    device_text="the CPU (a rehearsal of the check, OCTET_GPU_CHECK_DEVICE=cpu)"
  else
    device_text="$(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2> /dev/null | head -n 1 |
                   sed 's/, / (driver /; s/$/)/'); ${libs[*]}"
  fi
  {
    echo "## $model on ${gpu_name:-the CPU}: the GPU check ($(date -u +%Y-%m-%d), commit $commit_short)"
    echo
    echo '```bash'
    echo "bash tools/gpu_check.sh        # bench_vit, bench/pytorch_reference.py (eager, torch.compile)"
    echo '```'
    echo
    "${report[@]}" table "$logs/bench.jsonl" --device "$device_text" --model "$model" --batch "$batch" \
      --commit "$commit_short"
  } > "$logs/results.md"
  cp "$logs/results.md" "$out/.results.md.part" && mv -f "$out/.results.md.part" "$out/results.md"
  indent < "$logs/results.md"
  stage_end
}
