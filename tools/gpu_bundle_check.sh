#!/usr/bin/env bash
# Proves the GPU bundle (tools/gpu_bundle.sh) and the GPU check (tools/gpu_check.sh) on a machine
# without a GPU, so that a GPU machine's minutes go to Octet and not to its packaging. .ci/run runs
# it after the tests. Seven parts:
#
#   size      the bundle is within its limit (40 MiB), and the limit check itself fails on a smaller one
#   origins   every shared library any bundled program loads, as the dynamic loader reports it
#             (LD_DEBUG=libs, dlopen included), comes from the bundle, glibc and the loader, or what
#             a GPU machine provides: the driver and the CUDA libraries of NVIDIA's wheels (cuBLAS,
#             cuDNN, NCCL, NVRTC; this machine's CUDA toolkit stands in for the wheels)
#   cpu       the CPU suites pass from the unpacked bundle
#   gpu       the GPU suite runs from the unpacked bundle and skips, saying so, without a GPU
#   mpirun    the bundled mpirun starts the bundled test_collectives at 2 ranks, with Debian's
#             OpenMPI out of the way: hidden in a private mount namespace where the machine allows
#             one (unshare), and always off PATH, with OPAL_PREFIX pointing into the bundle
#   nccl      only when tools/gpu_bundle.sh is given an NCCL (OCTET_BUNDLE_NCCL=FILE; skipped, saying
#             so, without one, as in CI): the bundle carries exactly that library with its license, its
#             MANIFEST line gives its version, sha256 and origin, env.sh puts it ahead of the machine's
#             (OCTET_BUNDLE_NCCL_RUNTIME=machine the machine's), every process above that loaded an
#             NCCL loaded it (LD_DEBUG=libs, and ldd), gpu_info reports its version and path, and every
#             NCCL function a bundled program imports is defined in it (nm -D)
#   rehearsal the whole GPU check from the bundle on the CPU (OCTET_GPU_CHECK_DEVICE=cpu, a small
#             model and short train runs): it passes within its deadline, writes at most 8 files,
#             its summary and log tarball hold every step, the GPU tests skip saying why, PyTorch
#             and ncu say why they are skipped, and every verdict of gpu_check_report.py ran. Then
#             its tests stage past a GoogleTest program that crashes in one test and hangs in
#             another (tests/tools/fake_gtest.py); torch.compile behind its gate, and cut by the
#             deadline, with a stand-in for a python with torch (tests/tools/fake_torch_python.py);
#             the nccl_ranks stage at 2 ranks asked for NCCL, which cannot run here, so that every
#             part must say why and run again over MPI (fallback runs tracking their twins, the fault
#             tests, a rank killed mid-step); and a check stopped by a signal mid-step, which must
#             still leave its summary and logs and end what it started
#
#   bash tools/gpu_bundle_check.sh        after a build (bash tools/test.sh); about 4 minutes on 2 cores
#
# A part that cannot run here (no CUDA build, no unshare) says so and counts as skipped; the last
# line counts passed, failed and skipped parts, and the exit status is non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
max_mib=40
passed=0 failed=0 skipped=0
# Each verdict line starts with the seconds since the check began, so that a slow part shows.
pass() { echo "gpu_bundle_check: [${SECONDS} s] PASS $*"; passed=$((passed + 1)); }
fail() { echo "gpu_bundle_check: [${SECONDS} s] FAIL $*"; failed=$((failed + 1)); }
skip() { echo "gpu_bundle_check: [${SECONDS} s] SKIP $*"; skipped=$((skipped + 1)); }
finish() {
  echo "gpu_bundle_check: $passed passed, $failed failed, $skipped skipped in ${SECONDS} s"
  exit $((failed > 0))
}

if ! grep -q '^OCTET_CUDA:BOOL=ON' build/CMakeCache.txt 2> /dev/null; then
  why="build/ is not a CUDA build (no nvcc when it was configured, or not configured: run bash tools/test.sh first)"
  for part in size origins cpu gpu mpirun nccl rehearsal; do skip "$part: $why; the bundle holds the CUDA programs"; done
  finish
fi

# ---- size -------------------------------------------------------------------------------------------
out=build-gpu-bundle
# Without an NCCL to carry (as in CI) the bundle is packed with xz's preset 1, which takes a fifth of
# the default's time for 3 MiB more: the same files (over the limit, gpu_bundle.sh packs them again
# at the default preset, whose size is the one that counts). With an NCCL, as the GPU machine gets it.
[[ -n ${OCTET_BUNDLE_NCCL:-} ]] || export OCTET_BUNDLE_XZ_PRESET=${OCTET_BUNDLE_XZ_PRESET:-1}
if ! bash tools/gpu_bundle.sh "$out" > /tmp/octet-gpu-bundle.log 2>&1; then
  cat /tmp/octet-gpu-bundle.log
  fail "size: tools/gpu_bundle.sh failed (above)"
  finish
fi
tail -n 1 /tmp/octet-gpu-bundle.log
within() { (($(stat -c %s "$1") <= $2 * 1024 * 1024)); }  # FILE MIB
size=$(stat -c %s "$out/bundle.tar.xz")
if ! within "$out/bundle.tar.xz" "$max_mib"; then
  fail "size: $out/bundle.tar.xz is $size bytes, over $max_mib MiB"
elif within "$out/bundle.tar.xz" $((size / 1048576 / 2)); then
  fail "size: the limit check passed a $size-byte bundle against half its size"
else
  pass "size: $((size / 1024)) KiB, within $max_mib MiB (and refused against $((size / 1048576 / 2)) MiB)"
fi
if grep -Eq '^lib(-gcc)?/(libnccl|libcublas|libcublasLt|libcudnn|libnvrtc|libcuda)[._]' "$out/MANIFEST"; then
  fail "size: the bundle carries a CUDA library the GPU machine provides: $(grep -E '^lib(-gcc)?/lib(nccl|cublas|cudnn|nvrtc|cuda)' "$out/MANIFEST" | paste -sd' ')"
fi

# ---- unpack, as the GPU machine does ------------------------------------------------------------------
work=$(mktemp -d /tmp/octet-bundle-check.XXXXXX)
[[ -n ${OCTET_BUNDLE_CHECK_KEEP:-} ]] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bundle" "$work/ld"
tar -C "$work/bundle" -xJf "$out/bundle.tar.xz"
bundle=$work/bundle
# The GCC runtime from the bundle, as on a machine whose own is not newer; the CUDA libraries from
# this machine's toolkit, standing in for the wheels.
export OCTET_BUNDLE_GCC_RUNTIME=bundle GTEST_COLOR=no
# shellcheck source=tools/gpu_bundle_env.sh
source "$bundle/env.sh" || { fail "origins: $bundle/env.sh failed"; finish; }
echo "gpu_bundle_check: env.sh: GCC runtime from the $OCTET_BUNDLE_GCC; CUDA libraries from ${OCTET_BUNDLE_CUDA_DIRS:-the system library cache}${OCTET_BUNDLE_CUDA_MISSING:+; missing: $OCTET_BUNDLE_CUDA_MISSING}"

# Every process below writes the loader's log to $work/ld/<name>.<pid>.
traced() {  # NAME COMMAND...: run COMMAND with the loader's log on
  local name=$1
  shift
  LD_DEBUG=libs LD_DEBUG_OUTPUT=$work/ld/$name "$@"
}

# ---- cpu and gpu suites from the bundle ------------------------------------------------------------------
cpu_suites=(test_core test_kernels test_autograd test_nn test_optim test_models test_data test_apps test_local_group
            test_nccl_mapping)
cpu_failed=()
for t in "${cpu_suites[@]}"; do
  if ! (cd "$work" && OMP_NUM_THREADS=2 traced "$t" "$bundle/bin/$t" --gtest_brief=1 > "$work/$t.log" 2>&1); then
    cpu_failed+=("$t")
    grep -E '^\[  FAILED  \]|Failure|rror' "$work/$t.log" | head -n 20
  fi
  echo "  $t: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$work/$t.log" | sed 's/\x1b\[[0-9;]*m//g' | paste -sd' ')"
done
if ((${#cpu_failed[@]})); then fail "cpu: ${cpu_failed[*]} failed from the bundle"; else pass "cpu: ${#cpu_suites[@]} suites from the bundle"; fi

gpu_ok=1
(cd "$work" && traced test_cuda "$bundle/bin/test_cuda" --gtest_brief=1 > "$work/test_cuda.log" 2>&1) || gpu_ok=0
summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$work/test_cuda.log" | sed 's/\x1b\[[0-9;]*m//g' | paste -sd' ')
if [[ $gpu_ok == 1 ]] && grep -q 'no CUDA device' "$work/test_cuda.log" && grep -q 'SKIPPED' "$work/test_cuda.log"; then
  pass "gpu: test_cuda from the bundle skips without a GPU, saying so ($summary)"
else
  tail -n 30 "$work/test_cuda.log"
  fail "gpu: test_cuda from the bundle did not skip cleanly ($summary)"
fi
for p in gpu_info train_vit bench_vit bench_kernels; do  # (bench_kernels where the build has it)
  [[ $p == bench_kernels && ! -x $bundle/bin/$p ]] && continue
  traced "$p" "$bundle/bin/$p" --help > "$work/$p.log" 2>&1 || { fail "origins: $p --help failed"; cat "$work/$p.log"; }
done
traced gpu_info_run "$bundle/bin/gpu_info" > "$work/gpu_info_run.log" 2>&1
# Every other program loads its libraries by listing its tests (the mpi suites alone, as a world of one);
# fault_rank_throws, no test program, by printing its usage (exit 2).
for p in "$bundle"/bin/*; do
  name=$(basename "$p")
  compgen -G "$work/ld/$name.*" > /dev/null && continue
  if [[ $name == fault_rank_throws ]]; then
    traced "$name" "$p" > "$work/$name.log" 2>&1
    [[ $? == 2 ]] && grep -q usage "$work/$name.log" || { fail "origins: $name did not print its usage"; cat "$work/$name.log"; }
    continue
  fi
  traced "$name" "$p" --gtest_list_tests > "$work/$name.log" 2>&1 || { fail "origins: $name --gtest_list_tests failed"; cat "$work/$name.log"; }
done
grep -E '^(cublaslt|cudnn|nccl|runtime) ' "$work/gpu_info_run.log" | sed 's/^/  /'

# ---- mpirun from the bundle ------------------------------------------------------------------------------
mpirun_part() {  # run inside the namespace (or not): prove which mpirun, then launch 2 ranks
  local which_mpirun
  which_mpirun=$(command -v mpirun)
  if [[ $which_mpirun != "$bundle/openmpi/bin/mpirun" ]]; then
    echo "mpirun on PATH is $which_mpirun, not the bundle's"
    return 1
  fi
  (cd "$work" && traced mpirun mpirun -np 2 --oversubscribe "$bundle/bin/test_collectives" --gtest_brief=1)
}
# Debian's PMIx stays visible: a GPU machine may have a PMIx of its own (of another version) in the
# same place, and the bundle's PMIx must not load its plugins (the origins part below fails if it
# does). The first GPU run's mpirun did, until env.sh set PMIX_PKGLIBDIR.
hide_debian_openmpi() {  # in a private mount namespace: empty folders over OpenMPI's, /dev/null over its files
  local empty f d
  empty=$(mktemp -d)
  for f in /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info /usr/bin/ssh /usr/bin/rsh \
           /usr/lib/x86_64-linux-gnu/lib{mpi,mpi_cxx,open-rte,open-pal}.so.40.*; do
    [[ -f $f && ! -L $f ]] && mount --bind /dev/null "$f"
  done
  for d in /usr/lib/x86_64-linux-gnu/openmpi /etc/openmpi /usr/share/openmpi; do
    [[ -d $d ]] && mount --bind "$empty" "$d"
  done
  # Debian's libmpi now reads as empty, or there was none.
  [[ ! -s $(readlink -f /usr/lib/x86_64-linux-gnu/libmpi.so.40 2> /dev/null || echo /nonexistent) ]]
}
export PATH=$(echo "$PATH" | tr ':' '\n' | grep -v -x -e /usr/bin/openmpi -e /usr/lib/x86_64-linux-gnu/openmpi/bin | paste -sd:)
export -f mpirun_part hide_debian_openmpi traced
export bundle work
if unshare -m --propagation private true 2> /dev/null; then
  how="Debian's OpenMPI and ssh hidden in a private mount namespace"
  unshare -m --propagation private bash -c 'hide_debian_openmpi && mpirun_part' > "$work/mpirun.log" 2>&1
else
  how="no mount namespace here (unshare refused): Debian's OpenMPI is only off PATH and OPAL_PREFIX is the bundle's"
  mpirun_part > "$work/mpirun.log" 2>&1
fi
rc=$?
if [[ $rc == 0 ]] && grep -q 'PASSED' "$work/mpirun.log"; then
  pass "mpirun: the bundle's mpirun ran test_collectives at 2 ranks ($how): $(grep -E '^\[  (PASSED|SKIPPED) ' "$work/mpirun.log" | sed 's/\x1b\[[0-9;]*m//g' | paste -sd' ')"
else
  tail -n 30 "$work/mpirun.log" | sed "s/^/    /"
  fail "mpirun: the bundle's mpirun did not run test_collectives at 2 ranks ($how)"
fi

# ---- origins: every library every process above loaded -------------------------------------------------
glibc='^(ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libmvec|libnsl|libnss_[a-z]+)\.so'
machine='^(libcuda|libnvidia-[a-z0-9_-]+|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc[a-z_.-]*|libnvJitLink)\.so'
processes=$(ls "$work/ld" | wc -l)
bad=$(cat "$work"/ld/* | sed -n 's/.*calling init: //p' | sort -u | while read -r path; do
  name=$(basename "$path")
  [[ $path == "$bundle"/* ]] && continue
  [[ $name =~ $glibc || $name =~ $machine ]] && continue
  echo "$path"
done)
loaded=$(cat "$work"/ld/* | sed -n 's/.*calling init: //p' | sort -u | wc -l)
from_bundle=$(cat "$work"/ld/* | sed -n 's/.*calling init: //p' | sort -u | grep -c "^$bundle/")
if ((processes < $(ls "$bundle/bin" | wc -l) + 3)); then
  fail "origins: only $processes processes left a loader log"
elif [[ -n $bad ]]; then
  fail "origins: loaded from outside the bundle, glibc and the GPU machine's CUDA libraries:"
  echo "$bad" | sed 's/^/    /'
  grep -l -F "$(echo "$bad" | head -n 1)" "$work"/ld/* | head -n 3 | sed 's/^/    in the log of /'
else
  pass "origins: $processes processes loaded $loaded distinct objects, $from_bundle from the bundle, the rest glibc or CUDA: $(cat "$work"/ld/* | sed -n 's/.*calling init: //p' | sort -u | grep -v "^$bundle/" | xargs -n1 basename | paste -sd' ')"
fi
echo "  (on this machine no GPU runs, so the libraries a GPU run loads later, cuDNN's engines and libcuda, are not in these logs)"

# ---- nccl: the bundle's own NCCL, when tools/gpu_bundle.sh was given one -----------------------------------
nccl_given=${OCTET_BUNDLE_NCCL:-}
if [[ -z $nccl_given ]]; then
  if [[ -e $bundle/nccl ]] || grep -q '^nccl ' "$out/MANIFEST"; then
    fail "nccl: no NCCL library was given, yet the bundle has nccl/ or a MANIFEST nccl line"
  else
    skip "nccl: no NCCL library given (OCTET_BUNDLE_NCCL=FILE, libnccl.so.2.* or its .xz, with LICENSE.txt beside it), so the bundle carries none and env.sh takes the machine's ($OCTET_BUNDLE_NCCL_FROM); CI has none"
  fi
else
  problems=()
  nccl_so=$bundle/nccl/lib/libnccl.so.2
  read -r _ m_version _ m_sha _ m_kernels _ m_from _ < <(grep '^nccl ' "$out/MANIFEST") || problems+=("MANIFEST has no nccl line")
  [[ -f $nccl_so ]] || problems+=("the bundle has no nccl/lib/libnccl.so.2")
  given_sha=$( { if [[ $nccl_given == *.xz ]]; then xz -dc "$nccl_given"; else cat "$nccl_given"; fi; } | sha256sum | cut -d' ' -f1)
  bundled_sha=$(sha256sum "$nccl_so" 2> /dev/null | cut -d' ' -f1)
  [[ $bundled_sha == "$given_sha" ]] || problems+=("the bundle's libnccl.so.2 ($bundled_sha) is not the library given ($given_sha)")
  [[ ${m_sha:-} == "$bundled_sha" ]] || problems+=("MANIFEST's sha256 ${m_sha:-none} is not the bundled library's")
  [[ ${m_from:-} == "$(readlink -f "$nccl_given")" ]] || problems+=("MANIFEST says it came from ${m_from:-nowhere}, not $nccl_given")
  code=$(python3 -c 'import ctypes, sys
v = ctypes.c_int(0); ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)); print(v.value)' "$nccl_so" 2> /dev/null)
  loaded_version=$((code / 10000)).$((code % 10000 / 100)).$((code % 100))
  [[ ${m_version:-} == "$loaded_version" ]] || problems+=("MANIFEST says NCCL ${m_version:-?}; the library says $loaded_version")
  license=${OCTET_BUNDLE_NCCL_LICENSE:-$(dirname "$(readlink -f "$nccl_given")")/LICENSE.txt}
  cmp -s "$bundle/nccl/LICENSE.txt" "$license" || problems+=("nccl/LICENSE.txt is not $license")
  grep -q 'Apache License' "$bundle/nccl/LICENSE.txt" 2> /dev/null || problems+=("nccl/LICENSE.txt holds no Apache License text")
  # env.sh: the bundle's NCCL, ahead of every folder of the machine's.
  [[ $OCTET_BUNDLE_NCCL_FROM == "the bundle's: NCCL $loaded_version"* ]] || problems+=("env.sh chose $OCTET_BUNDLE_NCCL_FROM")
  first_nccl_dir=$(tr ':' '\n' <<< "$LD_LIBRARY_PATH" | while read -r d; do [[ -e $d/libnccl.so.2 ]] && echo "$d" && break; done)
  [[ $first_nccl_dir == "$bundle/nccl/lib" ]] || problems+=("the first libnccl.so.2 on LD_LIBRARY_PATH is in ${first_nccl_dir:-no folder}")
  # The loader: ldd, and every process above that loaded an NCCL (LD_DEBUG=libs) loaded the bundle's.
  ldd_line=$(ldd "$bundle/bin/train_vit" | awk '$1 == "libnccl.so.2" {print $3}')
  [[ $ldd_line == "$nccl_so" ]] || problems+=("ldd train_vit: libnccl.so.2 => ${ldd_line:-not found}")
  nccl_loads=$(cat "$work"/ld/* | sed -n 's/.*calling init: \(.*libnccl[^ ]*\)$/\1/p' | sort | uniq -c)
  grep -v " $nccl_so\$" <<< "$nccl_loads" | grep -q . && problems+=("a process loaded another NCCL: $(grep -v " $nccl_so\$" <<< "$nccl_loads" | paste -sd' ')")
  nccl_processes=$(grep -l "calling init: $nccl_so\$" "$work"/ld/* 2> /dev/null | wc -l)
  ((nccl_processes > 0)) || problems+=("no process loaded the bundle's libnccl.so.2")
  info_line=$(grep '^nccl ' "$work/gpu_info_run.log")
  [[ $info_line == "nccl      $loaded_version (compiled against "*") from $nccl_so" ]] || problems+=("gpu_info says: $info_line")
  # The ABI: every NCCL function a bundled program calls is in the bundled library (NCCL keeps its ABI
  # within major version 2; the programs were compiled against the toolkit's NCCL headers).
  imported=$(for p in "$bundle"/bin/*; do nm -D --undefined-only "$p" 2> /dev/null; done | awk '{print $NF}' | grep -E '^p?nccl' | sort -u)
  missing=$(comm -23 <(echo "$imported") <(nm -D --defined-only "$nccl_so" | awk '{print $NF}' | sort -u))
  [[ -n $imported ]] || problems+=("no bundled program imports an NCCL function (nm -D)")
  [[ -z $missing ]] || problems+=("the bundled NCCL lacks $(paste -sd' ' <<< "$missing")")
  # OCTET_BUNDLE_NCCL_RUNTIME=machine: the machine's NCCL, as without one.
  machine_nccl=$( (export OCTET_BUNDLE_NCCL_RUNTIME=machine && unset LD_LIBRARY_PATH && source "$bundle/env.sh" > /dev/null &&
                   ldd "$bundle/bin/train_vit" | awk '$1 == "libnccl.so.2" {print $3}') 2>&1)
  [[ -n $machine_nccl && $machine_nccl != "$nccl_so" ]] || problems+=("with OCTET_BUNDLE_NCCL_RUNTIME=machine, ldd finds ${machine_nccl:-nothing}")
  if ((${#problems[@]} == 0)); then
    pass "nccl: the bundle carries NCCL $loaded_version (sha256 ${bundled_sha:0:12}..., kernels $m_kernels, from $nccl_given) with its license; env.sh puts it first ($OCTET_BUNDLE_NCCL_FROM) and $nccl_processes processes loaded it, ldd too; gpu_info: ${info_line#nccl      }; the $(wc -l <<< "$imported") NCCL functions the programs import are all in it; OCTET_BUNDLE_NCCL_RUNTIME=machine takes $machine_nccl"
  else
    fail "nccl: $(printf '%s; ' "${problems[@]}")"
  fi
fi

# ---- rehearsal: the GPU check from the bundle, on the CPU -------------------------------------------------
# A slice of the bundle's Fashion-MNIST, so that each train run's closing evaluation is short.
slice=$work/fashion-mnist-slice
python3 - "$bundle/fashion-mnist" "$slice" <<'PY'
import os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
for split, keep in (("train", 4000), ("t10k", 1000)):
    for kind, item_bytes in (("images-idx3", 28 * 28), ("labels-idx1", 1)):
        data = open(f"{src}/{split}-{kind}-ubyte", "rb").read()
        header = 4 + 4 * data[3]
        with open(f"{dst}/{split}-{kind}-ubyte", "wb") as f:
            f.write(data[:4] + struct.pack(">I", keep) + data[8:header] + data[header:header + keep * item_bytes])
PY
unpacked=/tmp/octet-bundle-$(cksum < "$out/bundle.tar.xz" | cut -d' ' -f1)
[[ -d $unpacked ]] && keep_unpacked=1 || keep_unpacked=0
rehearsal_seconds=300
check_out=$work/check-out
t0=$SECONDS
OUT=$check_out OCTET_GPU_CHECK_DEVICE=cpu OCTET_CHECK_SECONDS=$rehearsal_seconds MODEL=vit_tiny_patch16_224 BATCH=4 \
  STEPS=2 WARMUP=1 OCTET_CHECK_TRAIN_STEPS=12 OCTET_CHECK_DATA_DIR=$slice OCTET_BUNDLE_DIR=$out \
  bash tools/gpu_check.sh > "$work/check.log" 2>&1
rc=$?
took=$((SECONDS - t0))
problems=()
expect() {  # FILE PATTERN WHAT: grep -E PATTERN FILE, else a problem
  grep -Eq -- "$2" "$1" 2> /dev/null || problems+=("$3")
}
((rc == 0)) || problems+=("it exited $rc")
((took <= rehearsal_seconds + 20)) || problems+=("it took $took s against its deadline of $rehearsal_seconds s")
files=$(find "$check_out" -mindepth 1 | wc -l)
((files <= 8)) || problems+=("it wrote $files files to \$OUT: $(ls "$check_out" | paste -sd' ')")
[[ -n $(find "$check_out" -mindepth 1 -not -type f) ]] && problems+=("\$OUT holds more than plain files")
for f in summary.txt logs.tar.gz results.md; do [[ -s $check_out/$f ]] || problems+=("no $f"); done
tar -tzf "$check_out/logs.tar.gz" > "$work/check-logs.txt" 2> /dev/null || problems+=("logs.tar.gz does not list")
for f in gpu_info.txt bench_vit_bf16.log bench_vit_fp8.log bench_vit_fp8_unfused.log bench_vit_bf16_recompute.log \
         bench_vit_bf16_gelu_tanh.log \
         test_cuda_list.txt test_cuda_s0.log test_cuda_s3.log bf16.jsonl bf16_cpu.jsonl fsdp_lora_nccl.log \
         fsdp_hybrid_nccl_cpu.jsonl mpi_gpu_shared.log mpi_collectives_cuda.log mpi2_fsdp_fp8_gather.jsonl \
         mpi2_fsdp_fp8_gather_cpu.jsonl choose.txt bench.jsonl results.md; do
  grep -qx "./$f" "$work/check-logs.txt" || problems+=("logs.tar.gz lacks $f")
done
summary=$check_out/summary.txt
expect "$summary" '^VERDICT: PASSED' "the verdict is not PASSED"
expect "$summary" '^INFO  test_cuda: the tests skip on the CPU, saying: no CUDA device' "the GPU tests' skip reason is not in the summary"
expect "$summary" '^PASS  test_cuda results: [0-9]+ passed, 0 failed, [0-9]+ skipped' "no gtest verdict over the shards"
expect "$summary" '\(shard 4 of 4\): ran to the end' "no shards report"
expect "$summary" '^SKIP  PyTorch eager: skipped: (no torch|it needs a GPU)' "PyTorch eager does not say why it is skipped"
expect "$summary" '^SKIP  torch.compile: skipped: (no torch|it needs a GPU)' "torch.compile does not say why it is skipped"
expect "$summary" '^SKIP  kernel table: no (ncu|GPU to profile)' "the kernel table does not say why it is skipped"
expect "$summary" '^SKIP  bench_vit_bf16_head_start: skipped: no GPU stream to hold' \
  "the bench run with a head start does not say why it is skipped"
expect "$summary" '^SKIP  bench_vit_bf16_autotune: skipped: the CPU has no GPU algorithms to time' \
  "the autotuned bench run does not say why it is skipped"
expect "$summary" '^SKIP  bench_vit_bf16_bias_epilogue: skipped: the CPU has one kernel per op, no designs to choose' \
  "the bench run with the kernel design on trial does not say why it is skipped"
expect "$summary" '^INFO  bench_vit_fp8_chosen: not run: no trial of fp8 beat the library.s defaults, or none ran' \
  "the stage of the trials' winners does not say why it ran nothing"
expect "$summary" '^      why: bf16 --autotune on: not decided' "the stage of the trials' winners does not say why"
expect "$summary" '^PASS  fsdp_hybrid_nccl tracks its CPU twin: steps 1-6: .*bit for bit: True' "no track verdict (hybrid)"
expect "$summary" '^PASS  mpi2_fsdp_fp8_gather tracks its CPU twin: steps 1-6' "no track verdict (2 ranks over MPI)"
expect "$summary" '^INFO  fsdp_lora_nccl loss \(not judged.*\): mean loss of the first 5 steps' "no falls report"
expect "$summary" '^PASS  fsdp fp8: --fp8-all-gather against bf16 gathers: steps 1-[0-9]+: .*bit for bit: True' "no same-gpu comparison"
expect "$summary" '^stage times: bench [0-9]+ s, .*table [0-9]+ s' "no stage times"
expect "$check_out/results.md" '^\| Octet fp8, delayed scaling, --fp8-fused-producers off \| [0-9.]+ \|' "the table lacks fp8 unfused"
expect "$check_out/results.md" '^\| Octet bf16, --recompute blocks \| [0-9.]+ \|' "the table lacks bf16 recompute"
expect "$check_out/results.md" '^\| Octet bf16, --gelu tanh \(the GELU in cuBLASLt.s GEMM epilogues\) \| [0-9.]+ \|' \
  "the table lacks bf16 --gelu tanh"
if ((${#problems[@]} == 0)); then
  pass "rehearsal: the whole GPU check on the CPU from the bundle in $took s (deadline $rehearsal_seconds s): $(grep -c '^PASS' "$summary") steps passed, $files files; $(grep '^VERDICT' "$summary")"
else
  sed 's/^/    /' "$summary"
  fail "rehearsal: $(printf '%s; ' "${problems[@]}")"
fi

# The nccl_ranks stage at 2 ranks with --dist-backend nccl as on a GPU machine: on this machine NCCL
# refuses (the machine's NCCL is too old for ranks sharing a GPU, or, with a bundled NCCL 2.30, there is
# no GPU), so every part must say so with NCCL's or Octet's words and run again over MPI, and each
# fallback must track its twin; the fault tests and the killed rank end their jobs in time.
problems=()
check_out=$work/check-out-nccl
t0=$SECONDS
OUT=$check_out OCTET_GPU_CHECK_DEVICE=cpu OCTET_CHECK_SECONDS=300 OCTET_CHECK_NCCL_BACKEND=nccl OCTET_CHECK_NCCL_RANKS=2 \
  OCTET_CHECK_NCCL_STEPS=8 OCTET_CHECK_DATA_DIR=$slice OCTET_BUNDLE_DIR=$out \
  bash tools/gpu_check.sh nccl_ranks > "$work/check-nccl.log" 2>&1
rc=$?
took=$((SECONDS - t0))
summary=$check_out/summary.txt
((rc == 1)) || problems+=("it exited $rc, not 1 (NCCL cannot run here, and that must fail the check)")
expect "$summary" '^INFO  nccl_ranks: the check sets NCCL_MULTI_RANK_GPU_ENABLE=1 .*gpu_info: ranks sharing a GPU over NCCL: ' "no note of the variables it sets and of gpu_info's verdict"
expect "$summary" "^INFO  nccl_ranks: gpu_info's driver: .*NCCL_CUMEM_HOST_ENABLE=" "no note of the driver and NCCL_CUMEM_HOST_ENABLE, which decide whether ncclCommAbort waits"
if ! grep -Eq '^FAIL  nccl_ranks: the NCCL loaded refuses several ranks on one GPU: .*NCCL_MULTI_RANK_GPU_ENABLE' "$summary" &&
   ! grep -Eq '^INFO  nccl2_ddp over NCCL at 2 ranks: refused; its log says:' "$summary"; then
  problems+=("neither gpu_info's refusal nor the first run's NCCL words are in the summary")
fi
for run in nccl2_ddp nccl2_fsdp nccl2_fsdp_fp8_gather nccl2_hybrid nccl2_hybrid_fp8_gather; do
  expect "$summary" "^PASS  ${run}_mpi tracks its CPU twin: steps 1-6: .*bit for bit: True" "$run's fallback over MPI does not track its twin"
  expect "$summary" "^  fell back to the MPI backend: $run\$" "the verdict does not list $run as fallen back"
done
expect "$summary" '^PASS  test_nccl_ranks results: 0 passed, 0 failed, [0-9]+ skipped' "no verdict for test_nccl_ranks"
expect "$summary" '^INFO  test_nccl_ranks: the tests skip on the CPU, saying: no CUDA device' "test_nccl_ranks does not say why it skips"
for fault in fault_np2_rank1_all_reduce fault_np2_rank1_in_flight fault_np2_rank1_subgroup; do
  expect "$summary" "^PASS  ${fault}_mpi \\(" "$fault over MPI did not pass"
done
expect "$summary" "PASS: rank 1's exception ended all 2 ranks \\(mpi\\) in" "no fault_test.sh verdict in the summary"
expect "$summary" '^PASS  kill_np2_mpi: rank 1 killed \(SIGKILL\) after [0-9]+ steps; the job of 2 ranks ended [0-9.]+ s later, exit [1-9]' "the killed rank did not end the job in time"
expect "$summary" '^VERDICT: FAILED' "the verdict is not FAILED"
if ((${#problems[@]} == 0)); then
  pass "rehearsal: nccl_ranks at 2 ranks in $took s: NCCL $(grep -Eom1 '(is|NCCL) [0-9]+\.[0-9]+\.[0-9]+' "$summary" | grep -Eo '[0-9.]+$' | head -n 1) refused here and said why, and the 5 runs, the 3 fault tests and the killed rank ran over MPI instead, each run tracking its twin bit for bit"
else
  sed 's/^/    /' "$summary"
  fail "rehearsal (nccl_ranks): $(printf '%s; ' "${problems[@]}")"
fi

# The tests stage past a crash and a hang: each named with its test, and the tests the shards never
# reached run afterwards.
problems=()
check_out=$work/check-out-crash
OUT=$check_out OCTET_GPU_CHECK_DEVICE=cpu OCTET_CHECK_SECONDS=60 OCTET_CHECK_GTEST=$PWD/tests/tools/fake_gtest.py \
  FAKE_GTEST_CRASH=Fake.T05 FAKE_GTEST_HANG=Fake.T10 OCTET_CHECK_SHARD_SECONDS=5 OCTET_BUNDLE_DIR=$out \
  bash tools/gpu_check.sh tests > "$work/check-crash.log" 2>&1
rc=$?
summary=$check_out/summary.txt
((rc == 1)) || problems+=("it exited $rc, not 1")
expect "$summary" '\(shard 2 of 4\): CRASHED \(exit 139\) in Fake.T05 after 2 tests of its 4; 2 never started' "the crash is not named"
expect "$summary" '\(shard 3 of 4\): HUNG \(timed out after 5 s\) in Fake.T10' "the hang is not named"
expect "$summary" '\(shard 4 of 4\): ran to the end: 3 passed, 1 failed' "a shard with a failing test is not reported as having run to the end"
expect "$summary" '^INFO  test_cuda: rerun 1, the 3 tests no shard reached' "the unreached tests did not run"
expect "$summary" '16 tests listed, 16 started, 0 never started' "tests were left unrun"
expect "$summary" '^FAIL  test_cuda results: 13 passed, 1 failed, 0 skipped, 2 crashed or hung; failed: Fake.T03' "the verdict does not cover every shard"
if ((${#problems[@]} == 0)); then
  pass "rehearsal: the tests stage went past a crash and a hang, named both, and ran $(grep -o 'the [0-9]* tests no shard reached' "$summary")"
else
  sed 's/^/    /' "$summary"
  fail "rehearsal (crash and hang): $(printf '%s; ' "${problems[@]}")"
fi

# torch.compile behind its gate, with a stand-in for a python with torch and a GPU: timed after the
# gate opens and tabled; then a cold compile longer than the deadline, which must be reported as cut.
problems=()
for compile_seconds in 2 1000; do
  check_out=$work/check-out-compile-$compile_seconds
  OUT=$check_out OCTET_GPU_CHECK_DEVICE=cpu OCTET_CHECK_SECONDS=30 OCTET_PYTHON=$PWD/tests/tools/fake_torch_python.py \
    FAKE_TORCH_COMPILE_SECONDS=$compile_seconds OCTET_BUNDLE_DIR=$out \
    bash tools/gpu_check.sh eager compile table > "$work/check-compile.log" 2>&1
  rc=$?
  ((rc == 0)) || problems+=("with a compile of $compile_seconds s it exited $rc")
done
summary=$work/check-out-compile-2/summary.txt
expect "$summary" '^PASS  pytorch_eager' "the eager run did not pass"
expect "$summary" '^PASS  pytorch_compile \([0-9]+ s from its start; compiled and warmed up by 2 s' "the gated compile did not pass"
expect "$work/check-out-compile-2/results.md" '^\| PyTorch torch.compile, bf16 autocast, SGD\(fused=True\) \| [0-9.]+ \|' "no compile row in the table"
summary=$work/check-out-compile-1000/summary.txt
expect "$summary" '^CUT   torch.compile cut short after [0-9]+ s \(cold compile\)' "the cut compile is not reported as cut"
expect "$summary" '^VERDICT: PASSED' "a cut compile failed the check"
if ((${#problems[@]} == 0)); then
  pass "rehearsal: torch.compile behind its gate was timed and tabled, and a compile past the deadline was reported: $(grep -m1 -o 'torch.compile cut short after [0-9]* s (cold compile)' "$summary")"
else
  fail "rehearsal (torch.compile): $(printf '%s; ' "${problems[@]}")"
fi

# Stopped by a signal mid-step: the summary and the logs are there, and nothing it started is left.
problems=()
check_out=$work/check-out-stopped
# (exec: the signal must reach the check's own shell, not a subshell around it)
(OUT=$check_out OCTET_GPU_CHECK_DEVICE=cpu OCTET_CHECK_SECONDS=120 OCTET_CHECK_GTEST=$PWD/tests/tools/fake_gtest.py \
  FAKE_GTEST_HANG=Fake.T02 OCTET_CHECK_SHARD_SECONDS=100 OCTET_BUNDLE_DIR=$out \
  exec bash tools/gpu_check.sh tests > "$work/check-stopped.log" 2>&1) &
check_pid=$!
for _ in $(seq 60); do  # until the shards run (one of them hangs in Fake.T02)
  pgrep -f "python3 $PWD/tests/tools/fake_gtest.py" > /dev/null && break
  sleep 1
done
sleep 2
kill -TERM "$check_pid"
wait "$check_pid"
rc=$?
sleep 1
((rc == 143)) || problems+=("it exited $rc, not 143")
expect "$check_out/summary.txt" '^VERDICT: INCOMPLETE, stopped by a signal' "no INCOMPLETE verdict"
grep -qx './test_cuda_s2.log' <<< "$(tar -tzf "$check_out/logs.tar.gz" 2> /dev/null)" || problems+=("logs.tar.gz lacks the hung shard's log")
pgrep -f "python3 $PWD/tests/tools/fake_gtest.py" > /dev/null && problems+=("the hung shard was left running")
if ((${#problems[@]} == 0)); then
  pass "rehearsal: stopped by a signal while a shard hung, the check left its summary ($(grep '^VERDICT' "$check_out/summary.txt" | cut -c1-60)...) and logs, and ended the shard"
else
  fail "rehearsal (stopped): $(printf '%s; ' "${problems[@]}")"
fi
((keep_unpacked)) || rm -rf "$unpacked"
finish
