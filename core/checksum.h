#pragma once
// Checksums of the files a checkpoint writes, so that a byte altered on disk or in a copy is an error
// at load time instead of weights that train on silently.
//
// The writer digests each file's bytes while they are still in memory, just before they are written
// (no second read), and records the digests by file name in the checkpoint's metadata file
// (trainer.json, or index.json for FSDP shards), which is itself parsed and validated structurally
// rather than checksummed. The reader digests each file as it reads it for use, once, and checks the
// digest before anything uses the contents:
//
//   FileDigests digests;
//   digests["model.safetensors"] = nn::save_safetensors(dir + "/model.safetensors", tensors);
//   ... write digests_to_json(digests) (core/checksum_json.h) into the metadata file ...
//
//   const FileVerifier files(dir, "trainer.json", digests_from_json(...), "resume from another checkpoint");
//   const nn::SafetensorsFile model = nn::load_safetensors(files.path("model.safetensors"));
//   files.verify("model.safetensors", model.digest);  // throws naming the file, both digests and the fix
//
// The checksum is CRC-32 (zlib's: the polynomial of gzip, PNG and zip). It catches every burst of up
// to 32 flipped bits, which is what disks, copies and truncations do; it is no defence against
// deliberate tampering.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace octet {

// CRC-32 of `bytes`, continuing from `crc` (the CRC of what came before; 0 to start), so a file can be
// digested piece by piece: crc32(b, crc32(a)) == crc32(ab).
uint32_t crc32(std::string_view bytes, uint32_t crc = 0);

// What a checkpoint records about one of its files.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  bool operator==(const FileDigest&) const = default;
};
FileDigest digest_of(std::string_view bytes);
std::string describe(const FileDigest& digest);  // "1234 bytes, CRC-32 0a1b2c3d"

// A checkpoint's digests by file name (no directory).
using FileDigests = std::map<std::string, FileDigest>;

// Checks the files of the checkpoint in `dir` against the digests its metadata file recorded.
class FileVerifier {
 public:
  // `metadata_file` is the file name that recorded `digests`; `fix` says what to do about a corrupt file
  // ("resume from an older checkpoint in run/"). No digests: a checkpoint written before they were
  // recorded. Its files pass unchecked, and the first verifier for `dir` in this process logs a warning
  // that says so.
  FileVerifier(std::string dir, std::string metadata_file, std::optional<FileDigests> digests, std::string fix);

  bool checked() const { return digests_.has_value(); }
  // Whether the checkpoint holds `name`: recorded, or (unchecked) present on disk.
  bool holds(const std::string& name) const;
  std::string path(const std::string& name) const;  // dir/name
  // Throws unless `found` (the digest of `name`'s bytes as just read) is the recorded one, or `name` is
  // missing though recorded: the error names the file, what was recorded and found, and the fix.
  void verify(const std::string& name, const FileDigest& found) const;
  void require_present(const std::string& name) const;

 private:
  std::string dir_, metadata_file_, fix_;
  std::optional<FileDigests> digests_;
};

}  // namespace octet
