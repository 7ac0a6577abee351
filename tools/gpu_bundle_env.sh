# The environment of an unpacked Octet GPU bundle (tools/gpu_bundle.sh copies this file into it as
# env.sh). In bash, from anywhere:
#
#   source BUNDLE/env.sh && train_vit --device cuda ...
#
# It puts the bundle's programs and OpenMPI's launcher on PATH and its libraries first on
# LD_LIBRARY_PATH, followed by the folders that hold this machine's cuBLAS, cuDNN, NCCL and NVRTC
# (OCTET_CUDA_LIBS when set, else NVIDIA's wheels beside python3, else a CUDA toolkit under
# /usr/local), and tells OpenMPI, PMIx and hwloc to look for their plugins in the bundle only.
# The GCC runtime is the bundle's unless this machine's libstdc++ is newer (OCTET_BUNDLE_GCC_RUNTIME
# = auto, bundle or machine). NCCL is the bundle's own where it carries one (nccl/lib, made with
# OCTET_BUNDLE_NCCL=FILE; its MANIFEST's nccl line says which), ahead of the machine's, which is
# then not looked for; else the machine's as above (OCTET_BUNDLE_NCCL_RUNTIME = auto, or machine to
# take the machine's all the same). It fails, saying why, when this machine's glibc is older than
# the bundle needs. What it chose is left in OCTET_BUNDLE_GCC, OCTET_BUNDLE_NCCL_FROM,
# OCTET_BUNDLE_CUDA_DIRS and OCTET_BUNDLE_CUDA_MISSING for the caller to print.

octet_bundle_setup() {
  local root manifest needed have glibc_needed cuda_dirs=() missing=() soname dir found
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  manifest=$root/MANIFEST

  # glibc: the bundle was linked against the build machine's; an older one here cannot load it.
  glibc_needed=$(sed -n 's/^glibc_needed //p' "$manifest")
  have=$(getconf GNU_LIBC_VERSION 2> /dev/null | awk '{print $2}')
  if [[ -n $glibc_needed && -n $have && $(printf '%s\n%s\n' "$glibc_needed" "$have" | sort -V | head -n 1) != "$glibc_needed" ]]; then
    echo "octet bundle: this machine's glibc is $have; the bundle needs $glibc_needed or newer." \
         "Build the bundle on a machine with glibc <= $have." >&2
    return 1
  fi

  # NCCL: the bundle's own, where it carries one, comes right after the bundle's lib/ (ahead of every
  # machine folder), and the machine's is not looked for.
  local nccl_from nccl_mode=${OCTET_BUNDLE_NCCL_RUNTIME:-auto} nccl_dir=""
  if [[ $nccl_mode != auto && $nccl_mode != machine ]]; then
    echo "octet bundle: OCTET_BUNDLE_NCCL_RUNTIME is '$nccl_mode'; use auto or machine" >&2
    return 1
  fi
  if [[ -f $root/nccl/lib/libnccl.so.2 && $nccl_mode == auto ]]; then
    nccl_dir=$root/nccl/lib
    nccl_from="the bundle's: NCCL $(sed -n 's/^nccl \([^ ]*\) .*/\1/p' "$manifest") ($nccl_dir/libnccl.so.2)"
  elif [[ -f $root/nccl/lib/libnccl.so.2 ]]; then
    nccl_from="the machine's (OCTET_BUNDLE_NCCL_RUNTIME=machine; the bundle's NCCL $(sed -n 's/^nccl \([^ ]*\) .*/\1/p' "$manifest") is not used)"
  else
    nccl_from="the machine's (the bundle carries none)"
  fi

  # The CUDA libraries the bundle never carries, by soname (the MANIFEST lists what the programs link;
  # cuDNN also loads NVRTC for its runtime-compiled engines).
  needed=$(sed -n 's/^machine_libs //p' "$manifest")
  [[ -n $nccl_dir ]] && needed=$(tr ' ' '\n' <<< "$needed" | grep -vx 'libnccl\.so\.2' | paste -sd' ')
  local search=()
  if [[ -n ${OCTET_CUDA_LIBS:-} ]]; then
    IFS=: read -r -a search <<< "$OCTET_CUDA_LIBS"
  else
    local site
    while read -r site; do
      [[ -d $site/nvidia ]] && search+=("$site"/nvidia/*/lib "$site"/nvidia/*/*/lib)
    done < <(python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2> /dev/null)
    search+=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
  fi
  for soname in $needed libnvrtc.so.13; do
    found=""
    for dir in "${search[@]}"; do
      if [[ -e $dir/$soname ]]; then found=$dir; break; fi
    done
    if [[ -z $found ]] && ldconfig -p 2> /dev/null | grep -q "^[[:space:]]*$soname "; then found="(system)"; fi
    if [[ -z $found ]]; then
      missing+=("$soname")
    elif [[ $found != "(system)" && ! " ${cuda_dirs[*]} " =~ " $found " ]]; then
      cuda_dirs+=("$found")
    fi
  done

  # The GCC runtime: the newer of the bundle's and the machine's (a newer libstdc++ is a superset).
  local gcc=bundle machine_lib mode=${OCTET_BUNDLE_GCC_RUNTIME:-auto} ours theirs
  if [[ $mode == machine ]]; then
    gcc=machine
  elif [[ $mode == auto ]]; then
    machine_lib=$(ldconfig -p 2> /dev/null | awk '$1 == "libstdc++.so.6" && /x86-64/ {print $NF; exit}')
    if [[ -n $machine_lib && -f $root/lib-gcc/libstdc++.so.6 ]]; then
      ours=$(grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$root/lib-gcc/libstdc++.so.6" | sort -uV | tail -n 1)
      theirs=$(grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$machine_lib" | sort -uV | tail -n 1)
      if [[ $ours != "$theirs" && $(printf '%s\n%s\n' "$ours" "$theirs" | sort -V | tail -n 1) == "$theirs" ]]; then
        gcc=machine
      fi
    fi
  elif [[ $mode != bundle ]]; then
    echo "octet bundle: OCTET_BUNDLE_GCC_RUNTIME is '$mode'; use auto, bundle or machine" >&2
    return 1
  fi

  local path=$root/lib
  [[ $gcc == bundle ]] && path+=:$root/lib-gcc
  [[ -n $nccl_dir ]] && path+=:$nccl_dir
  local d
  for d in "${cuda_dirs[@]}"; do path+=:$d; done
  export OCTET_BUNDLE=$root OCTET_BUNDLE_GCC=$gcc OCTET_BUNDLE_NCCL_FROM=$nccl_from
  export OCTET_BUNDLE_CUDA_DIRS="${cuda_dirs[*]}" OCTET_BUNDLE_CUDA_MISSING="${missing[*]}"
  export PATH=$root/openmpi/bin:$root/bin:$PATH
  export LD_LIBRARY_PATH=$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # OpenMPI and PMIx find their components, help texts and parameters in the bundle, never in a
  # system installation; hwloc loads no plugins (none are carried).
  export OPAL_PREFIX=$root/openmpi OPAL_EXEC_PREFIX=$root/openmpi OPAL_BINDIR=$root/openmpi/bin
  export OPAL_LIBDIR=$root/lib OPAL_PKGLIBDIR=$root/openmpi/lib OPAL_DATADIR=$root/openmpi/share
  export OPAL_PKGDATADIR=$root/openmpi/share OPAL_SYSCONFDIR=$root/openmpi/etc
  # PMIx (4.x) searches its own plugin folder first, always: the one its install directories name,
  # which PMIX_PKGLIBDIR overrides (PMIX_PREFIX the rest). Its component_path parameter only appends
  # folders, so alone it let the bundle's PMIx load a machine's own PMIx plugins, built for another
  # PMIx version ('undefined symbol: pmix_output_info' on a GPU machine).
  export PMIX_PREFIX=$root/pmix PMIX_PKGLIBDIR=$root/pmix/lib PMIX_PKGDATADIR=$root/pmix/share
  export PMIX_MCA_mca_base_component_path=$root/pmix/lib
  export HWLOC_PLUGINS_PATH=$root/hwloc
  if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
}

octet_bundle_setup
