#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace octet {
namespace {

std::string errno_text(int err) { return std::generic_category().message(err); }

// Owns a file descriptor; close() reports the error a delayed write can surface at close time.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  int close() {  // 0 or the errno
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

std::string directory_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// A hidden name beside the target, unique per process (pid) and per call (counter), so concurrent
// writers never share a temporary.
std::string temporary_path(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path target(path);
  std::string name = ".";  // appended piecewise: GCC 12 warns (-Wrestrict) on "." + string
  name += target.filename().string();
  name += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  return (target.parent_path() / name).string();
}

int write_all(int fd, std::string_view bytes) {  // 0 or the errno
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string temporary = temporary_path(path);
  auto fail = [&](const char* step, int err) {
    ::unlink(temporary.c_str());
    OCTET_FAIL("write_file_atomic: cannot write '", path, "': ", step, " failed: ", errno_text(err),
               ". Check that the directory exists and is writable, that the path is not a directory, and "
               "that the disk has space; any previous file at that path is unchanged");
  };

  FileDescriptor file(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!file.is_open()) fail("creating a temporary file beside it", errno);
  if (const int err = write_all(file.get(), bytes)) fail("writing", err);
  if (::fsync(file.get()) != 0) fail("flushing to disk", errno);
  if (const int err = file.close()) fail("closing", err);
  if (::rename(temporary.c_str(), path.c_str()) != 0) fail("renaming the temporary over it", errno);

  // The new file is in place; flushing the directory makes the rename survive a crash. Some
  // filesystems cannot flush a directory (EINVAL) and need no such flush.
  FileDescriptor directory(::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const int err = !directory.is_open() ? errno : ::fsync(directory.get()) != 0 ? errno : 0;
  OCTET_CHECK(err == 0 || err == EINVAL, "write_file_atomic: wrote '", path,
              "' but could not flush its directory: ", errno_text(err),
              "; the file may not survive a crash, so write it again");
}

std::string read_file(const std::string& path) {
  auto fail = [&](int err) {
    OCTET_FAIL("read_file: cannot read '", path, "': ", errno_text(err),
               "; check that the path is right and the file is readable");
  };
  FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!file.is_open()) fail(errno);

  std::string bytes;
  struct stat info {};
  if (::fstat(file.get(), &info) == 0 && info.st_size > 0) bytes.reserve(static_cast<size_t>(info.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file.get(), chunk, sizeof chunk);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(errno);
    }
    bytes.append(chunk, static_cast<size_t>(n));
  }
  return bytes;
}

}  // namespace octet
