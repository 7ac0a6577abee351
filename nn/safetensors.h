#pragma once
// Reading and writing safetensors files, the format timm, PyTorch and JAX users exchange weights
// in:
//
//   8 bytes   N, the header length, little-endian u64
//   N bytes   UTF-8 JSON: {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, ...}, padded with spaces to a multiple of 8
//   the rest  the data buffer: each tensor's little-endian elements at [begin, end) of the buffer,
//             every byte belonging to exactly one tensor
//
// Octet writes tensors back to back in name order. Dtypes: F64 F32 BF16 F16 F8_E4M3 F8_E5M2 I64 I32 U8.
#include <map>
#include <string>

#include "core/checksum.h"
#include "core/tensor.h"

namespace octet::nn {

// Parameter name -> tensor (the same alias nn/module.h declares for Module::state_dict).
using StateDict = std::map<std::string, Tensor>;

// Writes `tensors` (copied to the host when they live on a device) and string `metadata` to
// `path` atomically: a crash mid-save leaves the previous file intact. Returns the digest of the bytes
// written (taken from memory, not read back), for a checkpoint to record.
FileDigest save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  StateDict tensors;  // on the CPU, in the file's dtypes
  std::map<std::string, std::string> metadata;
  // Of every byte of the file, taken as it was read: the header and the tensors tile the file, so
  // reading the tensors in buffer order reads each byte once.
  FileDigest digest;
};

// Reads and fully validates `path`: a corrupt or truncated file (bad header, unknown dtype, sizes
// that disagree, offsets outside the buffer, overlapping or gapped tensors, trailing bytes) throws
// an octet::Error naming the file, the tensor and the problem; it never reads out of bounds.
SafetensorsFile load_safetensors(const std::string& path);

// Loads `name` of a checkpoint and checks it against the checksum its metadata recorded
// (core/checksum.h): a file that is missing though recorded, or whose bytes differ, throws naming it.
SafetensorsFile load_checked_safetensors(const FileVerifier& files, const std::string& name);

}  // namespace octet::nn
