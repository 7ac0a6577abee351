#pragma once
// Training checkpoints: everything needed to continue a run so that its losses are bitwise equal to
// a run that never stopped.
//
//   <root>/step-00000100/model.safetensors      weights under timm's names (loads in timm as is)
//                        optimizer.safetensors  optimizer state (AdamW moments, SGD momentum, step)
//                        trainer.json           step, data-loader position, RNG state, run flags, and
//                                               the size and CRC-32 of each file above (core/checksum.h)
//                        fp8.safetensors        FP8 scales and amax histories (nn::fp8_state_dict), only
//                                               when a Linear has run in FP8
//   <root>/latest                               the name of the newest complete checkpoint
//
// A checkpoint is written into a hidden temporary directory and renamed into place, and `latest` is
// replaced atomically after it, so a crash mid-write never leaves a half checkpoint behind a name.
// Loading checks every file against its recorded checksum before using it, so a byte changed on disk
// is an error naming the file rather than weights that train on; trainer.json, which holds the
// checksums, is checked field by field instead. A checkpoint written before checksums (format version
// 1) loads unchecked, with a warning.
#include <cstdint>
#include <map>
#include <string>

#include "data/loader.h"
#include "distributed/fsdp.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace octet::apps {

struct TrainerState {
  int64_t step = 0;                   // optimizer steps completed
  data::DataLoader::State loader{};   // position of the next training batch
  uint64_t rng_seed = 0;              // default_generator(): dropout and drop-path masks
  uint64_t rng_offset = 0;
  std::map<std::string, std::string> run;  // the flags that shape the run (model, batch size, lr, ...)
};

// Writes <root>/step-<step>/ and points <root>/latest at it. Returns the checkpoint's directory.
// `model` is not const: its FP8 states are found through named_modules().
std::string save_checkpoint(const std::string& root, nn::Module& model, const optim::Optimizer& optimizer,
                            const TrainerState& state);

// `path` is a checkpoint directory or a root holding `latest`. Loads the weights, the optimizer state
// and the FP8 state (when saved) in place and returns the trainer state; a missing, corrupt (its
// checksum differs) or mismatched file is an error that names it, thrown before anything is loaded.
// A missing fp8.safetensors only warns: the FP8 scaling starts afresh, as for a checkpoint without it.
TrainerState load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer);

// Under FSDP (a collective: every rank calls it). <root>/step-<step>/ holds every rank's shards and
// index.json (distributed/fsdp_checkpoint.h) instead of model.safetensors and optimizer.safetensors,
// plus trainer.json and fp8.safetensors from rank 0, whose checksums index.json records with the
// shards'; `latest` is updated after. Loading works at any world size: the shards are re-sharded.
std::string save_sharded_checkpoint(const std::string& root, distributed::FullyShardedDataParallel& fsdp,
                                    const optim::Optimizer& optimizer, nn::Module& model, const TrainerState& state);
TrainerState load_sharded_checkpoint(const std::string& path, distributed::FullyShardedDataParallel& fsdp,
                                     optim::Optimizer& optimizer, nn::Module& model);

// The checkpoint directory `path` refers to (see load_checkpoint).
std::string resolve_checkpoint(const std::string& path);

// The flags the checkpoint at `path` (as load_checkpoint takes it) was trained with: trainer.json's
// "run", read before anything is loaded so that a run with other flags can be told which (empty when
// trainer.json records none). Its checksum is checked when the checkpoint loads.
std::map<std::string, std::string> checkpoint_run_flags(const std::string& path);

}  // namespace octet::apps
