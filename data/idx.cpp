#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace octet::data {
namespace {

constexpr const char* kReinstall =
    "the file is damaged or incomplete: download it again (for Fashion-MNIST: "
    "`sudo apt-get install --reinstall dataset-fashion-mnist`)";
// A corrupt header could claim terabytes; no IDX data set is anywhere near this.
constexpr int64_t kMaxDataBytes = int64_t{1} << 34;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

GzFile open(const std::string& path) {
  errno = 0;
  GzFile f(gzopen(path.c_str(), "rb"));
  OCTET_CHECK(f != nullptr, "IDX file ", path, ": cannot open it (",
              errno ? std::strerror(errno) : "out of memory", "); check the path and its permissions");
  return f;
}

// Reads up to n bytes; returns how many arrived (fewer only at the end of the data).
int64_t read_some(gzFile_s* f, const std::string& path, uint8_t* out, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - done, INT_MAX / 2));
    const int got = gzread(f, out + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* why = gzerror(f, &code);
      OCTET_FAIL("IDX file ", path, ": cannot read it (", code == Z_ERRNO ? std::strerror(errno) : why, "); ",
                 kReinstall);
    }
    if (got == 0) break;
    done += got;
  }
  return done;
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Reads the magic number and `ndims` dims, checks them, then reads exactly prod(dims) data bytes.
std::vector<uint8_t> read_idx(const std::string& path, uint32_t magic, const char* kind, int ndims,
                              std::vector<int64_t>& dims) {
  GzFile f = open(path);
  const int header_bytes = 4 + 4 * ndims;
  uint8_t header[16];
  const int64_t got_header = read_some(f.get(), path, header, header_bytes);
  OCTET_CHECK(got_header == header_bytes, "IDX file ", path, ": only ", got_header, " bytes, too short for the ",
              header_bytes, "-byte header of an ", kind, " file; ", kReinstall);
  const uint32_t found_magic = big_endian_u32(header);
  OCTET_CHECK(found_magic == magic, "IDX file ", path, ": bad magic number ", found_magic, ", expected ", magic,
              " (an ", kind, " file: u8 data, ", ndims, " dim", ndims > 1 ? "s" : "",
              "); is this the right file (images vs labels)? Otherwise ", kReinstall);
  dims.clear();
  int64_t data_bytes = 1;
  for (int d = 0; d < ndims; ++d) {
    dims.push_back(big_endian_u32(header + 4 + 4 * d));
    OCTET_CHECK(dims.back() > 0, "IDX file ", path, ": dim ", d, " of its header is 0; ", kReinstall);
    data_bytes *= dims.back();
    OCTET_CHECK(data_bytes <= kMaxDataBytes, "IDX file ", path, ": its header promises more than ", kMaxDataBytes,
                " bytes of data, which no IDX data set holds; ", kReinstall);
  }

  std::vector<uint8_t> data(static_cast<size_t>(data_bytes));
  const int64_t got = read_some(f.get(), path, data.data(), data_bytes);
  OCTET_CHECK(got == data_bytes, "IDX file ", path, ": truncated: it holds ", got,
              " bytes of data where its header promises ", data_bytes, "; ", kReinstall);
  uint8_t extra;
  OCTET_CHECK(read_some(f.get(), path, &extra, 1) == 0, "IDX file ", path, ": overlong: it holds more than the ",
              data_bytes, " bytes of data its header promises; ", kReinstall);
  return data;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  std::vector<int64_t> dims;
  IdxImages images;
  images.pixels = read_idx(path, kIdxImagesMagic, "idx3-ubyte image", 3, dims);
  images.count = dims[0];
  images.rows = dims[1];
  images.cols = dims[2];
  return images;
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  std::vector<int64_t> dims;
  return read_idx(path, kIdxLabelsMagic, "idx1-ubyte label", 1, dims);
}

}  // namespace octet::data
