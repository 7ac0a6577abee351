// gpu_info: what a GPU run of Octet really runs on. Prints the driver, every visible device, and
// the versions of the CUDA runtime, cuBLASLt, cuDNN and NCCL as the loaded libraries report them
// (cudnnGetVersion() and the like, not the headers Octet was compiled with), each with the file
// it was loaded from. A library older than the headers, or taken from an unexpected folder, is
// the first thing to rule out when a GPU run misbehaves. (The programs are compiled against the CUDA
// toolkit's NCCL headers and run against whichever libnccl.so.2 the loader finds, the GPU bundle's
// own where it carries one: NCCL keeps its ABI within major version 2.) Last, whether that NCCL
// lets several ranks share one GPU, given NCCL_MULTI_RANK_GPU_ENABLE (distributed/nccl_shared_device.h).
//
//   build/bin/gpu_info                 human-readable
//   build/bin/gpu_info --json          one JSON object (tools/gpu_check.sh keeps it with its logs)
//   build/bin/gpu_info --require-gpu   exit 1 when no device is visible
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <link.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distributed/nccl_shared_device.h"

namespace {

// major.minor.patch from the encodings the libraries use.
std::string cuda_version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
std::string cudnn_version(size_t v) {  // 9.x: major·10000 + minor·100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}
std::string cublas_version(size_t v) {  // major·10000 + minor·100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}

// The path each loaded shared object whose name contains `stem` was loaded from.
std::string loaded_from(const std::string& stem) {
  struct Search {
    std::string stem, path;
  } search{stem, ""};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        const size_t slash = name.rfind('/');
        const std::string file = slash == std::string::npos ? name : name.substr(slash + 1);
        if (file.rfind(s->stem + ".so", 0) == 0) {
          s->path = name;
          return 1;
        }
        return 0;
      },
      &search);
  return search.path.empty() ? "not loaded" : search.path;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Octet gpu_info: the driver, the devices, and the CUDA libraries actually loaded"};
  bool as_json = false, require_gpu = false;
  app.add_flag("--json", as_json, "print one JSON object");
  app.add_flag("--require-gpu", require_gpu, "exit 1 when no CUDA device is visible");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json info;
  int driver = 0, runtime = 0, count = 0;
  const cudaError_t driver_status = cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const cudaError_t count_status = cudaGetDeviceCount(&count);
  if (count_status != cudaSuccess) count = 0;
  info["driver_cuda_version"] = driver_status == cudaSuccess && driver > 0 ? cuda_version(driver) : "none";
  info["runtime"] = {{"version", cuda_version(runtime)}, {"compiled", cuda_version(CUDART_VERSION)},
                     {"file", loaded_from("libcudart")}};
  info["device_count"] = count;
  if (count_status != cudaSuccess) info["device_error"] = cudaGetErrorString(count_status);

  nlohmann::json devices = nlohmann::json::array();
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    int pools = 0, clock_khz = 0;
    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, d);
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, d);
    devices.push_back({{"index", d},
                       {"name", p.name},
                       {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
                       {"memory_gib", static_cast<double>(p.totalGlobalMem) / (1 << 30)},
                       {"multiprocessors", p.multiProcessorCount},
                       {"max_sm_clock_mhz", clock_khz / 1000},
                       {"memory_pools", pools != 0}});
  }
  info["devices"] = devices;
  info["cudnn"] = {{"version", cudnn_version(cudnnGetVersion())},
                   {"compiled", cudnn_version(CUDNN_VERSION)},
                   {"built_for_cuda", cuda_version(static_cast<int>(cudnnGetCudartVersion()))},
                   {"file", loaded_from("libcudnn")}};
  info["cublaslt"] = {{"version", cublas_version(cublasLtGetVersion())},
                      {"compiled", cublas_version(CUBLAS_VERSION)},
                      {"built_for_cuda", cuda_version(static_cast<int>(cublasLtGetCudartVersion()))},
                      {"file", loaded_from("libcublasLt")}};
  int nccl = 0;
  ncclGetVersion(&nccl);
  info["nccl"] = {{"version", octet::distributed::nccl_version_string(nccl)},
                  {"compiled", octet::distributed::nccl_version_string(NCCL_VERSION_CODE)},
                  {"file", loaded_from("libnccl")}};
  // Several ranks on one GPU over NCCL: what NcclProcessGroup would decide here.
  const char* multi_rank = std::getenv(octet::distributed::kNcclMultiRankGpuVariable);
  const std::string refusal = octet::distributed::nccl_shared_device_refusal(nccl, multi_rank, "ranks sharing a GPU");
  info["nccl"]["multi_rank_gpu"] = {{"allowed", refusal.empty()},
                                    {"variable", multi_rank ? nlohmann::json(multi_rank) : nlohmann::json(nullptr)},
                                    {"refusal", refusal}};
  info["driver_file"] = loaded_from("libcuda");

  if (as_json) {
    std::printf("%s\n", info.dump().c_str());
  } else {
    std::printf("driver: CUDA %s, libcuda %s\n", info["driver_cuda_version"].get<std::string>().c_str(),
                info["driver_file"].get<std::string>().c_str());
    if (count == 0) {
      std::printf("devices: none%s%s\n", info.contains("device_error") ? ": " : "",
                  info.contains("device_error") ? info["device_error"].get<std::string>().c_str() : "");
    }
    for (const auto& d : devices) {
      std::printf("device %d: %s, sm_%s, %.1f GiB, %d SMs, %d MHz, memory pools %s\n", d["index"].get<int>(),
                  d["name"].get<std::string>().c_str(), d["compute_capability"].get<std::string>().c_str(),
                  d["memory_gib"].get<double>(), d["multiprocessors"].get<int>(), d["max_sm_clock_mhz"].get<int>(),
                  d["memory_pools"].get<bool>() ? "yes" : "no");
    }
    for (const char* lib : {"runtime", "cublaslt", "cudnn", "nccl"}) {
      const auto& l = info[lib];
      std::printf("%-9s %s (compiled against %s) from %s\n", lib, l["version"].get<std::string>().c_str(),
                  l["compiled"].get<std::string>().c_str(), l["file"].get<std::string>().c_str());
    }
    std::printf("ranks sharing a GPU over NCCL: %s\n",
                refusal.empty() ? ("allowed (NCCL " + info["nccl"]["version"].get<std::string>() + ", " +
                                   octet::distributed::kNcclMultiRankGpuVariable + "=" + multi_rank + ")")
                                      .c_str()
                                : ("refused: " + refusal).c_str());
  }
  if (require_gpu && count == 0) {
    std::fprintf(stderr, "gpu_info: no CUDA device is visible (%s); check the driver and CUDA_VISIBLE_DEVICES\n",
                 info.contains("device_error") ? info["device_error"].get<std::string>().c_str() : "none found");
    return 1;
  }
  return 0;
}
