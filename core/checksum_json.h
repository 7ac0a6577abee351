#pragma once
// The JSON form of checkpoint digests (core/checksum.h), apart so that only the code that writes or
// reads metadata files needs nlohmann/json:
//
//   {"model.safetensors": {"bytes": 1234, "crc32": "0a1b2c3d"}, ...}
#include <nlohmann/json.hpp>
#include <string>

#include "core/checksum.h"

namespace octet {

nlohmann::json digests_to_json(const FileDigests& digests);
// Names `metadata_file` and the entry when one is malformed, or names a file outside the checkpoint.
FileDigests digests_from_json(const nlohmann::json& j, const std::string& metadata_file);

}  // namespace octet
