#pragma once
// Several ranks of one NCCL communicator on one GPU: which ranks share a device, and whether the
// NCCL library that was loaded will accept that. NcclProcessGroup decides it before
// ncclCommInitRank, on every rank alike, so that a refusal ends the job with a message that names
// the fix instead of NCCL's ncclInvalidUsage. Pure functions, checked on the host in
// tests/distributed/test_nccl_mapping.cpp; no nccl.h here.
//
// What NCCL does (src/init.cc of each release):
//   - up to 2.29: two ranks on one GPU fail ncclCommInitRank with ncclInvalidUsage, after
//     "Duplicate GPU detected : rank R and rank S both on CUDA device <bus id>";
//   - from 2.30: the same, with "Multiple Ranks are using the same GPU/Partition. Set
//     NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.", unless the environment variable
//     NCCL_MULTI_RANK_GPU_ENABLE holds a non-zero integer (NCCL reads it with strtoll, base 0).
//     NVIDIA calls the feature experimental: its documentation (2.30.7) promises up to 2 ranks per
//     GPU with the default settings; beyond that the ranks' channels may exhaust the GPU and hang
//     NCCL, and it advises lowering NCCL_MAX_CTAS.
// Octet never sets the variable itself: turning on an experimental NCCL feature is the user's call
// (tools/gpu_check.sh sets it for its nccl_ranks stage, and says so).
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace octet::distributed {

// One rank's GPU as every rank can compare it: the host (a hash of its name) and the device's UUID,
// plus the index the rank knows it by (for messages only: CUDA_VISIBLE_DEVICES may renumber it).
struct RankDevice {
  uint64_t host = 0;
  std::array<unsigned char, 16> uuid{};
  int index = 0;
};

// The first NCCL release that lets ranks share a GPU (version codes from 2.9 on: major·10000 +
// minor·100 + patch).
inline constexpr int kNcclMultiRankGpuVersion = 23000;
inline constexpr const char* kNcclMultiRankGpuVariable = "NCCL_MULTI_RANK_GPU_ENABLE";

// "2.30.7" from an NCCL version code.
inline std::string nccl_version_string(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." + std::to_string(code % 100);
}

// The ranks on the same host and GPU as `rank` (itself included), in rank order.
inline std::vector<int> ranks_sharing_device(const std::vector<RankDevice>& devices, int rank) {
  std::vector<int> ranks;
  const RankDevice& mine = devices.at(static_cast<size_t>(rank));
  for (size_t r = 0; r < devices.size(); ++r) {
    if (devices[r].host == mine.host && devices[r].uuid == mine.uuid) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

// The largest set of ranks that share one GPU (the lowest such rank's first when sets tie); a single
// rank when no two ranks share one.
inline std::vector<int> largest_device_sharing(const std::vector<RankDevice>& devices) {
  std::vector<int> largest;
  for (size_t r = 0; r < devices.size(); ++r) {
    std::vector<int> sharing = ranks_sharing_device(devices, static_cast<int>(r));
    if (sharing.size() > largest.size()) largest = std::move(sharing);
  }
  return largest;
}

// "ranks 0-3" for consecutive ranks, "ranks 0, 2, 5" otherwise.
inline std::string describe_ranks(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return "rank " + std::to_string(ranks.front());
  bool consecutive = true;
  for (size_t i = 1; i < ranks.size(); ++i) consecutive = consecutive && ranks[i] == ranks[i - 1] + 1;
  if (consecutive && ranks.size() > 2) {
    return "ranks " + std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  }
  std::string text = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

// Whether NCCL_MULTI_RANK_GPU_ENABLE's value (null when unset) turns the feature on, read the way
// NCCL reads it: an empty or unparsable value is the default, 0.
inline bool multi_rank_gpu_enabled(const char* value) {
  if (value == nullptr || *value == '\0') return false;
  errno = 0;
  const long long parsed = std::strtoll(value, nullptr, 0);
  return errno == 0 && parsed != 0;
}

// "" when NCCL `nccl_version` with NCCL_MULTI_RANK_GPU_ENABLE = `variable` (null: unset) accepts
// several ranks on one GPU; otherwise why not, with the fixes. `who` names the ranks and the GPU.
inline std::string nccl_shared_device_refusal(int nccl_version, const char* variable, const std::string& who) {
  const std::string version = nccl_version_string(nccl_version);
  const std::string mpi = "or --dist-backend mpi, whose group stages CUDA tensors through host memory and lets "
                          "any number of ranks share a GPU";
  if (nccl_version < kNcclMultiRankGpuVersion) {
    return who + ", but the NCCL library loaded here is " + version + ", which refuses several ranks on one GPU "
           "(\"Duplicate GPU detected\"). Use NCCL 2.30 or newer with " + kNcclMultiRankGpuVariable +
           "=1 (the GPU bundle carries one when tools/gpu_bundle.sh is given it: OCTET_BUNDLE_NCCL=FILE), one GPU "
           "per rank (--device auto), " + mpi;
  }
  if (!multi_rank_gpu_enabled(variable)) {
    return who + ", and NCCL " + version + " accepts that only with " + kNcclMultiRankGpuVariable + "=1 (" +
           (variable == nullptr ? std::string("it is unset") : "it is '" + std::string(variable) + "'") +
           "; without it NCCL fails with \"Multiple Ranks are using the same GPU/Partition\"). Set it for every "
           "rank (export " + kNcclMultiRankGpuVariable + "=1, or mpirun -x " + kNcclMultiRankGpuVariable +
           "=1): NVIDIA calls the feature experimental and supports up to 2 ranks per GPU with its default "
           "settings (more may need NCCL_MAX_CTAS lowered); " + mpi;
  }
  return "";
}

}  // namespace octet::distributed
