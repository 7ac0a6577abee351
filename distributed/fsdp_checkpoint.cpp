#include "distributed/fsdp_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>  // renameat2

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/checksum_json.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "distributed/fsdp_checkpoint_index.h"
#include "nn/safetensors.h"

namespace octet::distributed {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace checkpoint;

// ---- save -----------------------------------------------------------------------------------------

void save_fsdp_checkpoint(const std::string& dir, FullyShardedDataParallel& fsdp, const optim::Optimizer* optimizer,
                          const WriteExtraFiles& write_extra) {
  const std::string op = "save_fsdp_checkpoint(" + dir + ")";
  OCTET_CHECK(!normalized(dir).empty(), op, ": the directory name is empty; pass the checkpoint's directory");
  ProcessGroup& group = *fsdp.process_group();
  const auto flats = fsdp.flat_parameters();
  const std::vector<Tensor> shards = fsdp.all_shards();
  const Layout layout = layout_of(fsdp);
  const int num_flats = static_cast<int>(flats.size());

  // This rank's optimizer state per shard. The state dict's tensors share the optimizer's storage,
  // which nothing changes before they are written below.
  const std::map<std::string, Tensor> optimizer_state = optimizer ? optimizer->state_dict() : std::map<std::string, Tensor>{};
  std::vector<OptimizerSlot> slots(num_flats);
  std::vector<int64_t> steps(num_flats, 0);
  std::vector<std::map<std::string, Tensor>> buffers(num_flats);
  for (int f = 0; f < num_flats && optimizer; ++f) {
    slots[f] = find_in_optimizer(*optimizer, shards[f]);
    if (slots[f].group < 0) continue;
    const std::string prefix = state_prefix(slots[f]);
    for (auto it = optimizer_state.lower_bound(prefix); it != optimizer_state.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string name = it->first.substr(prefix.size());
      if (name == "step") {
        steps[f] = static_cast<int64_t>(it->second.item());
        continue;
      }
      // Per-element state is what re-sharding knows how to split; SGD and AdamW hold nothing else.
      OCTET_CHECK(it->second.shape() == shards[f].shape() && it->second.dtype() == DType::f32, op, ": ",
                  optimizer->name(), " state ", it->first, " is ", it->second.describe(), ", not one f32 value per ",
                  "element of its shard ", shards[f].describe(), "; only per-element optimizer state can be re-sharded");
      buffers[f][name] = it->second;
    }
  }

  // Rank 0 describes the state of every shard in index.json, so the ranks must agree on it: every
  // rank steps every shard (FSDP gives each one a gradient) in the same optimizer group. Max of
  // (v, -v) over the ranks equals (v, -v) everywhere only if every rank holds the same v.
  {
    std::vector<double> mine;
    for (int f = 0; f < num_flats; ++f) mine.push_back(static_cast<double>(steps[f])), mine.push_back(slots[f].group);
    std::vector<double> both = mine;
    for (double v : mine) both.push_back(-v);
    const Tensor reduced = from_vector<double>(both, {static_cast<int64_t>(both.size())}, DType::f64, group.device());
    group.all_reduce(reduced, ReduceOp::Max)->wait();
    const std::vector<double> r = reduced.to_vector<double>();
    for (size_t k = 0; k < mine.size(); ++k) {
      const int f = static_cast<int>(k / 2);
      OCTET_CHECK(r[k] == -r[k + mine.size()], op, ": the ranks disagree on the ", k % 2 ? "optimizer group" : "step count",
                  " of flat parameter ", f, " (unit '", flats[f].unit, "'); build the optimizer the same way on every ",
                  "rank over fsdp.parameters(), and step it on every rank");
    }
  }

  // Every rank writes into the same temporary directory, named after rank 0's process so two jobs
  // saving to one place never share it.
  const fs::path final_dir = normalized(dir);
  const Tensor pid = from_vector<double>({static_cast<double>(::getpid())}, {1}, DType::f64, group.device());
  group.broadcast(pid, 0)->wait();
  const int64_t job = static_cast<int64_t>(pid.item());
  const fs::path tmp_dir = sibling(final_dir, ".tmp-", job);
  on_every_rank(group, op, [&] {
    if (group.rank() != 0) return;
    std::error_code ec;
    if (!final_dir.parent_path().empty()) fs::create_directories(final_dir.parent_path(), ec);
    OCTET_CHECK(!ec, op, ": cannot create ", final_dir.parent_path().string(), ": ", ec.message(),
                "; pass a writable directory");
    fs::remove_all(tmp_dir, ec);  // a stale one from a job that died with this pid
    OCTET_CHECK(fs::create_directory(tmp_dir, ec) && !ec, op, ": cannot create ", tmp_dir.string(), ": ",
                ec.message(), "; pass a writable directory");
  });

  // Each rank digests the shard it writes; rank 0 gathers the digests into index.json.
  FileDigest shard_digest;
  const auto write_shard = [&] {
    if (layout.writes) {  // one copy of each shard (checkpoint::Layout says which rank writes it)
      nn::StateDict tensors;
      for (int f = 0; f < num_flats; ++f) {
        const std::string prefix = "flat." + std::to_string(f) + ".";
        tensors[prefix + "param"] = shards[f].detach();
        for (const auto& [name, t] : buffers[f]) tensors[prefix + name] = t;
      }
      shard_digest = nn::save_safetensors((tmp_dir / shard_file_name(layout.rank, layout.world)).string(), tensors,
                                          {{"format", kFormatName}, {"rank", std::to_string(layout.rank)},
                                           {"world_size", std::to_string(layout.world)}});
    }
  };
  // Rank 0 learns every shard's digest: each writer fills its own slot (bytes, CRC) and the rest are zero,
  // so a sum is a gather. Both fit a double exactly (sizes below 2^53).
  FileDigests digests;
  const auto gather_shard_digests = [&] {
    std::vector<double> slots(2 * static_cast<size_t>(layout.world), 0.0);
    if (layout.writes) {
      slots[2 * layout.rank] = static_cast<double>(shard_digest.bytes);
      slots[2 * layout.rank + 1] = static_cast<double>(shard_digest.crc32);
    }
    const Tensor all = from_vector<double>(slots, {static_cast<int64_t>(slots.size())}, DType::f64, group.device());
    group.all_reduce(all, ReduceOp::Sum)->wait();
    const std::vector<double> summed = all.to_vector<double>();
    for (int k = 0; k < layout.world; ++k) {
      digests[shard_file_name(k, layout.world)] = {static_cast<uint64_t>(summed[2 * k]),
                                                   static_cast<uint32_t>(summed[2 * k + 1])};
    }
  };
  const auto write_metadata = [&] {
    if (group.rank() != 0) return;
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [name, p] : fsdp.module().named_parameters()) shapes[name] = p.shape();
    json index = {{"format", kFormatName}, {"format_version", kFormatVersion}, {"world_size", layout.world}};
    index["optimizer"] = optimizer ? json{{"name", optimizer->name()}, {"groups_file", kGroupsFile}} : json(nullptr);
    index["shards"] = json::array();
    for (int k = 0; k < layout.world; ++k) index["shards"].push_back(shard_file_name(k, layout.world));
    index["flat_parameters"] = json::array();
    for (int f = 0; f < num_flats; ++f) {
      const auto& info = flats[f];
      json flat = {{"unit", info.unit},
                   {"key", info.key},
                   {"trainable", info.trainable},
                   {"numel", info.numel},
                   {"padded_numel", info.padded_numel},
                   {"shard_numel", info.shard_numel},
                   {"optimizer_group", slots[f].group >= 0 ? json(slots[f].group) : json(nullptr)},
                   {"step", steps[f] > 0 ? json(steps[f]) : json(nullptr)},
                   {"state", json::array()},
                   {"parameters", json::array()}};
      for (const auto& [name, t] : buffers[f]) flat["state"].push_back(name);
      for (size_t k = 0; k < info.parameters.size(); ++k) {
        flat["parameters"].push_back(
            {{"name", info.parameters[k]}, {"offset", info.offsets[k]}, {"shape", shapes.at(info.parameters[k])}});
      }
      index["flat_parameters"].push_back(std::move(flat));
    }
    if (optimizer) {
      nn::StateDict group_entries;
      for (const auto& [key, t] : optimizer_state) {
        if (key.rfind("param_groups.", 0) == 0) group_entries[key] = t;
      }
      digests[kGroupsFile] =
          nn::save_safetensors((tmp_dir / kGroupsFile).string(), group_entries, {{"format", kFormatName}});
    }
    if (write_extra) write_extra(tmp_dir.string(), digests);
    // A file without a digest would load unchecked.
    for (const auto& entry : fs::directory_iterator(tmp_dir)) {
      const std::string name = entry.path().filename().string();
      OCTET_CHECK(digests.count(name), op, ": ", name, " was written into the checkpoint without a checksum; the ",
                  "write_extra hook must record the digest of every file it writes");
    }
    index["checksums"] = digests_to_json(digests);
    write_file_atomic((tmp_dir / kIndexFile).string(), index.dump(2) + "\n");
  };
  try {
    on_every_rank(group, op, write_shard);
    gather_shard_digests();
    on_every_rank(group, op, write_metadata);
  } catch (...) {
    if (group.rank() == 0) {
      std::error_code ignored;
      fs::remove_all(tmp_dir, ignored);
    }
    throw;
  }

  // Publish. rename() will not replace a non-empty directory, so an older checkpoint of the same name
  // is swapped out in one atomic exchange (renameat2 RENAME_EXCHANGE, which Linux's local filesystems
  // support) and removed after; elsewhere it is moved aside first, and a crash between the two
  // renames leaves it at .<name>.old-<job>.
  on_every_rank(group, op, [&] {
    if (group.rank() != 0) return;
    const fs::path parent = final_dir.parent_path().empty() ? fs::path(".") : final_dir.parent_path();
    std::error_code ec;
    if (fs::exists(final_dir)) {
      if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
        sync_directory(parent);
        fs::remove_all(tmp_dir, ec);  // now the old checkpoint
        return;
      }
      const fs::path old_dir = sibling(final_dir, ".old-", job);
      fs::remove_all(old_dir, ec);
      fs::rename(final_dir, old_dir, ec);
      OCTET_CHECK(!ec, op, ": cannot move the old checkpoint at ", final_dir.string(), " aside: ", ec.message());
      fs::rename(tmp_dir, final_dir, ec);
      OCTET_CHECK(!ec, op, ": cannot rename ", tmp_dir.string(), " to ", final_dir.string(), ": ", ec.message(),
                  "; the previous checkpoint is at ", old_dir.string());
      sync_directory(parent);
      fs::remove_all(old_dir, ec);
      return;
    }
    fs::rename(tmp_dir, final_dir, ec);
    OCTET_CHECK(!ec, op, ": cannot rename ", tmp_dir.string(), " to ", final_dir.string(), ": ", ec.message());
    sync_directory(parent);
  });
}

// ---- load -----------------------------------------------------------------------------------------

namespace {

// A piece of a new shard that one old shard file holds: `length` elements from `source` in the old
// shard to `target` in the new one.
struct Piece {
  int flat = 0;
  int64_t source = 0, target = 0, length = 0;
};

}  // namespace

FsdpCheckpointInfo load_fsdp_checkpoint(const std::string& dir, FullyShardedDataParallel& fsdp,
                                        optim::Optimizer* optimizer, const ReadExtraFiles& read_extra) {
  const std::string op = "load_fsdp_checkpoint(" + dir + ")";
  ProcessGroup& group = *fsdp.process_group();
  const fs::path path = normalized(dir);
  const auto flats = fsdp.flat_parameters();
  const std::vector<Tensor> shards = fsdp.all_shards();
  const Layout layout = layout_of(fsdp);
  const int num_flats = static_cast<int>(flats.size());

  // Everything is read and checked on every rank before anything changes, so a damaged file on one
  // rank leaves every rank's model and optimizer as they were.
  SavedIndex index;
  std::vector<Tensor> params(num_flats);
  std::vector<std::map<std::string, Tensor>> states(num_flats);
  std::vector<OptimizerSlot> slots(num_flats);
  std::map<std::string, Tensor> optimizer_state;
  on_every_rank(group, op, [&] {
    index = read_index(path);
    const std::string index_file = (path / kIndexFile).string();
    check_same_flats(index, flats, fsdp.module(), index_file);
    const fs::path parent = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    const FileVerifier files(path.string(), kIndexFile, index.checksums,
                             "load an older checkpoint (beside it in " + parent.string() + ")");
    if (optimizer) {
      OCTET_CHECK(!index.optimizer.empty(), op, ": the checkpoint was saved without optimizer state; pass a null "
                  "optimizer to load the weights alone");
      OCTET_CHECK(index.optimizer == optimizer->name(), op, ": the checkpoint holds ", index.optimizer,
                  " state but the optimizer is ", optimizer->name(), "; build the optimizer the run used");
      const std::string groups_file = (path / kGroupsFile).string();
      files.require_present(kGroupsFile);
      nn::SafetensorsFile groups;
      try {
        groups = nn::load_safetensors(groups_file);
      } catch (const Error& e) {
        OCTET_FAIL("FSDP checkpoint ", path.string(), " is damaged: ", groups_file, " cannot be read (", e.what(),
                   "); load another checkpoint");
      }
      files.verify(kGroupsFile, groups.digest);
      optimizer_state = std::move(groups.tensors);
    }
    if (read_extra) read_extra(files);

    // What this rank needs: elements [r'·S', (r'+1)·S') ∩ [0, numel) of each flat, which old rank k
    // holds at [k·S, (k+1)·S).
    std::map<int, std::vector<Piece>> pieces;  // by old rank
    for (int f = 0; f < num_flats; ++f) {
      const SavedFlat& saved = index.flats[f];
      const int64_t begin = layout.rank * flats[f].shard_numel;
      const int64_t end = std::min(begin + flats[f].shard_numel, flats[f].numel);
      for (int64_t at = begin; at < end;) {
        const int64_t old_rank = at / saved.shard_numel;
        const int64_t stop = std::min(end, (old_rank + 1) * saved.shard_numel);
        pieces[static_cast<int>(old_rank)].push_back({f, at - old_rank * saved.shard_numel, at - begin, stop - at});
        at = stop;
      }
      params[f] = zeros({flats[f].shard_numel});  // the padding stays zero
      if (!optimizer) continue;
      slots[f] = find_in_optimizer(*optimizer, shards[f]);
      OCTET_CHECK(slots[f].group == saved.optimizer_group, op, ": flat parameter ", f, " (unit '", flats[f].unit,
                  "') was in optimizer group ", saved.optimizer_group, " when saved but is in group ", slots[f].group,
                  " of this optimizer (-1: not held); build the optimizer's groups over fsdp.parameters() as the run did");
      if (saved.step > 0) {
        for (const std::string& name : saved.state) states[f][name] = zeros({flats[f].shard_numel});
      }
    }

    for (const auto& [old_rank, list] : pieces) {
      const std::string file = (path / index.shards[old_rank]).string();
      const std::string damaged = "FSDP checkpoint " + path.string() + " is damaged: shard file " + file + " (rank " +
                                  std::to_string(old_rank) + " of " + std::to_string(index.world) + ")";
      OCTET_CHECK(fs::exists(file), damaged, " is missing; load another checkpoint");
      nn::SafetensorsFile shard_file;
      try {
        shard_file = nn::load_safetensors(file);
      } catch (const Error& e) {
        OCTET_FAIL(damaged, " cannot be read (", e.what(), "); it was truncated or altered, load another checkpoint");
      }
      files.verify(index.shards[old_rank], shard_file.digest);
      for (const Piece& piece : list) {
        const SavedFlat& saved = index.flats[piece.flat];
        const std::string prefix = "flat." + std::to_string(piece.flat) + ".";
        const auto copy_piece = [&](const std::string& name, const Tensor& target) {
          const auto it = shard_file.tensors.find(prefix + name);
          OCTET_CHECK(it != shard_file.tensors.end(), damaged, " has no ", prefix, name, "; load another checkpoint");
          OCTET_CHECK(it->second.dtype() == DType::f32 && it->second.shape() == Shape({saved.shard_numel}), damaged,
                      ": ", prefix, name, " is ", it->second.describe(), ", not f32 [", saved.shard_numel,
                      "]; load another checkpoint");
          target.narrow(piece.target, piece.length).copy_(it->second.narrow(piece.source, piece.length));
        };
        copy_piece("param", params[piece.flat]);
        for (const auto& [name, t] : states[piece.flat]) copy_piece(name, t);
      }
    }

    for (int f = 0; optimizer && f < num_flats; ++f) {
      if (slots[f].group < 0 || index.flats[f].step == 0) continue;
      const std::string prefix = state_prefix(slots[f]);
      optimizer_state[prefix + "step"] = full(Shape{}, static_cast<double>(index.flats[f].step), DType::i64);
      for (const auto& [name, t] : states[f]) optimizer_state[prefix + name] = t;
    }
  });

  // The optimizer's checks depend only on what every rank shares (the index, the groups file and the
  // optimizer's layout), so it fails on every rank or on none. It changes nothing when it fails, and
  // runs before the weights are copied, so a failure leaves everything as it was.
  if (optimizer) {
    try {
      optimizer->load_state_dict(optimizer_state);
    } catch (const Error& e) {
      OCTET_FAIL(op, ": the optimizer state does not fit this optimizer (was it saved with other settings?): ",
                 e.what());
    }
  }
  NoGradGuard no_grad;
  for (int f = 0; f < num_flats; ++f) {
    shards[f].detach().copy_(params[f]);
    Tensor(shards[f]).set_grad(Tensor());  // a gradient from before the load belongs to other weights
  }
  return {index.world, num_flats};
}

// ---- consolidated export --------------------------------------------------------------------------

void export_consolidated(const std::string& path, FullyShardedDataParallel& fsdp) {
  const std::string op = "export_consolidated(" + path + ")";
  ProcessGroup& group = *fsdp.process_group();
  const auto parameters = fsdp.full_parameters();  // a collective: every rank gathers
  on_every_rank(group, op, [&] {
    if (group.rank() != 0) return;
    nn::StateDict tensors(parameters.begin(), parameters.end());
    // The rest of the state dict is the persistent buffers, replicated on every rank, not sharded:
    // rank 0's are the model's. The module's parameters are views of released storage here, so
    // only the buffers are taken from it.
    for (const auto& [name, t] : fsdp.module().state_dict()) tensors.emplace(name, t);
    const fs::path parent = fs::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    OCTET_CHECK(!ec, op, ": cannot create ", parent.string(), ": ", ec.message(), "; pass a writable path");
    nn::save_safetensors(path, tensors, {{"format", "pt"}});
  });
}

}  // namespace octet::distributed
