#include "apps/checkpoint.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "distributed/fsdp_checkpoint.h"
#include "nn/fp8.h"
#include "nn/safetensors.h"

namespace octet::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

json to_json(const TrainerState& s) {
  return {{"format_version", kFormatVersion},
          {"step", s.step},
          {"loader", {{"epoch", s.loader.epoch}, {"batch", s.loader.batch}}},
          {"rng", {{"seed", s.rng_seed}, {"offset", s.rng_offset}}},
          {"run", s.run}};
}

// Reads one field of trainer.json, naming the file and the field when it is absent or ill-typed.
template <class T>
T field(const json& j, const json::json_pointer& where, const std::string& file) {
  OCTET_CHECK(j.contains(where), "checkpoint ", file, " has no \"", where.to_string(),
              "\": the file is corrupt or from another program; pass another --resume");
  try {
    return j.at(where).get<T>();
  } catch (const json::exception&) {
    OCTET_FAIL("checkpoint ", file, ": \"", where.to_string(), "\" is ", j.at(where).dump(),
               ", not the expected type; the file is corrupt, pass another --resume");
  }
}

TrainerState from_json(const json& j, const std::string& file) {
  const int version = field<int>(j, json::json_pointer("/format_version"), file);
  OCTET_CHECK(version == kFormatVersion, "checkpoint ", file, " has format version ", version,
              "; this build reads version ", kFormatVersion);
  TrainerState s;
  s.step = field<int64_t>(j, json::json_pointer("/step"), file);
  s.loader.epoch = field<int64_t>(j, json::json_pointer("/loader/epoch"), file);
  s.loader.batch = field<int64_t>(j, json::json_pointer("/loader/batch"), file);
  s.rng_seed = field<uint64_t>(j, json::json_pointer("/rng/seed"), file);
  s.rng_offset = field<uint64_t>(j, json::json_pointer("/rng/offset"), file);
  s.run = field<std::map<std::string, std::string>>(j, json::json_pointer("/run"), file);
  OCTET_CHECK(s.step >= 0 && s.loader.epoch >= 0 && s.loader.batch >= 0, "checkpoint ", file,
              " holds a negative step or loader position; the file is corrupt, pass another --resume");
  return s;
}

}  // namespace

std::string save_checkpoint(const std::string& root, nn::Module& model, const optim::Optimizer& optimizer,
                            const TrainerState& state) {
  std::error_code ec;
  fs::create_directories(root, ec);
  OCTET_CHECK(!ec, "cannot create checkpoint directory ", root, ": ", ec.message(),
              "; pass a writable --checkpoint-dir");
  const std::string name = step_name(state.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path tmp_dir = fs::path(root) / ("." + name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp_dir);
  fs::create_directory(tmp_dir);

  nn::save_safetensors((tmp_dir / "model.safetensors").string(), model.state_dict(), {{"format", "pt"}});
  nn::save_safetensors((tmp_dir / "optimizer.safetensors").string(), optimizer.state_dict());
  const std::map<std::string, Tensor> fp8_state = nn::fp8_state_dict(model);
  if (!fp8_state.empty()) nn::save_safetensors((tmp_dir / "fp8.safetensors").string(), fp8_state);
  write_file_atomic((tmp_dir / "trainer.json").string(), to_json(state).dump(2) + "\n");

  // rename() will not replace a non-empty directory: move an older checkpoint of the same step aside.
  const fs::path old_dir = fs::path(root) / ("." + name + ".old-" + std::to_string(::getpid()));
  const bool replacing = fs::exists(final_dir);
  if (replacing) fs::rename(final_dir, old_dir);
  fs::rename(tmp_dir, final_dir);
  if (replacing) fs::remove_all(old_dir);
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  return final_dir.string();
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  OCTET_CHECK(fs::exists(p), "no checkpoint at ", path, ": the path does not exist; pass a directory written by "
              "--checkpoint-dir (or one of its step-* folders) to --resume");
  if (fs::exists(p / "trainer.json")) return p.string();
  const fs::path latest = p / "latest";
  OCTET_CHECK(fs::exists(latest), "no checkpoint in ", path, ": it has neither trainer.json nor a `latest` file; "
              "pass a directory written by --checkpoint-dir (or one of its step-* folders) to --resume");
  std::string name = read_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  OCTET_CHECK(!name.empty() && name.find('/') == std::string::npos, latest.string(), " holds \"", name,
              "\", not a checkpoint name; the file is corrupt, pass a step-* folder to --resume instead");
  const fs::path dir = p / name;
  OCTET_CHECK(fs::exists(dir / "trainer.json"), latest.string(), " points at ", dir.string(),
              ", which holds no trainer.json; pass another step-* folder to --resume");
  return dir.string();
}

namespace {

TrainerState read_trainer_state(const fs::path& dir) {
  const std::string trainer_file = (dir / "trainer.json").string();
  json j;
  try {
    j = json::parse(read_file(trainer_file));
  } catch (const json::parse_error& e) {
    OCTET_FAIL("checkpoint ", trainer_file, " is not valid JSON (", e.what(),
               "); it is corrupt or truncated, pass another --resume");
  }
  return from_json(j, trainer_file);
}

// Without fp8.safetensors (a bf16 or fp32 checkpoint) an FP8 run starts its scaling afresh.
void load_fp8_state_if_saved(const fs::path& dir, nn::Module& model) {
  const std::string fp8_file = (dir / "fp8.safetensors").string();
  if (!fs::exists(fp8_file)) return;
  const nn::SafetensorsFile fp8_state = nn::load_safetensors(fp8_file);
  try {
    nn::load_fp8_state_dict(model, fp8_state.tensors);
  } catch (const Error& e) {
    OCTET_FAIL(fp8_file, " does not fit this model's FP8 layers (was it written with another --model?): ", e.what());
  }
}

}  // namespace

TrainerState load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer) {
  const fs::path dir = resolve_checkpoint(path);
  OCTET_CHECK(!fs::exists(dir / "index.json"), dir.string(), " holds FSDP shards (index.json), not one model file; "
              "resume it with --parallel fsdp, at any number of ranks");
  TrainerState state = read_trainer_state(dir);
  const std::string model_file = (dir / "model.safetensors").string();
  const std::string optimizer_file = (dir / "optimizer.safetensors").string();
  nn::SafetensorsFile weights = nn::load_safetensors(model_file);
  nn::SafetensorsFile optimizer_state = nn::load_safetensors(optimizer_file);
  try {
    model.load_state_dict(weights.tensors, /*strict=*/true);
  } catch (const Error& e) {
    OCTET_FAIL(model_file, " does not fit this model (was the checkpoint written with another --model?): ", e.what());
  }
  try {
    optimizer.load_state_dict(optimizer_state.tensors);
  } catch (const Error& e) {
    OCTET_FAIL(optimizer_file, " does not fit this optimizer (was it written with another --optimizer?): ", e.what());
  }
  load_fp8_state_if_saved(dir, model);
  return state;
}

std::string save_sharded_checkpoint(const std::string& root, distributed::FullyShardedDataParallel& fsdp,
                                    const optim::Optimizer& optimizer, nn::Module& model, const TrainerState& state) {
  // save_fsdp_checkpoint creates the folders and reports a failure on every rank.
  const bool lead = fsdp.process_group()->rank() == 0;
  const std::string name = step_name(state.step);
  const fs::path final_dir = fs::path(root) / name;
  distributed::save_fsdp_checkpoint(final_dir.string(), fsdp, &optimizer, [&](const std::string& staging) {
    const std::map<std::string, Tensor> fp8_state = nn::fp8_state_dict(model);
    if (!fp8_state.empty()) nn::save_safetensors((fs::path(staging) / "fp8.safetensors").string(), fp8_state);
    write_file_atomic((fs::path(staging) / "trainer.json").string(), to_json(state).dump(2) + "\n");
  });
  if (lead) write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  fsdp.process_group()->barrier()->wait();  // `latest` is in place before any rank goes on
  return final_dir.string();
}

TrainerState load_sharded_checkpoint(const std::string& path, distributed::FullyShardedDataParallel& fsdp,
                                     optim::Optimizer& optimizer, nn::Module& model) {
  const fs::path dir = resolve_checkpoint(path);
  OCTET_CHECK(fs::exists(dir / "index.json"), dir.string(), " is a single-process or DDP checkpoint (no index.json of "
              "FSDP shards); resume it without --parallel fsdp, or with --parallel ddp");
  TrainerState state = read_trainer_state(dir);
  distributed::load_fsdp_checkpoint(dir.string(), fsdp, &optimizer);
  load_fp8_state_if_saved(dir, model);
  return state;
}

}  // namespace octet::apps
