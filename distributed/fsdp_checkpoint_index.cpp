// The shared parts of FSDP checkpoints: names, the optimizer's slots, directories, and the index
// read back and checked (distributed/fsdp_checkpoint_index.h).
#include "distributed/fsdp_checkpoint_index.h"

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checksum_json.h"

namespace octet::distributed::checkpoint {

using nlohmann::json;

std::string shard_file_name(int rank, int world) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

std::string error_text(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

Layout layout_of(const FullyShardedDataParallel& fsdp) {
  const auto flats = fsdp.flat_parameters();
  Layout layout;
  if (!flats.empty()) layout.world = static_cast<int>(flats.front().padded_numel / flats.front().shard_numel);
  layout.rank = layout.world == 1 ? 0 : fsdp.shard_group()->rank();
  const ProcessGroup* replicate = fsdp.replicate_group().get();
  layout.writes = layout.world == 1 ? fsdp.process_group()->rank() == 0 : replicate == nullptr || replicate->rank() == 0;
  return layout;
}

OptimizerSlot find_in_optimizer(const optim::Optimizer& optimizer, const Tensor& shard) {
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      if (groups[g].params[i].is_same(shard)) return {static_cast<int>(g), static_cast<int>(i)};
    }
  }
  return {};
}

std::string state_prefix(const OptimizerSlot& slot) {
  return "state." + std::to_string(slot.group) + "." + std::to_string(slot.index) + ".";
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  OCTET_CHECK(fd >= 0, "cannot open directory ", dir.string(), " to flush it to disk");
  const int rc = ::fsync(fd);
  ::close(fd);
  OCTET_CHECK(rc == 0, "cannot flush directory ", dir.string(), " to disk");
}

fs::path normalized(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

fs::path sibling(const fs::path& dir, const char* tag, int64_t job) {
  std::string name = ".";
  name += dir.filename().string();
  name += tag;
  name += std::to_string(job);
  return dir.parent_path() / name;
}

namespace {

// A field of index.json, naming the file and the field when it is absent or ill-typed.
template <class T>
T field(const json& j, const char* name, const std::string& file, const std::string& where = "") {
  OCTET_CHECK(j.is_object() && j.contains(name), "FSDP checkpoint ", file, where, " has no \"", name,
              "\": the file is damaged or not an FSDP checkpoint index; load another checkpoint");
  try {
    return j.at(name).get<T>();
  } catch (const json::exception&) {
    OCTET_FAIL("FSDP checkpoint ", file, where, ": \"", name, "\" is ", j.at(name).dump(),
               ", not the expected type; the file is damaged, load another checkpoint");
  }
}

}  // namespace

SavedIndex read_index(const fs::path& dir) {
  const std::string file = (dir / kIndexFile).string();
  OCTET_CHECK(fs::exists(dir), "no FSDP checkpoint at ", dir.string(), ": the directory does not exist; pass a "
              "directory written by save_fsdp_checkpoint");
  OCTET_CHECK(fs::exists(file), "no FSDP checkpoint at ", dir.string(), ": it has no ", kIndexFile, " (its save did "
              "not finish, or it is not an FSDP checkpoint); pass a directory written by save_fsdp_checkpoint");
  json j;
  try {
    j = json::parse(read_file(file));
  } catch (const json::parse_error& e) {
    OCTET_FAIL("FSDP checkpoint ", file, " is not valid JSON (", e.what(), "); it is damaged, load another checkpoint");
  }
  OCTET_CHECK(field<std::string>(j, "format", file) == kFormatName, "FSDP checkpoint ", file, " is not an ",
              kFormatName, " index; pass a directory written by save_fsdp_checkpoint");
  const int version = field<int>(j, "format_version", file);
  OCTET_CHECK(version == kFormatVersion || version == kUncheckedFormatVersion, "FSDP checkpoint ", file,
              " has format version ", version, "; this build reads versions ", kUncheckedFormatVersion, " and ",
              kFormatVersion);
  SavedIndex index;
  if (version >= kFormatVersion) index.checksums = digests_from_json(field<json>(j, "checksums", file), file);
  index.world = field<int>(j, "world_size", file);
  index.shards = field<std::vector<std::string>>(j, "shards", file);
  OCTET_CHECK(index.world >= 1 && static_cast<int>(index.shards.size()) == index.world, "FSDP checkpoint ", file,
              " lists ", index.shards.size(), " shard files for world size ", index.world, "; the file is damaged");
  if (j.contains("optimizer") && !j["optimizer"].is_null()) {
    index.optimizer = field<std::string>(j["optimizer"], "name", file, " optimizer");
  }
  const json flats = field<json>(j, "flat_parameters", file);
  OCTET_CHECK(flats.is_array(), "FSDP checkpoint ", file, ": flat_parameters is not a list; the file is damaged");
  for (size_t f = 0; f < flats.size(); ++f) {
    const json& jf = flats[f];
    const std::string where = " flat parameter " + std::to_string(f);
    SavedFlat flat;
    flat.unit = field<std::string>(jf, "unit", file, where);
    flat.key = field<int>(jf, "key", file, where);
    flat.trainable = field<bool>(jf, "trainable", file, where);
    flat.numel = field<int64_t>(jf, "numel", file, where);
    flat.padded_numel = field<int64_t>(jf, "padded_numel", file, where);
    flat.shard_numel = field<int64_t>(jf, "shard_numel", file, where);
    flat.optimizer_group = jf.contains("optimizer_group") && !jf["optimizer_group"].is_null()
                               ? field<int>(jf, "optimizer_group", file, where) : -1;
    flat.step = jf.contains("step") && !jf["step"].is_null() ? field<int64_t>(jf, "step", file, where) : 0;
    flat.state = field<std::vector<std::string>>(jf, "state", file, where);
    OCTET_CHECK(flat.numel >= 0 && flat.shard_numel * index.world == flat.padded_numel &&
                    flat.numel <= flat.padded_numel && flat.step >= 0,
                "FSDP checkpoint ", file, where, " has numel ", flat.numel, ", padded_numel ", flat.padded_numel,
                " and shard_numel ", flat.shard_numel, " at world size ", index.world,
                ", which do not fit together; the file is damaged");
    for (const json& jp : field<json>(jf, "parameters", file, where)) {
      flat.parameters.push_back({field<std::string>(jp, "name", file, where), field<int64_t>(jp, "offset", file, where),
                                 field<std::vector<int64_t>>(jp, "shape", file, where)});
    }
    index.flats.push_back(std::move(flat));
  }
  return index;
}

std::string names_str(const std::vector<std::string>& names) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + "]";
}

void check_same_flats(const SavedIndex& index, const std::vector<FullyShardedDataParallel::FlatParameterInfo>& flats,
                      nn::Module& module, const std::string& file) {
  const std::string fix = "; build the model with the same configuration, wrap_policy, flat_param_key and "
                          "fp8_all_gather (which gives the FP8 Linears' weights flat parameters of their own) as the "
                          "run that saved the checkpoint";
  OCTET_CHECK(index.flats.size() == flats.size(), "FSDP checkpoint ", file, " holds ", index.flats.size(),
              " flat parameters but this model has ", flats.size(), fix);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, p] : module.named_parameters()) shapes[name] = p.shape();
  for (size_t f = 0; f < flats.size(); ++f) {
    const SavedFlat& saved = index.flats[f];
    const auto& mine = flats[f];
    const std::string which = "flat parameter " + std::to_string(f) + " (unit '" + mine.unit + "', key " +
                              std::to_string(mine.key) + ")";
    OCTET_CHECK(saved.unit == mine.unit && saved.key == mine.key && saved.trainable == mine.trainable,
                "FSDP checkpoint ", file, ": flat parameter ", f, " is of unit '", saved.unit, "', key ", saved.key,
                saved.trainable ? ", trainable" : ", frozen", " but this model's ", which,
                mine.trainable ? " is trainable" : " is frozen", fix);
    std::vector<std::string> saved_names;
    for (const SavedParameter& p : saved.parameters) saved_names.push_back(p.name);
    OCTET_CHECK(saved_names == mine.parameters, "FSDP checkpoint ", file, ": ", which, " holds ",
                names_str(saved_names), " but this model's holds ", names_str(mine.parameters), fix);
    for (size_t k = 0; k < saved.parameters.size(); ++k) {
      const SavedParameter& p = saved.parameters[k];
      OCTET_CHECK(p.offset == mine.offsets[k], "FSDP checkpoint ", file, ": ", p.name, " starts at element ", p.offset,
                  " of ", which, " but at ", mine.offsets[k], " in this model's", fix);
      OCTET_CHECK(p.shape == shapes.at(p.name), "FSDP checkpoint ", file, ": ", p.name, " in ", which, " has shape ",
                  Shape(p.shape), " but this model's is ", Shape(shapes.at(p.name)), fix);
    }
    OCTET_CHECK(saved.numel == mine.numel, "FSDP checkpoint ", file, ": ", which, " has ", saved.numel,
                " elements but this model's has ", mine.numel, fix);
  }
}

}  // namespace octet::distributed::checkpoint
