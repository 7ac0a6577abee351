#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"

namespace octet::nn {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes and Octet copies them as they are");

using Json = nlohmann::json;

struct FormatName {
  DType dtype;
  const char* name;
};
constexpr FormatName kFormatNames[] = {
    {DType::f64, "F64"}, {DType::f32, "F32"},      {DType::bf16, "BF16"},
    {DType::f16, "F16"}, {DType::e4m3, "F8_E4M3"}, {DType::e5m2, "F8_E5M2"},
    {DType::i64, "I64"}, {DType::i32, "I32"},      {DType::u8, "U8"},
};
// Dtypes the format defines that Octet has no tensor type for: a real file may hold them.
constexpr const char* kOtherFormatNames[] = {"BOOL", "I8",      "I16",     "U16",     "U32", "U64",
                                             "C64",  "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"};

// Real headers are kilobytes (a few hundred bytes per tensor); a larger length means garbage, and
// trusting it would make us allocate it.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// top-level object > tensor entry > shape or data_offsets array.
constexpr int kMaxHeaderDepth = 2;

const char* format_name(DType dtype) {
  for (const FormatName& f : kFormatNames) {
    if (f.dtype == dtype) return f.name;
  }
  OCTET_FAIL("save_safetensors: dtype ", dtype_name(dtype), " has no safetensors name");
}

std::optional<DType> dtype_from_format_name(std::string_view name) {
  for (const FormatName& f : kFormatNames) {
    if (name == f.name) return f.dtype;
  }
  return std::nullopt;
}

std::string supported_format_names() {
  std::string names;
  for (const FormatName& f : kFormatNames) {
    if (!names.empty()) names += ' ';
    names += f.name;
  }
  return names;
}

template <class... Args>
[[noreturn]] void corrupt(const std::string& path, const Args&... problem) {
  OCTET_FAIL("load_safetensors: '", path, "' is not a valid safetensors file: ", problem...,
             ". The checkpoint is corrupt or truncated: save it again, or pass another file");
}

// The file, read with pread at validated offsets, so loading holds one copy of the weights rather
// than the whole file plus the tensors.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    OCTET_CHECK(fd_ >= 0, "load_safetensors: cannot open '", path,
                "': ", std::generic_category().message(errno), "; check the path, or pass another file");
    struct stat info {};
    const bool regular = ::fstat(fd_, &info) == 0 && S_ISREG(info.st_mode);
    if (!regular) ::close(fd_);
    OCTET_CHECK(regular, "load_safetensors: '", path,
                "' is not a regular file; pass the path of a .safetensors file");
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }

  void read(void* destination, uint64_t bytes, uint64_t offset) const {
    char* out = static_cast<char*>(destination);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, out, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      OCTET_CHECK(n > 0, "load_safetensors: reading '", path_, "' failed: ",
                  n < 0 ? std::generic_category().message(errno) : "the file shrank while it was read",
                  "; make sure nothing else is writing it and try again");
      out += n;
      offset += static_cast<uint64_t>(n);
      bytes -= static_cast<uint64_t>(n);
    }
  }

 private:
  std::string path_;
  int fd_;
  uint64_t size_ = 0;
};

// nlohmann::json silently keeps the last of two equal keys, and the format forbids them, so a parse
// callback watches every object's keys; it also refuses nesting no header has.
Json parse_header_json(const std::string& path, std::string_view text) {
  std::vector<std::set<std::string>> open_objects;
  auto watch = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) {
      if (depth > kMaxHeaderDepth)
        corrupt(path, "its header nests objects or arrays deeper than any tensor entry");
      if (event == Json::parse_event_t::object_start) open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == Json::parse_event_t::key) {
      const std::string key = parsed.get<std::string>();
      if (!open_objects.back().insert(key).second) {
        if (open_objects.size() == 1) corrupt(path, "its header lists tensor '", key, "' twice");
        corrupt(path, "its header repeats the key '", key, "' inside one entry");
      }
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), watch);
  } catch (const Json::parse_error& e) {
    corrupt(path, "its header is not valid JSON (", e.what(), ")");
  }
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // within the data buffer
};

// A non-negative JSON integer that fits in int64, or nothing.
std::optional<uint64_t> as_count(const Json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  const uint64_t v = value.get<uint64_t>();
  if (v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return v;
}

Entry parse_entry(const std::string& path, const std::string& name, const Json& value,
                  uint64_t buffer_bytes) {
  if (!value.is_object())
    corrupt(path, "the entry of tensor '", name, "' is ", value.dump(), ", not a JSON object");
  auto field = [&](const char* key) -> const Json& {
    const auto it = value.find(key);
    if (it == value.end()) corrupt(path, "tensor '", name, "' has no \"", key, "\" field");
    return *it;
  };

  const Json& dtype = field("dtype");
  if (!dtype.is_string())
    corrupt(path, "tensor '", name, "' has \"dtype\": ", dtype.dump(), ", not a string");
  const std::string dtype_text = dtype.get<std::string>();
  const std::optional<DType> parsed_dtype = dtype_from_format_name(dtype_text);
  if (!parsed_dtype) {
    const bool real =
        std::find_if(std::begin(kOtherFormatNames), std::end(kOtherFormatNames),
                     [&](const char* n) { return dtype_text == n; }) != std::end(kOtherFormatNames);
    OCTET_CHECK(!real, "load_safetensors: '", path, "': tensor '", name, "' has dtype ", dtype_text,
                ", which Octet does not support (it reads ", supported_format_names(),
                "); convert that tensor to one of those dtypes before loading, or pass another file");
    corrupt(path, "tensor '", name, "' has unknown dtype '", dtype_text,
            "' (safetensors dtypes Octet reads: ", supported_format_names(), ")");
  }

  const Json& shape = field("shape");
  if (!shape.is_array()) corrupt(path, "tensor '", name, "' has \"shape\": ", shape.dump(), ", not an array");
  Entry entry{name, *parsed_dtype, Shape{}, 0, 0};
  uint64_t bytes = dtype_size(entry.dtype);
  for (const Json& dim : shape) {
    if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      corrupt(path, "tensor '", name, "' has negative dimension ", dim.dump(), " in shape ", shape.dump());
    }
    const std::optional<uint64_t> extent = as_count(dim);
    if (!extent)
      corrupt(path, "tensor '", name, "' has shape ", shape.dump(), ", which is not a list of integers");
    if (__builtin_mul_overflow(bytes, *extent, &bytes)) {
      corrupt(path, "tensor '", name, "' has shape ", shape.dump(), ", too large for any file");
    }
    entry.shape.push_back(static_cast<int64_t>(*extent));
  }

  const Json& offsets = field("data_offsets");
  const bool pair = offsets.is_array() && offsets.size() == 2 && as_count(offsets[0]) && as_count(offsets[1]);
  if (!pair || *as_count(offsets[0]) > *as_count(offsets[1])) {
    corrupt(path, "tensor '", name, "' has \"data_offsets\": ", offsets.dump(),
            ", not two non-negative integers [begin, end] with begin <= end");
  }
  entry.begin = *as_count(offsets[0]);
  entry.end = *as_count(offsets[1]);
  if (entry.end > buffer_bytes) {
    corrupt(path, "tensor '", name, "' has data_offsets [", entry.begin, ", ", entry.end,
            "], past the end of the ", buffer_bytes, "-byte data buffer");
  }
  if (entry.end - entry.begin != bytes) {
    corrupt(path, "tensor '", name, "' is ", dtype_text, " with shape ", entry.shape, ", which takes ", bytes,
            " bytes, but its data_offsets [", entry.begin, ", ", entry.end, "] span ",
            entry.end - entry.begin);
  }
  return entry;
}

// The format requires the tensors to tile the data buffer exactly: no overlaps, gaps or tail.
void check_tiling(const std::string& path, std::vector<Entry> entries, uint64_t buffer_bytes) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered) {
      corrupt(path, "tensor '", e.name, "' at bytes [", e.begin, ", ", e.end, ") overlaps tensor '",
              previous->name, "' at [", previous->begin, ", ", previous->end, ")");
    }
    if (e.begin > covered) {
      corrupt(path, "bytes [", covered, ", ", e.begin, ") of the data buffer, before tensor '", e.name,
              "', belong to no tensor");
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != buffer_bytes) {
    corrupt(path, buffer_bytes - covered, " trailing bytes follow the last tensor in the data buffer");
  }
}

}  // namespace

FileDigest save_safetensors(const std::string& path, const StateDict& tensors,
                            const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps "__metadata__" first and the entries in buffer order, as the reference writer does.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host_tensors;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    OCTET_CHECK(name != "__metadata__", "save_safetensors: '", path,
                "': no tensor may be named __metadata__ (the format reserves it); rename the tensor");
    OCTET_CHECK(tensor.defined(), "save_safetensors: '", path, "': tensor '", name,
                "' is undefined; give it a value or leave it out");
    Tensor host = tensor.detach().to(Device::cpu());
    header[name] = {{"dtype", format_name(host.dtype())},
                    {"shape", std::vector<int64_t>(host.shape().begin(), host.shape().end())},
                    {"data_offsets", {offset, offset + host.nbytes()}}};
    offset += host.nbytes();
    host_tensors.push_back(std::move(host));
  }

  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keeps the data buffer 8-byte aligned
  std::string file;
  file.reserve(8 + json.size() + offset);
  const uint64_t header_bytes = json.size();
  file.append(reinterpret_cast<const char*>(&header_bytes), 8);
  file += json;
  for (const Tensor& t : host_tensors) file.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  write_file_atomic(path, file);
  return digest_of(file);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const InputFile file(path);
  if (file.size() < 8)
    corrupt(path, "it is ", file.size(), " bytes long, too short for the 8-byte header length");
  uint64_t header_bytes = 0;
  file.read(&header_bytes, 8, 0);
  if (header_bytes > kMaxHeaderBytes) {
    corrupt(path, "its header length ", header_bytes, " is absurd (over ", kMaxHeaderBytes, " bytes)");
  }
  if (header_bytes > file.size() - 8) {
    corrupt(path, "its header length is ", header_bytes, " bytes but only ", file.size() - 8,
            " bytes follow the length");
  }
  std::string text(header_bytes, '\0');
  file.read(text.data(), header_bytes, 8);
  uint32_t crc = crc32(std::string_view(reinterpret_cast<const char*>(&header_bytes), 8));
  crc = crc32(text, crc);
  const Json header = parse_header_json(path, text);
  if (!header.is_object()) corrupt(path, "its header is ", header.type_name(), ", not a JSON object");

  const uint64_t buffer_start = 8 + header_bytes;
  const uint64_t buffer_bytes = file.size() - buffer_start;
  SafetensorsFile result;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key != "__metadata__") {
      entries.push_back(parse_entry(path, key, value, buffer_bytes));
      continue;
    }
    if (!value.is_object())
      corrupt(path, "its \"__metadata__\" is ", value.dump(), ", not an object of strings");
    for (const auto& [meta_key, meta_value] : value.items()) {
      if (!meta_value.is_string()) {
        corrupt(path, "metadata '", meta_key, "' is ", meta_value.dump(), ", not a string");
      }
      result.metadata[meta_key] = meta_value.get<std::string>();
    }
  }
  check_tiling(path, entries, buffer_bytes);

  // Every size is now known to fit inside the file, so these allocations are bounded by its length.
  // In buffer order (the header lists names alphabetically), so that the checksum runs over the file
  // from front to back.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    file.read(t.data_ptr(), e.end - e.begin, buffer_start + e.begin);
    crc = crc32(std::string_view(static_cast<const char*>(t.data_ptr()), e.end - e.begin), crc);
    result.tensors.emplace(e.name, std::move(t));
  }
  result.digest = {file.size(), crc};
  return result;
}

SafetensorsFile load_checked_safetensors(const FileVerifier& files, const std::string& name) {
  files.require_present(name);
  SafetensorsFile file = load_safetensors(files.path(name));
  files.verify(name, file.digest);
  return file;
}

}  // namespace octet::nn
