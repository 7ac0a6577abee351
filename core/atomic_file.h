#pragma once
// Whole-file reads and crash-safe writes, for checkpoints.
//
// write_file_atomic leaves either the old file or the complete new one at `path`, never a torn
// mix, even if the process dies or the machine loses power mid-write: the bytes go to a temporary
// file beside the target (same filesystem, so the rename is atomic), are flushed to disk, the
// temporary is renamed over the target, and the directory is flushed so the rename itself lasts.
#include <string>
#include <string_view>

namespace octet {

// Replaces `path` with `bytes`. On failure the temporary is removed, any old file at `path` is
// left untouched, and an octet::Error names the path and the system's reason.
void write_file_atomic(const std::string& path, std::string_view bytes);

// The whole contents of `path`. Throws an octet::Error naming the path when it is missing or
// cannot be read.
std::string read_file(const std::string& path);

}  // namespace octet
