#!/usr/bin/env bash
# Run on the development machine: builds Octet for Hopper (Release, CUDA, sm_90) in build-gpu/ and
# packs what tools/gpu_check.sh needs on a GPU machine into build-gpu-bundle/bundle.tar.xz:
#   bin/  test_cuda, bench_vit, train_vit and the CPU test suites, stripped
#   lib/  the shared libraries they load that a bare CUDA image may lack (spdlog, fmt, OpenBLAS and
#         its Fortran runtime, the CUDA runtime); lib-fallback/ the GCC runtime, used there only if
#         the image's own is missing or too old.
# cuBLASLt and cuDNN are too large to carry (hundreds of MB); gpu_check.sh takes the GPU machine's
# (its CUDA toolkit or NVIDIA's pip wheels beside PyTorch). The driver (libcuda) is always the machine's.
#
#   bash tools/gpu_bundle.sh          then, with the device tool:
#   run(command="bash tools/gpu_check.sh", carry=["build-gpu-bundle"])
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-gpu
out=build-gpu-bundle
export CCACHE_DIR=${CCACHE_DIR:-/tmp/ccache} CCACHE_BASEDIR=$PWD
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOCTET_CUDA=ON -DOCTET_CUDA_ARCHITECTURES=90 \
  "${launcher[@]}" --log-level=WARNING
targets=(test_cuda bench_vit train_vit test_core test_kernels test_autograd test_nn test_optim test_models test_data
         test_apps test_gpu_shared_mpi)
ninja -C "$build" -j "${JOBS:-$(nproc)}" "${targets[@]}"

stage=$build/stage
rm -rf "$stage" "$out" && mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback" "$out"
for t in "${targets[@]}"; do
  cp "$build/bin/$t" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$t"
done
# glibc and the driver belong to the machine; cuBLASLt/cuDNN/NVRTC come from its CUDA install.
machine='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libcuda|libnvidia|libcublas|libcublasLt|libcudnn|libnvrtc|libnvJitLink)\.so'
gcc_runtime='^(libstdc\+\+|libgcc_s|libgomp)\.so'
for t in "${targets[@]}"; do ldd "$build/bin/$t"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    [[ $soname =~ $machine ]] && continue
    if [[ $soname =~ $gcc_runtime ]]; then cp -L "$path" "$stage/lib-fallback/$soname"; else cp -L "$path" "$stage/lib/$soname"; fi
  done
tar -C "$stage" -cf - bin lib lib-fallback | xz -T0 -6 > "$out/bundle.tar.xz"
git rev-parse HEAD > "$out/commit"
size=$(stat -c %s "$out/bundle.tar.xz")
echo "gpu_bundle: $out/bundle.tar.xz, $((size / 1024 / 1024)) MiB ($(ls "$stage/bin" | wc -l) programs, libs: $(ls "$stage/lib" "$stage/lib-fallback" | grep -c so))"
((size < 56 * 1024 * 1024)) || { echo "gpu_bundle: over 56 MiB; the device tool carries 64 MiB with the tree" >&2; exit 1; }
echo "next: run(command=\"bash tools/gpu_check.sh\", carry=[\"$out\"]) with the device tool"
