#pragma once
// Checkpoints of a FullyShardedDataParallel model and its optimizer, written by every rank in
// parallel (each its own shard, no gather) and loadable at any world size: loading re-shards.
//
//   save_fsdp_checkpoint("run/step-100", fsdp, &optimizer);    // every rank, at N ranks
//   load_fsdp_checkpoint("run/step-100", fsdp, &optimizer);    // every rank, at M ranks
//   export_consolidated("run/model.safetensors", fsdp);        // one file, timm names
//
// The unit of sharding is a flat parameter (FullyShardedDataParallel::flat_parameters()): a unit's
// parameters concatenated, padded to a multiple of N, of which rank r holds elements
// [r·S, (r+1)·S), S = padded / N, as an fp32 shard; the optimizer holds per-element state of the
// same shape for it. A checkpoint directory holds:
//
//   index.json                   written by rank 0: format version, the world size N, the optimizer's
//                                name and its per-element state names, and per flat parameter f:
//                                unit, key, trainable (frozen flats have no optimizer state), numel,
//                                padded_numel, shard_numel, the optimizer group it
//                                is in (null when the optimizer does not hold it), its step count
//                                (null before the first step), and its parameters in flat order
//                                (name, offset in the flat, shape), so that a reader knows which
//                                element ranges of which shard file hold which parameter. And
//                                "checksums": the size and CRC-32 of every other file in the
//                                directory (core/checksum.h), each taken from memory by the rank that
//                                wrote the file. index.json itself is checked field by field instead.
//   shard-<r>-of-<N>.safetensors rank r's shards: "flat.<f>.param" (f32 [S]) and, once stepped,
//                                "flat.<f>.<state>" for each per-element state (AdamW: exp_avg,
//                                exp_avg_sq; SGD with momentum: momentum_buffer), f32 [S].
//                                Under HYBRID_SHARD, N is the shard group size G, and the first
//                                shard group (ranks 0 … G−1) writes them: the other replicas hold
//                                the same bytes (fsdp_checkpoint_index.h, Layout).
//   optimizer_groups.safetensors written by rank 0: the optimizer's group-level entries
//                                ("param_groups.<g>.lr", ".weight_decay", ".num_params"), the same
//                                on every rank.
//   plus whatever the caller's write_extra hook writes on rank 0 (trainer state, FP8 scales, ...).
//
// Loading checks every file against its checksum as it reads it, before anything is changed: a byte
// altered on disk, two ranks' shard files exchanged, or a shard missing is an error naming the file.
// A checkpoint from before checksums (format version 1) loads unchecked, with a warning.
//
// Loading at M ranks: rank r' needs elements [r'·S', (r'+1)·S') ∩ [0, numel) of each unpadded flat;
// it reads those ranges from the few old shard files that hold them (and no other file), zeroes its
// padding, and rebuilds its optimizer state the same way. Padding never carries information (its
// gradient is zero, so AdamW keeps it at zero), so nothing is lost between world sizes.
//
// Atomic: every rank writes into ".<name>.tmp-<pid of rank 0>" beside `dir`, the ranks agree that
// every write succeeded, and only then rank 0 renames the directory into place (exchanging it with an
// older checkpoint of the same name in one atomic step, which is then removed). A crash mid-save
// leaves the previous checkpoint at `dir` intact and at most a stale temporary directory beside it. Every rank must see the same
// filesystem at `dir` (one node, or a shared filesystem across nodes).
//
// Every function here is a collective over fsdp.process_group(): call it on every rank, in the same
// order. Any rank's failure (an unwritable directory, a damaged
// shard) is reported on every rank as an octet::Error, so no rank is left waiting in a collective.
#include <functional>
#include <string>

#include "core/checksum.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"
#include "optim/optimizer.h"

namespace octet::distributed {

// Called on rank 0 with the temporary directory, before the checkpoint is renamed into place: write
// further files there (trainer.json, fp8.safetensors) so they appear atomically with the shards, and
// record each one's digest (digest_of its bytes, or what nn::save_safetensors returns) in `digests`
// under its file name, for index.json. A file left without a digest fails the save.
using WriteExtraFiles = std::function<void(const std::string& staging_dir, FileDigests& digests)>;

// Called on every rank while the checkpoint is read and checked, before the load changes anything:
// read the files write_extra wrote (files.path(name)), and check each with files.verify.
using ReadExtraFiles = std::function<void(const FileVerifier& files)>;

// Writes `dir` (replacing a checkpoint already there). `optimizer` may be null: weights only. The
// optimizer must have been built over fsdp.parameters() (any grouping): its state for each shard is
// found by tensor identity. Frozen flat parameters are saved too (fsdp.all_shards()), without state.
void save_fsdp_checkpoint(const std::string& dir, FullyShardedDataParallel& fsdp, const optim::Optimizer* optimizer,
                          const WriteExtraFiles& write_extra = {});

struct FsdpCheckpointInfo {
  int saved_world_size = 0;  // N of the run that wrote it
  int flat_parameters = 0;
};

// Loads `dir`, written at any world size, into this rank's shards (and `optimizer`'s state for them,
// unless null). The model must have the same flat parameters (units, keys, parameter names in the
// same order, sizes) and the optimizer the same kind and grouping of shards as at save time; a
// mismatch, or a missing, truncated or altered file, throws naming the file or the first differing
// flat parameter and the fix, before anything is changed.
FsdpCheckpointInfo load_fsdp_checkpoint(const std::string& dir, FullyShardedDataParallel& fsdp,
                                        optim::Optimizer* optimizer, const ReadExtraFiles& read_extra = {});

// Gathers every parameter at full size (FullyShardedDataParallel::full_parameters) and rank 0 writes
// one safetensors file under the model's own dotted names (timm's, for a VisionTransformer), with
// its persistent buffers, in f32: exactly what a single-process model's load_state_dict reads (and
// apps::save_checkpoint's model.safetensors). The write is atomic; every rank returns once it exists.
void export_consolidated(const std::string& path, FullyShardedDataParallel& fsdp);

}  // namespace octet::distributed
