#include "core/checksum.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>

#include "core/checksum_json.h"
#include "core/error.h"
#include "core/log.h"

namespace octet {

uint32_t crc32(std::string_view bytes, uint32_t crc) {
  // zlib takes a 32-bit length: feed it at most 1 GiB at a time.
  constexpr size_t kPiece = size_t{1} << 30;
  uLong value = crc;
  for (size_t at = 0; at < bytes.size(); at += kPiece) {
    const size_t n = std::min(kPiece, bytes.size() - at);
    value = ::crc32(value, reinterpret_cast<const Bytef*>(bytes.data() + at), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(value);
}

FileDigest digest_of(std::string_view bytes) { return {bytes.size(), crc32(bytes)}; }

namespace {

std::string hex(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", crc);
  return text;
}

}  // namespace

std::string describe(const FileDigest& digest) {
  return std::to_string(digest.bytes) + " bytes, CRC-32 " + hex(digest.crc32);
}

nlohmann::json digests_to_json(const FileDigests& digests) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, d] : digests) j[name] = {{"bytes", d.bytes}, {"crc32", hex(d.crc32)}};
  return j;
}

FileDigests digests_from_json(const nlohmann::json& j, const std::string& metadata_file) {
  const auto bad = [&](const std::string& what) {
    OCTET_FAIL("checkpoint ", metadata_file, ": its checksums ", what,
               "; the file is damaged, load another checkpoint");
  };
  if (!j.is_object()) bad("are " + j.dump() + ", not an object of file names");
  FileDigests digests;
  for (const auto& [name, entry] : j.items()) {
    if (name.empty() || name.find('/') != std::string::npos) bad("name a file '" + name + "' outside the checkpoint");
    const bool well_formed = entry.is_object() && entry.contains("bytes") && entry["bytes"].is_number_unsigned() &&
                             entry.contains("crc32") && entry["crc32"].is_string();
    if (!well_formed) bad("entry for '" + name + "' is " + entry.dump() + ", not {\"bytes\": N, \"crc32\": \"hex\"}");
    const std::string text = entry["crc32"].get<std::string>();
    const bool hex_digits = text.size() == 8 && std::all_of(text.begin(), text.end(), [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    });
    if (!hex_digits) bad("entry for '" + name + "' has crc32 \"" + text + "\", not 8 lowercase hex digits");
    digests[name] = {entry["bytes"].get<uint64_t>(), static_cast<uint32_t>(std::stoul(text, nullptr, 16))};
  }
  return digests;
}

FileVerifier::FileVerifier(std::string dir, std::string metadata_file, std::optional<FileDigests> digests,
                           std::string fix)
    : dir_(std::move(dir)),
      metadata_file_(std::move(metadata_file)),
      fix_(std::move(fix)),
      digests_(std::move(digests)) {
  if (checked()) return;
  // Once per checkpoint: a run that loads the same old checkpoint twice (or FSDP's several readers of
  // it) needs telling once.
  static std::mutex mutex;
  static std::set<std::string> warned;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(dir_).second) return;
  logging::warn("checkpoint {} records no checksums (it was written by an older Octet): its files load unchecked, "
                "so a byte altered on disk would go unnoticed. Save a new checkpoint to have it checked",
                dir_);
}

bool FileVerifier::holds(const std::string& name) const {
  return checked() ? digests_->count(name) > 0 : std::filesystem::exists(path(name));
}

std::string FileVerifier::path(const std::string& name) const { return (std::filesystem::path(dir_) / name).string(); }

void FileVerifier::require_present(const std::string& name) const {
  if (!checked() || !digests_->count(name)) return;
  OCTET_CHECK(std::filesystem::exists(path(name)), "checkpoint file ", path(name), " is missing, though ",
              path(metadata_file_), " records it (", describe(digests_->at(name)),
              "); it was deleted or never copied: ", fix_);
}

void FileVerifier::verify(const std::string& name, const FileDigest& found) const {
  if (!checked()) return;
  const auto it = digests_->find(name);
  OCTET_CHECK(it != digests_->end(), "checkpoint file ", path(name), " has no checksum in ", path(metadata_file_),
              ", so it is not a file that checkpoint's save wrote; ", fix_);
  if (it->second == found) return;
  // Two files exchanged (say two ranks' shards) show up as one file holding another's recorded bytes.
  std::string other;
  for (const auto& [other_name, digest] : *digests_) {
    if (other_name != name && digest == found) other = other_name;
  }
  OCTET_FAIL("checkpoint file ", path(name), " is corrupt: ", path(metadata_file_), " recorded ", describe(it->second),
             " when it was saved, but it now has ", describe(found),
             other.empty() ? std::string(" (its bytes changed on disk or in a copy)")
                           : " (the digest recorded for " + other + ": were the files swapped or renamed?)",
             "; ", fix_);
}

}  // namespace octet
