#include "apps/checkpoint.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/checksum_json.h"
#include "core/error.h"
#include "core/log.h"
#include "distributed/fsdp_checkpoint.h"
#include "nn/fp8.h"
#include "nn/safetensors.h"

namespace octet::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Version 2 records the checksums of the checkpoint's files ("checksums"); version 1 checkpoints load
// unchecked, with a warning.
constexpr int kFormatVersion = 2;
constexpr int kUncheckedFormatVersion = 1;

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
  OCTET_CHECK(version == kFormatVersion || version == kUncheckedFormatVersion, "checkpoint ", file,
              " has format version ", version, "; this build reads versions ", kUncheckedFormatVersion, " and ",
              kFormatVersion, ": resume it with the Octet build that wrote it, or start afresh");
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

  // trainer.json records the others' checksums, and is written last.
  FileDigests files;
  files["model.safetensors"] =
      nn::save_safetensors((tmp_dir / "model.safetensors").string(), model.state_dict(), {{"format", "pt"}});
  files["optimizer.safetensors"] =
      nn::save_safetensors((tmp_dir / "optimizer.safetensors").string(), optimizer.state_dict());
  const std::map<std::string, Tensor> fp8_state = nn::fp8_state_dict(model);
  if (!fp8_state.empty()) {
    files["fp8.safetensors"] = nn::save_safetensors((tmp_dir / "fp8.safetensors").string(), fp8_state);
  }
  json trainer = to_json(state);
  trainer["checksums"] = digests_to_json(files);
  write_file_atomic((tmp_dir / "trainer.json").string(), trainer.dump(2) + "\n");

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
  OCTET_CHECK(fs::is_directory(p), "--resume ", path, " is a file; pass the checkpoint folder that holds it (",
              p.parent_path().empty() ? std::string(".") : p.parent_path().string(), ") or its --checkpoint-dir");
  if (fs::exists(p / "trainer.json")) return p.string();
  const fs::path latest = p / "latest";
  OCTET_CHECK(fs::exists(latest), "no checkpoint in ", path, ": it has neither trainer.json nor a `latest` file; "
              "pass a directory written by --checkpoint-dir (or one of its step-* folders) to --resume");
  std::string name = read_file(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  OCTET_CHECK(!name.empty() && name.find('/') == std::string::npos, latest.string(), " holds \"", name,
              "\", not a checkpoint name; the file is corrupt, pass a step-* folder to --resume instead");
  const fs::path dir = p / name;
  OCTET_CHECK(fs::exists(dir), latest.string(), " points at ", dir.string(), ", which does not exist (deleted or "
              "moved?); pass one of the step-* folders beside it to --resume");
  OCTET_CHECK(fs::exists(dir / "trainer.json"), latest.string(), " points at ", dir.string(),
              ", which holds no trainer.json; pass another step-* folder to --resume");
  return dir.string();
}

namespace {

// What to do about a corrupt file of the checkpoint in `dir`: take an older one beside it.
std::string corrupt_fix(const fs::path& dir) {
  const fs::path root = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  return "resume from an older checkpoint in " + root.string() + " (pass its step-* folder to --resume; " +
         (root / "latest").string() + " names this one)";
}

json parse_trainer_json(const std::string& text, const std::string& trainer_file) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    OCTET_FAIL("checkpoint ", trainer_file, " is not valid JSON (", e.what(),
               "); it is corrupt or truncated, pass another --resume");
  }
}

// trainer.json of a single-process checkpoint records the other files' checksums (format version 2;
// version 1 recorded none). It is the one file not checksummed: it is parsed and checked field by field.
FileVerifier verifier_of(const json& trainer, const fs::path& dir) {
  const std::string trainer_file = (dir / "trainer.json").string();
  std::optional<FileDigests> digests;
  if (field<int>(trainer, json::json_pointer("/format_version"), trainer_file) >= kFormatVersion) {
    digests = digests_from_json(field<json>(trainer, json::json_pointer("/checksums"), trainer_file), trainer_file);
  }
  return FileVerifier(dir.string(), "trainer.json", std::move(digests), corrupt_fix(dir));
}

// Without fp8.safetensors (a bf16 or fp32 checkpoint) an FP8 run starts its scaling afresh. It is the
// one file a run can do without, so one that was saved and has gone is a warning rather than an error:
// the run goes on, only no longer bit for bit. When it is there, it is checked like the others.
std::optional<nn::SafetensorsFile> read_fp8_state_if_saved(const FileVerifier& files) {
  const std::string name = "fp8.safetensors";
  if (!files.holds(name)) return std::nullopt;
  if (!fs::exists(files.path(name))) {
    logging::warn("checkpoint file {} is missing, though the checkpoint records it: FP8 scaling starts afresh, so "
                  "the run will not continue bit for bit. Put the file back to resume exactly",
                  files.path(name));
    return std::nullopt;
  }
  return nn::load_checked_safetensors(files, name);
}

void load_fp8_state(const std::optional<nn::SafetensorsFile>& fp8_state, const std::string& fp8_file,
                    nn::Module& model) {
  if (!fp8_state) return;
  try {
    nn::load_fp8_state_dict(model, fp8_state->tensors);
  } catch (const Error& e) {
    OCTET_FAIL(fp8_file, " does not fit this model's FP8 layers (was it written with another --model?): ", e.what());
  }
}

}  // namespace

std::map<std::string, std::string> checkpoint_run_flags(const std::string& path) {
  const std::string trainer_file = (fs::path(resolve_checkpoint(path)) / "trainer.json").string();
  const json trainer = parse_trainer_json(read_file(trainer_file), trainer_file);
  const json::json_pointer run("/run");
  if (!trainer.contains(run)) return {};
  return field<std::map<std::string, std::string>>(trainer, run, trainer_file);
}

TrainerState load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer) {
  const fs::path dir = resolve_checkpoint(path);
  OCTET_CHECK(!fs::exists(dir / "index.json"), dir.string(), " holds FSDP shards (index.json), not one model file; "
              "resume it with --parallel fsdp, at any number of ranks");
  const std::string trainer_file = (dir / "trainer.json").string();
  const json trainer = parse_trainer_json(read_file(trainer_file), trainer_file);
  TrainerState state = from_json(trainer, trainer_file);
  // Every file is read and checked before any of it goes into the model or the optimizer.
  const FileVerifier files = verifier_of(trainer, dir);
  const nn::SafetensorsFile weights = nn::load_checked_safetensors(files, "model.safetensors");
  const nn::SafetensorsFile optimizer_state = nn::load_checked_safetensors(files, "optimizer.safetensors");
  const std::optional<nn::SafetensorsFile> fp8_state = read_fp8_state_if_saved(files);
  try {
    model.load_state_dict(weights.tensors, /*strict=*/true);
  } catch (const Error& e) {
    OCTET_FAIL(files.path("model.safetensors"),
               " does not fit this model (was the checkpoint written with another --model?): ", e.what());
  }
  try {
    optimizer.load_state_dict(optimizer_state.tensors);
  } catch (const Error& e) {
    OCTET_FAIL(files.path("optimizer.safetensors"),
               " does not fit this optimizer (was it written with another --optimizer?): ", e.what());
  }
  load_fp8_state(fp8_state, files.path("fp8.safetensors"), model);
  return state;
}

std::string save_sharded_checkpoint(const std::string& root, distributed::FullyShardedDataParallel& fsdp,
                                    const optim::Optimizer& optimizer, nn::Module& model, const TrainerState& state) {
  // save_fsdp_checkpoint creates the folders and reports a failure on every rank.
  const bool lead = fsdp.process_group()->rank() == 0;
  const std::string name = step_name(state.step);
  const fs::path final_dir = fs::path(root) / name;
  // index.json records the checksums of these files, with the shards'.
  distributed::save_fsdp_checkpoint(final_dir.string(), fsdp, &optimizer, [&](const std::string& staging,
                                                                              FileDigests& files) {
    const std::map<std::string, Tensor> fp8_state = nn::fp8_state_dict(model);
    if (!fp8_state.empty()) {
      files["fp8.safetensors"] = nn::save_safetensors((fs::path(staging) / "fp8.safetensors").string(), fp8_state);
    }
    const std::string trainer = to_json(state).dump(2) + "\n";
    write_file_atomic((fs::path(staging) / "trainer.json").string(), trainer);
    files["trainer.json"] = digest_of(trainer);
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
  // trainer.json and fp8.safetensors are read and checked against index.json's checksums with the
  // shards, on every rank, before the load changes anything.
  TrainerState state;
  std::optional<nn::SafetensorsFile> fp8_state;
  distributed::load_fsdp_checkpoint(dir.string(), fsdp, &optimizer, [&](const FileVerifier& files) {
    files.require_present("trainer.json");
    const std::string text = read_file(files.path("trainer.json"));
    files.verify("trainer.json", digest_of(text));
    state = from_json(parse_trainer_json(text, files.path("trainer.json")), files.path("trainer.json"));
    fp8_state = read_fp8_state_if_saved(files);
  });
  load_fp8_state(fp8_state, (dir / "fp8.safetensors").string(), model);
  return state;
}

}  // namespace octet::apps
