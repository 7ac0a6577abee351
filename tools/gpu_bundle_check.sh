#!/usr/bin/env bash
# Proves the GPU bundle (tools/gpu_bundle.sh) on a machine without a GPU, so that a GPU machine's
# minutes go to Octet and not to its packaging. .ci/run runs it after the tests. Five parts:
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
#
#   bash tools/gpu_bundle_check.sh        after a build (bash tools/test.sh); about 4 minutes on 2 cores
#
# A part that cannot run here (no CUDA build, no unshare) says so and counts as skipped; the last
# line counts passed, failed and skipped parts, and the exit status is non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
max_mib=40
passed=0 failed=0 skipped=0
pass() { echo "gpu_bundle_check: PASS $*"; passed=$((passed + 1)); }
fail() { echo "gpu_bundle_check: FAIL $*"; failed=$((failed + 1)); }
skip() { echo "gpu_bundle_check: SKIP $*"; skipped=$((skipped + 1)); }
finish() {
  echo "gpu_bundle_check: $passed passed, $failed failed, $skipped skipped"
  exit $((failed > 0))
}

if ! grep -q '^OCTET_CUDA:BOOL=ON' build/CMakeCache.txt 2> /dev/null; then
  why="build/ is not a CUDA build (no nvcc when it was configured, or not configured: run bash tools/test.sh first)"
  for part in size origins cpu gpu mpirun; do skip "$part: $why; the bundle holds the CUDA programs"; done
  finish
fi

# ---- size -------------------------------------------------------------------------------------------
out=build-gpu-bundle
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
for p in gpu_info train_vit bench_vit; do
  traced "$p" "$bundle/bin/$p" --help > "$work/$p.log" 2>&1 || { fail "origins: $p --help failed"; cat "$work/$p.log"; }
done
traced gpu_info_run "$bundle/bin/gpu_info" > "$work/gpu_info_run.log" 2>&1
# Every other program loads its libraries by listing its tests (the mpi suites alone, as a world of one).
for p in "$bundle"/bin/*; do
  name=$(basename "$p")
  compgen -G "$work/ld/$name.*" > /dev/null && continue
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
hide_debian_openmpi() {  # in a private mount namespace: empty folders over OpenMPI's, /dev/null over its files
  local empty f d
  empty=$(mktemp -d)
  for f in /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info /usr/bin/ssh /usr/bin/rsh \
           /usr/lib/x86_64-linux-gnu/lib{mpi,mpi_cxx,open-rte,open-pal}.so.40.*; do
    [[ -f $f && ! -L $f ]] && mount --bind /dev/null "$f"
  done
  for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /etc/openmpi /usr/share/openmpi; do
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
finish
