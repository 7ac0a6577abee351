#pragma once
// What saving and loading an FSDP checkpoint share (internal to distributed/fsdp_checkpoint*.cpp;
// the format is described in distributed/fsdp_checkpoint.h): the file names, every rank agreeing on
// an outcome, where the optimizer keeps a shard, the directory steps of an atomic save, and the
// index as read back and checked against a model.
#include <cstdint>
#include <exception>
#include <optional>
#include <filesystem>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/error.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"
#include "optim/optimizer.h"

namespace octet::distributed::checkpoint {

namespace fs = std::filesystem;

// Version 2 adds "checksums"; version 1 checkpoints load unchecked, with a warning.
inline constexpr int kFormatVersion = 2;
inline constexpr int kUncheckedFormatVersion = 1;
inline constexpr const char* kFormatName = "octet-fsdp-checkpoint";
inline constexpr const char* kIndexFile = "index.json";
inline constexpr const char* kGroupsFile = "optimizer_groups.safetensors";

std::string shard_file_name(int rank, int world);
std::string error_text(const std::exception_ptr& error);

// Runs `body` on every rank, then makes every rank agree on its outcome: when any rank failed, every
// rank throws: a failed rank its own error, the others the lowest failed rank's message. A rank that
// threw alone would leave the others waiting in the next collective until the group's timeout ended
// the job; a rank that only said "another rank failed" would send the user hunting through logs.
// Costs one all_reduce when all went well, and two broadcasts of the message when not.
template <class Body>
void on_every_rank(ProcessGroup& group, const std::string& op, Body&& body) {
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  const Device device = group.device();
  // Max of -rank finds the lowest failing rank; -size means none failed.
  const Tensor failed = from_vector<double>({error ? -static_cast<double>(group.rank()) : -group.size()}, {1},
                                            DType::f64, device);
  group.all_reduce(failed, ReduceOp::Max)->wait();
  const int failing = -static_cast<int>(failed.item());
  if (failing == group.size()) return;
  std::string message = failing == group.rank() ? error_text(error) : std::string();
  const Tensor length = from_vector<double>({static_cast<double>(message.size())}, {1}, DType::f64, device);
  group.broadcast(length, failing)->wait();
  message.resize(static_cast<size_t>(length.item()));
  const Tensor bytes = from_vector<uint8_t>(std::vector<uint8_t>(message.begin(), message.end()),
                                            {static_cast<int64_t>(message.size())}, DType::u8, device);
  if (!message.empty()) group.broadcast(bytes, failing)->wait();
  if (error) std::rethrow_exception(error);
  const std::vector<uint8_t> received = bytes.to_vector<uint8_t>();
  OCTET_FAIL(op, " failed on rank ", failing, ": ", std::string(received.begin(), received.end()));
}

// How the flat parameters are laid out over the ranks: `world` shards, of which this rank holds
// shard `rank`. FULL_SHARD and SHARD_GRAD_OP: one per rank of the group. HYBRID_SHARD: one per rank
// of a shard group (G), each held by every replica. NO_SHARD keeps a full replica on every rank,
// which is one shard of a world of one, held by "rank 0" everywhere.
// `writes`: whether this rank writes its shard's file. One copy of each shard is written, by the
// lowest rank that holds it: under NO_SHARD rank 0, under HYBRID_SHARD the first shard group
// (ranks 0 … G−1). The replicas hold the same bytes (the replicate all-reduce gives each the same
// average, and the optimizer then steps them alike), so more copies would only multiply the writes,
// and would race, writing one file name from several ranks into a shared directory. The checkpoint
// is then one of `world` shards, which every layout loads.
struct Layout {
  int world = 1, rank = 0;
  bool writes = true;
};

Layout layout_of(const FullyShardedDataParallel& fsdp);

// Where the optimizer keeps a shard: its group and index, found by tensor identity (the optimizer
// may group the shards any way it likes).
struct OptimizerSlot {
  int group = -1, index = -1;  // -1: the optimizer does not hold this shard
};

OptimizerSlot find_in_optimizer(const optim::Optimizer& optimizer, const Tensor& shard);
std::string state_prefix(const OptimizerSlot& slot);  // "state.<group>.<index>."

// Makes a directory rename durable: the rename is an entry in the parent, which must reach the disk.
void sync_directory(const fs::path& dir);
fs::path normalized(const std::string& dir);  // "run/step-10/" names "run/step-10"
// "<parent>/.<name><tag><job>": a hidden directory beside `dir`, on the same filesystem so that
// renaming it into place is atomic.
fs::path sibling(const fs::path& dir, const char* tag, int64_t job);

// index.json as read back.
struct SavedParameter {
  std::string name;
  int64_t offset = 0;
  std::vector<int64_t> shape;
};

struct SavedFlat {
  std::string unit;
  int key = 0;
  bool trainable = true;
  int64_t numel = 0, padded_numel = 0, shard_numel = 0;
  int optimizer_group = -1;
  int64_t step = 0;
  std::vector<std::string> state;
  std::vector<SavedParameter> parameters;
};

struct SavedIndex {
  int world = 0;
  std::string optimizer;  // "" when saved without one
  std::vector<std::string> shards;
  std::vector<SavedFlat> flats;
  std::optional<FileDigests> checksums;  // of every other file; none in a version 1 checkpoint
};

// Reads and checks `dir`/index.json, naming the file and the field for anything absent or damaged.
SavedIndex read_index(const fs::path& dir);
// The checkpoint must hold the same flat parameters as the model: same units, keys, parameters in
// the same order with the same shapes. Sizes alone would let a differently built model load
// another's bytes into the wrong places.
void check_same_flats(const SavedIndex& index, const std::vector<FullyShardedDataParallel::FlatParameterInfo>& flats,
                      nn::Module& module, const std::string& file);

}  // namespace octet::distributed::checkpoint
