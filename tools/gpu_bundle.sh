#!/usr/bin/env bash
# Packs Octet's CUDA programs, with every library a bare GPU machine lacks, into one file that runs
# there with no compiler, no Debian packages and no network:
#
#   bash tools/gpu_bundle.sh [--nccl FILE] [OUT]   OUT/bundle.tar.xz and OUT/MANIFEST (OUT: build-gpu-bundle)
#
# --nccl FILE (or OCTET_BUNDLE_NCCL=FILE): an NCCL library to carry, libnccl.so.2.* or that file
# packed with xz (.xz), with its license text beside it as LICENSE.txt (or --nccl-license FILE,
# OCTET_BUNDLE_NCCL_LICENSE). Without one the bundle carries no NCCL, as below. With one it goes to
# nccl/lib/libnccl.so.2 with its license in nccl/, env.sh puts it ahead of the machine's NCCL, and
# MANIFEST's nccl line says which NCCL it is: its version (ncclGetVersion), sha256, the GPU
# architectures of its kernels, and the file it came from. It must be NCCL 2 (the programs are
# compiled against the toolkit's NCCL 2 headers; NCCL keeps its ABI within a major version), load
# nothing but glibc and the GCC runtime, and hold sm_90 kernels. The reason to carry one: NCCL 2.30
# and later let several ranks share one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1), which the GPU machine's
# own NCCL may not; built from NCCL's source for sm_90 alone (NVCC_GENCODE="-gencode=arch=compute_90,
# code=sm_90", and --no-compress so that xz sees the kernels) and stripped, it adds about 5 MiB to
# the bundle.
#
# then, on the GPU machine, from the repository root with OUT beside it:
#
#   bash tools/gpu_check.sh               (the whole GPU check: see tools/gpu_check.sh)
#
# It packs from build/, the default preset's Release CUDA build (configured here if it does not
# exist yet; refused with the fix if it is not a Release build with CUDA for sm_90), and builds only
# the targets below that are out of date. The bundle, unpacked:
#
#   bin/        the programs: the GPU tests, train_vit, bench_vit, bench_kernels, gpu_info, the CPU
#               suites, the mpi suites, the NCCL tests at several ranks (test_nccl_ranks) and
#               fault_rank_throws, stripped, with RUNPATH $ORIGIN/../lib
#   lib/        the libraries they need that the machine may lack: spdlog, fmt, OpenBLAS and its
#               Fortran runtime, zlib, the CUDA runtime, OpenMPI's libraries, PMIx, hwloc, libevent
#   lib-gcc/    the GCC runtime (libstdc++, libgcc_s, libgomp): env.sh uses it unless the machine's
#               own is newer (a newer one is a superset, and a CUDA library may need it)
#   openmpi/    OpenMPI's launcher (mpirun, orted), its MCA components and help texts, and a
#               parameter file for one machine without ssh (plm = isolated); pmix/ likewise
#   fashion-mnist/  the first 12,000 training images and the test set, for the train stage
#   nccl/       only with --nccl: lib/libnccl.so.2 and NCCL's LICENSE.txt
#   licenses/   the license of everything else the bundle redistributes: each Debian package's
#               copyright file (/usr/share/doc/PACKAGE/copyright) for the files taken from it, and the
#               license files of the wheel a CUDA library came from (the CUDA runtime's EULA)
#   env.sh      `source` it: PATH, LD_LIBRARY_PATH (the bundle, its NCCL if any, then the machine's
#               cuBLAS, cuDNN, NCCL and NVRTC), OPAL_* and PMIX_* so that OpenMPI finds itself in the
#               bundle
#   MANIFEST    the commit, the build, the NCCL carried (if any), and every file with the path it was
#               taken from and the license file that covers it
#
# Never carried: cuBLAS and cuBLASLt, cuDNN, NVRTC and the driver, and NCCL unless --nccl gives it.
# They are hundreds of MB and the GPU machine has them (its CUDA toolkit, or NVIDIA's wheels beside
# PyTorch); env.sh finds them. Also left out: OpenMPI's components for fabrics (UCX, libfabric, verbs, PSM), which one
# machine does not use and whose libraries are large. The bundle must stay within 40 MiB
# (OCTET_BUNDLE_MAX_MIB): the programs all hold the same CUDA kernels, so they are compressed
# together with a dictionary large enough to see that (xz, 256 MiB window; 185 MB -> about 8 MB).
#
# tools/gpu_bundle_check.sh proves the bundle on this machine: its size, where every library it
# loads comes from, the CPU suites from the unpacked bundle, and mpirun from the bundle at 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
nccl_given=${OCTET_BUNDLE_NCCL:-} nccl_license=${OCTET_BUNDLE_NCCL_LICENSE:-} out=build-gpu-bundle
while (($#)); do
  case $1 in
    --nccl) nccl_given=${2:?--nccl needs a file}; shift 2 ;;
    --nccl-license) nccl_license=${2:?--nccl-license needs a file}; shift 2 ;;
    -*) echo "gpu_bundle: unknown flag $1 (flags: --nccl FILE, --nccl-license FILE; then OUT)" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
# The NCCL to carry, checked before anything is built: a file, and the license text that must travel
# with it (Apache-2.0 asks that every copy come with one).
if [[ -n $nccl_given ]]; then
  [[ -f $nccl_given ]] || { echo "gpu_bundle: --nccl $nccl_given: no such file" >&2; exit 2; }
  nccl_given=$(readlink -f "$nccl_given")
  nccl_license=${nccl_license:-$(dirname "$nccl_given")/LICENSE.txt}
  if [[ ! -s $nccl_license ]]; then
    echo "gpu_bundle: no license text for $nccl_given: $nccl_license does not exist. NCCL's license (LICENSE.txt" \
         "in NCCL's source) must travel with the library; pass it with --nccl-license FILE" >&2
    exit 2
  fi
  nccl_license=$(readlink -f "$nccl_license")
fi
build=build
max_mib=${OCTET_BUNDLE_MAX_MIB:-40}
# xz's preset (OCTET_BUNDLE_XZ_PRESET, 0-9; 6 unless set). On 2 cores, 506 MB of tar: preset 6 took
# 208 s for 34.7 MiB, preset 1 44 s for 37.8 MiB (the dictionary stays 256 MiB either way).
# tools/gpu_bundle_check.sh packs with 1 when it carries no NCCL (CI): the same files, looser. A
# bundle a faster preset leaves over the limit is packed again at 6.
xz_preset=${OCTET_BUNDLE_XZ_PRESET:-6}
[[ $xz_preset =~ ^[0-9]$ ]] || { echo "gpu_bundle: OCTET_BUNDLE_XZ_PRESET=$xz_preset: give a digit, 0-9 (6 is the default)" >&2; exit 2; }
programs=(gpu_info test_cuda train_vit bench_vit bench_kernels
          test_core test_kernels test_autograd test_nn test_optim test_models test_data test_apps test_local_group test_nccl_mapping
          test_collectives test_gpu_shared_mpi test_nccl_ranks
          fault_rank_throws)
# Packed when the build defines them (tools/gpu_check.sh runs each one it finds).
optional_programs=()

# ---- the build ---------------------------------------------------------------------------------------
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
if [[ ! -f $build/CMakeCache.txt ]]; then
  bash tools/setup.sh
  cmake --preset default --log-level=WARNING
fi
if [[ $(cache_value OCTET_CUDA) != ON ]]; then
  echo "gpu_bundle: $build/ is a CPU-only build (OCTET_CUDA=$(cache_value OCTET_CUDA)): nvcc was not found when it" \
       "was configured. Install the CUDA toolkit with nvcc on PATH, then: rm -rf $build && cmake --preset default" >&2
  exit 2
fi
if [[ $(cache_value CMAKE_BUILD_TYPE) != Release || ! ";$(cache_value OCTET_CUDA_ARCHITECTURES);" =~ \;90[a]?\; ]]; then
  echo "gpu_bundle: $build/ is CMAKE_BUILD_TYPE=$(cache_value CMAKE_BUILD_TYPE)," \
       "OCTET_CUDA_ARCHITECTURES=$(cache_value OCTET_CUDA_ARCHITECTURES); the bundle is a Release build for sm_90." \
       "Fix: cmake --preset default -DCMAKE_BUILD_TYPE=Release -DOCTET_CUDA_ARCHITECTURES=90" >&2
  exit 2
fi
targets=$(cmake --build "$build" --target help 2> /dev/null)
for p in "${optional_programs[@]}"; do
  grep -Eq "^(\.\.\. )?$p(:| |$)" <<< "$targets" && programs+=("$p")
done
cmake --build "$build" -j "$(nproc)" --target "${programs[@]}"

# ---- what the GPU machine has, and what it never gets from us ----------------------------------------
glibc='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libmvec|libnsl|libnss_[a-z]+)\.so'
machine_cuda='^(libcuda|libnvidia-[a-z0-9_-]+|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc[a-z_.-]*|libnvJitLink)\.so'
gcc_runtime='^(libstdc\+\+|libgcc_s|libgomp|libatomic)\.so'
fabric='^lib(uc[mpst]|fabric|psm|psm2|psm_infinipath|infinipath|ibverbs|rdmacm|efa|nl-[a-z0-9-]+|mca_common_(ucx|ofi|verbs)|oshmem)[.-]'

stage=$(mktemp -d /tmp/octet-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,lib,lib-gcc,openmpi/bin,openmpi/lib,openmpi/share,openmpi/etc,pmix/lib,pmix/share,hwloc}
manifest=$stage/MANIFEST.files
: > "$manifest"
take() {  # take SRC DEST: copy (following links) and remember where it came from
  cp -L "$1" "$2"
  printf '%s <- %s\n' "${2#"$stage"/}" "$(readlink -f "$1")" >> "$manifest"
}

for p in "${programs[@]}"; do
  take "$build/bin/$p" "$stage/bin/$p"
  strip --strip-unneeded "$stage/bin/$p"
done

# OpenMPI, from where this machine's mpirun and libmpi live (ompi_info names the folders).
mpirun_path=$(command -v mpirun || true)
if [[ -z $mpirun_path ]] || ! command -v ompi_info > /dev/null; then
  echo "gpu_bundle: OpenMPI's mpirun and ompi_info are needed (sudo apt-get install openmpi-bin)" >&2
  exit 2
fi
ompi_path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
ompi_pkglibdir=$(ompi_path pkglibdir)
ompi_pkgdatadir=$(ompi_path pkgdatadir)
ompi_version=$(ompi_info --parsable | sed -n 's/^ompi:version:full://p')
take "$mpirun_path" "$stage/openmpi/bin/mpirun"
orted=$(dirname "$(readlink -f "$mpirun_path")")/orted
[[ -x $orted ]] && take "$orted" "$stage/openmpi/bin/orted"
for prted in prted prte; do  # OpenMPI 5 launches through PRRTE
  command -v "$prted" > /dev/null && take "$(command -v "$prted")" "$stage/openmpi/bin/$prted"
done
components=()
skipped_components=()
for c in "$ompi_pkglibdir"/mca_*.so; do
  name=$(basename "$c")
  # OpenSHMEM's frameworks and the fabric transports are not used by one machine's MPI ranks.
  if [[ $name =~ ^mca_(spml|sshmem|memheap|scoll|atomic)_ ]] || ldd "$c" | awk '{print $1}' | grep -Eq "$fabric"; then
    skipped_components+=("$name")
    continue
  fi
  take "$c" "$stage/openmpi/lib/$name"
  components+=("$stage/openmpi/lib/$name")
done
cp "$ompi_pkgdatadir"/help-*.txt "$stage/openmpi/share/"
cat > "$stage/openmpi/etc/openmpi-mca-params.conf" <<'EOF'
# OpenMPI's parameters inside Octet's GPU bundle: ranks on this one machine only.
# plm = isolated starts them without ssh, which a bare GPU machine may not have.
plm = isolated
btl = self,vader
pml = ob1
btl_base_warn_component_unused = 0
EOF
# PMIx's plugins, found from libpmix (OpenMPI 4 uses an external PMIx on Debian).
pmix_lib=$(ldd "$ompi_pkglibdir"/mca_pmix_*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ {print $3; exit}')
if [[ -n $pmix_lib ]]; then
  pmix_root=$(dirname "$(readlink -f "$pmix_lib")")
  for plugin in "$pmix_root"/pmix/*.so; do
    [[ -f $plugin ]] || continue
    take "$plugin" "$stage/pmix/lib/$(basename "$plugin")"
    components+=("$stage/pmix/lib/$(basename "$plugin")")
  done
  [[ -d $pmix_root/../share/pmix ]] && cp "$pmix_root"/../share/pmix/help-*.txt "$stage/pmix/share/" 2> /dev/null || true
fi

# Every library the programs, the launcher and its components load, by the real loader's answer
# (ldd runs the dynamic loader in trace mode), sorted into the machine's, the GCC runtime and ours.
objects=("$stage"/bin/* "$stage"/openmpi/bin/* "${components[@]}")
for o in "${objects[@]}"; do ldd "$o"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u > "$stage/needed"
while read -r soname path; do
  if [[ $soname =~ $glibc || $soname =~ $machine_cuda ]]; then continue; fi
  if [[ $soname =~ $fabric ]]; then
    echo "gpu_bundle: $soname ($path) is a fabric library and is never carried; something that needs it was packed" >&2
    exit 1
  fi
  if [[ $soname =~ $gcc_runtime ]]; then take "$path" "$stage/lib-gcc/$soname"; else take "$path" "$stage/lib/$soname"; fi
done < "$stage/needed"
awk '{print $1}' "$stage/needed" | grep -E "$machine_cuda" | sort -u | paste -sd' ' > "$stage/machine_libs" || true

# RUNPATH: the bundle's own lib/, never a folder of the machine the bundle was built on.
set_runpath() {  # FILE RUNPATH (rewritten in place: it must not be longer than the one there)
  readelf -d "$1" | grep -Eq '\((RUNPATH|RPATH)\)' || return 0  # none to rewrite (OpenMPI's own programs)
  printf 'file(RPATH_SET FILE "%s" NEW_RPATH "%s")\n' "$1" "$2" > "$stage/runpath.cmake"
  cmake -P "$stage/runpath.cmake" > /dev/null
}
for p in "$stage"/bin/*; do set_runpath "$p" '$ORIGIN/../lib'; done
for p in "$stage"/openmpi/bin/*; do set_runpath "$p" '$ORIGIN/../../lib'; done
rm -f "$stage/runpath.cmake"

# A slice of Fashion-MNIST, so that the GPU machine trains on real images too: the first 12,000
# training images and the whole test set, unpacked (xz packs raw IDX tighter than gzip does).
fashion=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [[ -f $fashion/train-images-idx3-ubyte.gz ]]; then
  python3 - "$fashion" "$stage/fashion-mnist" 12000 <<'PY'
import gzip, os, struct, sys
src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst)
for split, limit in (("train", keep), ("t10k", None)):
    for kind, item_bytes in (("images-idx3", 28 * 28), ("labels-idx1", 1)):
        data = gzip.open(f"{src}/{split}-{kind}-ubyte.gz").read()
        header = 4 + 4 * data[3]  # magic (its last byte: the number of dimensions), then one u32 per dimension
        count = struct.unpack(">I", data[4:8])[0]
        n = count if limit is None else min(limit, count)
        with open(f"{dst}/{split}-{kind}-ubyte", "wb") as f:
            f.write(data[:4] + struct.pack(">I", n) + data[8:header] + data[header:header + n * item_bytes])
PY
  printf 'fashion-mnist/ <- %s (the first 12000 training images, all 10000 test images)\n' "$fashion" >> "$manifest"
else
  echo "gpu_bundle: no Fashion-MNIST at $fashion (sudo apt-get install dataset-fashion-mnist): the GPU check's" \
       "train stage will use synthetic images" >&2
fi

# ---- NCCL, when given ----------------------------------------------------------------------------------
nccl_line=""
if [[ -n $nccl_given ]]; then
  nccl_refused() { echo "gpu_bundle: --nccl $nccl_given: $*" >&2; exit 2; }
  mkdir -p "$stage/nccl/lib"
  nccl_so=$stage/nccl/lib/libnccl.so.2
  nccl_how=""
  if [[ $nccl_given == *.xz ]]; then
    xz -dc "$nccl_given" > "$nccl_so" || nccl_refused "xz could not unpack it"
    nccl_how=" (unpacked from xz)"
  else
    cp -L "$nccl_given" "$nccl_so"
  fi
  chmod 0755 "$nccl_so"
  soname=$(readelf -d "$nccl_so" 2> /dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [[ $soname == libnccl.so.2 ]] ||
    nccl_refused "its soname is '${soname:-none (not a shared library)}', not libnccl.so.2: the programs load libnccl.so.2"
  # What it loads besides: glibc and the GCC runtime only, which the bundle and every machine have.
  nccl_loads=$(ldd "$nccl_so" | awk '$2 == "=>" {print $1}' | { grep -Ev "$glibc|$gcc_runtime" || true; } | paste -sd' ')
  [[ -z $nccl_loads ]] || nccl_refused "it loads $nccl_loads, which the bundle does not carry"
  # The version the library itself reports (ncclGetVersion needs no GPU), and the GPU architectures
  # of its kernels, from the fat binaries in its .nv_fatbin section.
  nccl_code=$(python3 -c 'import ctypes, sys
v = ctypes.c_int(0)
print(v.value if ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)) == 0 else -1)' "$nccl_so") ||
    nccl_refused "loading it to ask ncclGetVersion failed"
  ((nccl_code >= 20900 && nccl_code / 10000 == 2)) ||
    nccl_refused "ncclGetVersion says $nccl_code: not NCCL 2.9 or newer within major version 2, whose ABI the programs were built for"
  nccl_version=$((nccl_code / 10000)).$((nccl_code % 10000 / 100)).$((nccl_code % 100))
  nccl_kernels=$(python3 - "$nccl_so" <<'PY'
# Each fat binary: a header (magic 0xBA55ED50, version, header size, size), then entries: kind (1 PTX,
# 2 ELF cubin), header size, payload size, and at byte 28 the architecture (90 for sm_90).
import struct, subprocess, sys
path = sys.argv[1]
sections = subprocess.run(["readelf", "-W", "-S", path], capture_output=True, text=True).stdout
found = [line.split("]", 1)[1].split() for line in sections.splitlines() if " .nv_fatbin " in line]
kinds = {}
if found:
    offset, size = int(found[0][3], 16), int(found[0][4], 16)
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    pos = 0
    while pos + 16 <= len(data):
        magic, _, header, fat = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:
            pos += 8
            continue
        entry, end = pos + header, pos + header + fat
        while entry + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            name = {1: "compute", 2: "sm"}.get(kind, f"kind{kind}") + f"_{arch}"
            kinds[name] = kinds.get(name, 0) + 1
            if entry_header == 0:
                break
            entry += entry_header + payload
        pos = end
print(",".join(sorted(kinds, key=lambda k: (int(k.split("_")[-1]), k))))
PY
)
  [[ ,$nccl_kernels, == *,sm_90,* || ,$nccl_kernels, =~ ,compute_([0-8][0-9]|90), ]] ||
    nccl_refused "it holds no kernels for the GPU machine's sm_90 (H100, H200): ${nccl_kernels:-no fat binaries found}"
  cp "$nccl_license" "$stage/nccl/LICENSE.txt"
  printf 'nccl/lib/libnccl.so.2 <- %s%s\n' "$nccl_given" "$nccl_how" >> "$manifest"
  printf 'nccl/LICENSE.txt <- %s\n' "$nccl_license" >> "$manifest"
  nccl_line="nccl $nccl_version sha256 $(sha256sum "$nccl_so" | cut -d' ' -f1) kernels $nccl_kernels <- $nccl_given$nccl_how"
  echo "gpu_bundle: carrying NCCL $nccl_version (kernels $nccl_kernels) from $nccl_given"
fi

# ---- licenses: the text that covers each file the bundle redistributes ------------------------------------
# A file from a Debian package: the package's copyright file. A file from a Python wheel (NVIDIA's CUDA
# libraries, and the CUDA toolkits installed from them): the license files of the wheel's dist-info,
# found by its RECORD. Octet's own programs and generated files need none; anything else is listed as
# having none found, in MANIFEST and here.
mkdir -p "$stage/licenses"
license_of() {  # SOURCE: prints the bundle path of the license that covers SOURCE (copied once), or nothing
  local src=$1 alt pkg dir record dist
  [[ -d $src ]] && src=$(find "$src" -maxdepth 1 -type f | sort | head -n 1)
  for alt in "$src" "/lib/${src#/usr/lib/}" "/usr/lib/${src#/lib/}" "/bin/${src#/usr/bin/}"; do
    pkg=$(dpkg -S "$alt" 2> /dev/null | head -n 1 | cut -d: -f1) && [[ -n $pkg ]] && break
  done
  if [[ -n $pkg && -f /usr/share/doc/$pkg/copyright ]]; then
    [[ -f $stage/licenses/$pkg.copyright ]] || cp "/usr/share/doc/$pkg/copyright" "$stage/licenses/$pkg.copyright"
    echo "licenses/$pkg.copyright"
    return
  fi
  dir=$(dirname "$src")
  while [[ $dir != / ]]; do
    for record in "$dir"/dist-info/*/RECORD "$dir"/*.dist-info/RECORD; do
      [[ -f $record ]] && grep -q "/$(basename "$src")," "$record" || continue
      dist=$(basename "$(dirname "$record")")
      dist=${dist%.dist-info}
      if [[ ! -d $stage/licenses/$dist ]]; then
        mkdir -p "$stage/licenses/$dist"
        find "$(dirname "$record")" -maxdepth 2 -type f \( -iname 'licen[cs]e*' -o -iname 'eula*' -o -iname 'notice*' \) \
          -exec cp {} "$stage/licenses/$dist/" \;
      fi
      compgen -G "$stage/licenses/$dist/*" > /dev/null && echo "licenses/$dist" && return
    done
    dir=$(dirname "$dir")
  done
}
declare -A license_files=()
unlicensed=()
while read -r dest _ src _; do
  [[ $dest == bin/* || $dest == nccl/* ]] && continue  # Octet's own programs; NCCL's license is in nccl/
  license=$(license_of "$src") || true
  if [[ -z $license ]]; then unlicensed+=("$dest"); continue; fi
  license_files[$license]+=" $dest"
done < "$manifest"
license_lines=()
for license in "${!license_files[@]}"; do
  read -r -a covered <<< "${license_files[$license]}"
  license_lines+=("license $license covers ${#covered[@]}: ${covered[*]}")
done
if ((${#unlicensed[@]})); then
  echo "gpu_bundle: no license text found for ${unlicensed[*]} (not from a Debian package or a wheel): see MANIFEST" >&2
fi

cp tools/gpu_bundle_env.sh "$stage/env.sh"
glibc_needed=$(for o in "$stage"/bin/* "$stage"/lib/* "$stage"/lib-gcc/* "$stage"/openmpi/bin/* "$stage"/nccl/lib/*; do
                 [[ -f $o ]] || continue
                 objdump -T "$o" 2> /dev/null | grep -o 'GLIBC_2\.[0-9]*' || true; done | sort -uV | tail -n 1)
{
  echo "commit $(git rev-parse HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD 2> /dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(c++ --version | head -n 1)"
  echo "cmake CMAKE_BUILD_TYPE=$(cache_value CMAKE_BUILD_TYPE) OCTET_CUDA_ARCHITECTURES=$(cache_value OCTET_CUDA_ARCHITECTURES) $("$(cache_value CMAKE_CUDA_COMPILER)" --version | tail -n 1)"
  echo "openmpi $ompi_version"
  [[ -n $nccl_line ]] && echo "$nccl_line"
  echo "glibc_needed ${glibc_needed#GLIBC_}"
  echo "machine_libs $(cat "$stage/machine_libs")"
  echo "skipped_components ${skipped_components[*]}"
  echo "no_license_found ${unlicensed[*]}"
  printf '%s\n' "${license_lines[@]}" | sort
  cat "$manifest"
} > "$stage/MANIFEST"
rm -f "$manifest" "$stage/needed" "$stage/machine_libs"

mkdir -p "$out"
rm -f "$out/bundle.tar.xz" "$out/MANIFEST"
# One xz stream with a 256 MiB window, so that the second copy of the CUDA kernels costs nothing.
pack() { tar -C "$stage" --sort=name -cf - . | xz -T1 --lzma2=preset="$1",dict=256MiB > "$out/bundle.tar.xz"; }
pack "$xz_preset"
size=$(stat -c %s "$out/bundle.tar.xz")
# A faster preset packs looser: over the limit, it is the default's size that counts.
if ((size > max_mib * 1024 * 1024 && xz_preset < 6)); then
  echo "gpu_bundle: $((size / 1024)) KiB at xz preset $xz_preset, over $max_mib MiB: packing again at preset 6"
  pack 6
  size=$(stat -c %s "$out/bundle.tar.xz")
fi
cp "$stage/MANIFEST" "$out/MANIFEST"
unpacked=$(du -sb "$stage" | cut -f1)
printf 'gpu_bundle: %s, %s MiB (%s MiB unpacked): %d programs, %d libraries, %d GCC runtime, %d OpenMPI components\n' \
  "$out/bundle.tar.xz" "$(awk -v b="$size" 'BEGIN {printf "%.1f", b / 1048576}')" \
  "$(awk -v b="$unpacked" 'BEGIN {printf "%.0f", b / 1048576}')" \
  "$(ls "$stage/bin" | wc -l)" "$(ls "$stage/lib" | wc -l)" "$(ls "$stage/lib-gcc" | wc -l)" "$(ls "$stage/openmpi/lib" | wc -l)"
if ((size > max_mib * 1024 * 1024)); then
  echo "gpu_bundle: the bundle is over its limit of $max_mib MiB; see $out/MANIFEST for what is in it" >&2
  exit 1
fi
