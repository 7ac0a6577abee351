# Finds Octet's dependencies. A missing one stops configuration with the Debian
# package that provides it, so `bash tools/setup.sh` (or apt-get) is the fix.

function(octet_require found what debian_package)
  if(NOT ${found})
    message(FATAL_ERROR
      "Octet needs ${what}, which was not found.\n"
      "Install it with:  sudo apt-get install ${debian_package}\n"
      "or run:           bash tools/setup.sh")
  endif()
endfunction()

find_package(Threads REQUIRED)

find_package(spdlog CONFIG QUIET)
octet_require(spdlog_FOUND "spdlog (logging)" libspdlog-dev)

find_package(GTest CONFIG QUIET)
if(NOT GTest_FOUND)
  find_package(GTest QUIET)
endif()
octet_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")

set(BLA_VENDOR OpenBLAS)
find_package(BLAS QUIET)
octet_require(BLAS_FOUND "OpenBLAS (CPU GEMM)" libopenblas-dev)
find_path(OCTET_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas)
octet_require(OCTET_CBLAS_INCLUDE_DIR "cblas.h from OpenBLAS" libopenblas-dev)

find_package(ZLIB QUIET)
octet_require(ZLIB_FOUND "zlib" zlib1g-dev)

find_package(CLI11 CONFIG QUIET)
octet_require(CLI11_FOUND "CLI11 (command-line flags)" libcli11-dev)

find_package(nlohmann_json CONFIG QUIET)
octet_require(nlohmann_json_FOUND "nlohmann-json" nlohmann-json3-dev)

find_package(MPI QUIET COMPONENTS CXX)
octet_require(MPI_CXX_FOUND "MPI (OpenMPI)" "libopenmpi-dev openmpi-bin")

find_package(OpenMP QUIET COMPONENTS CXX)
octet_require(OpenMP_CXX_FOUND "OpenMP (ships with g++)" g++)

if(OCTET_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${OCTET_CUDA_ARCHITECTURES})
  enable_language(CUDA)
  # CMake 3.25's table of nvcc dialect flags stops before nvcc 13; teach it the C++20 flag.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  if(NOT TARGET CUDA::cublasLt)
    message(FATAL_ERROR "The CUDA toolkit at ${CUDAToolkit_LIBRARY_DIR} has no cuBLASLt; reinstall the toolkit or configure with -DOCTET_CUDA=OFF")
  endif()
  # cuDNN and NCCL ship beside the toolkit here (or as Debian/NVIDIA packages elsewhere).
  set(_cuda_hints ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(CUDNN_LIBRARY cudnn HINTS ${_cuda_hints})
  octet_require(CUDNN_LIBRARY "cuDNN 9 (fused attention)" "cudnn9-cuda-13 (NVIDIA's repository), or configure with -DOCTET_CUDA=OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${_cuda_hints})
  octet_require(NCCL_LIBRARY "NCCL (GPU collectives)" "libnccl-dev, or configure with -DOCTET_CUDA=OFF")
  add_library(octet_cudnn INTERFACE)
  target_include_directories(octet_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
  target_link_libraries(octet_cudnn INTERFACE ${CUDNN_LIBRARY})
  add_library(octet_nccl INTERFACE)
  target_include_directories(octet_nccl INTERFACE ${NCCL_INCLUDE_DIR})
  target_link_libraries(octet_nccl INTERFACE ${NCCL_LIBRARY})
endif()

# Warnings every Octet target builds with.
add_library(octet_warnings INTERFACE)
target_compile_options(octet_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
