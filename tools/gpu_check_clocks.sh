# The GPU check's samples of the GPU's clocks and power, and their report beside each benchmark: sourced
# by tools/gpu_check.sh (it runs nothing alone, and uses the check's settings and summary: note,
# indent, time_left, $logs, $work, $rehearsal).
#
# The third run's ViT-H step took 7% longer than its kernels summed under ncu, where each kernel runs
# alone on a GPU that boosts. nvidia-smi samples the clocks every 100 ms from the first benchmark on;
# tools/gpu_clocks.py reads the samples inside each run's timed steps (bench_vit and
# bench/pytorch_reference.py print that window), so Octet's runs and PyTorch's are seen at their clocks.
clocks_pid=""
start_clock_samples() {
  [[ -z $clocks_pid ]] && ((!rehearsal)) || return 0
  command -v nvidia-smi > /dev/null || { note INFO "no nvidia-smi: the GPU's clocks are not sampled"; clocks_pid=none; return 0; }
  local fields="timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu" reasons gpu=${CUDA_VISIBLE_DEVICES:-0}
  gpu=${gpu%%,*}
  # The reasons' field was renamed (clocks_throttle_reasons before); take the name this driver knows.
  for reasons in clocks_event_reasons.active clocks_throttle_reasons.active; do
    if timeout 10 nvidia-smi -i "$gpu" --query-gpu="$fields,$reasons" --format=csv,noheader > /dev/null 2>&1; then
      fields+=",$reasons"
      break
    fi
  done
  echo "# nvidia-smi -i $gpu --query-gpu=$fields --format=csv,noheader,nounits -lms 100" > "$logs/gpu_clocks.csv"
  local line_buffered=()
  command -v stdbuf > /dev/null && line_buffered=(stdbuf -oL)  # each sample in the file as it is taken
  # Under a timeout past the check's deadline, so that a check ended by SIGKILL or an error that skips
  # stop_clock_samples never leaves nvidia-smi sampling into a deleted folder.
  timeout $(($(time_left) + 30)) "${line_buffered[@]}" nvidia-smi -i "$gpu" --query-gpu="$fields" \
    --format=csv,noheader,nounits -lms 100 >> "$logs/gpu_clocks.csv" 2>&1 &
  clocks_pid=$!
  echo "$clocks_pid" > "$work/gpu_clocks.pid"
}
stop_clock_samples() {
  [[ -n $clocks_pid && $clocks_pid != none ]] || return 0
  kill "$clocks_pid" 2> /dev/null
  wait "$clocks_pid" 2> /dev/null
  rm -f "$work/gpu_clocks.pid"
  clocks_pid=none
}
clock_report() {  # LOG...: the clocks and power over the timed steps of the runs these logs hold
  [[ -s $logs/gpu_clocks.csv ]] || return 0
  python3 "$repo/tools/gpu_clocks.py" "$logs/gpu_clocks.csv" "$@" 2>&1 | indent
}
