#include "core/atomic_file.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "core/random.h"
#include "tests/testing.h"

namespace octet {
namespace {

using octet::testing::slurp;

namespace fs = std::filesystem;

// Random bytes over the whole 0..255 range (zeros and high bytes included), from a fixed seed.
std::string random_bytes(size_t n, uint64_t seed) {
  Generator gen(seed);
  const std::vector<double> u = rand({static_cast<int64_t>(n)}, gen, DType::f64).to_vector<double>();
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(static_cast<int>(u[i] * 256.0));
  return bytes;
}

// Reads with the standard library, independently of read_file.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("octet_atomic_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(AtomicFile, WritesReplacesAndReadsBackEveryByte) {
  const std::string path = (dir_ / "weights.bin").string();
  const std::string first = random_bytes(100000, 1);
  write_file_atomic(path, first);
  EXPECT_EQ(slurp(path), first);
  EXPECT_EQ(read_file(path), first);

  const std::string second = random_bytes(777, 2);  // shorter: the old tail must not survive
  write_file_atomic(path, second);
  EXPECT_EQ(slurp(path), second);
  EXPECT_EQ(read_file(path), second);

  write_file_atomic(path, "");
  EXPECT_EQ(fs::file_size(path), 0u);
  EXPECT_EQ(read_file(path), "");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"weights.bin"});  // no temporaries left behind
}

TEST_F(AtomicFile, MissingDirectoryThrowsNamingThePath) {
  const std::string path = (dir_ / "no_such_dir" / "ckpt.safetensors").string();
  EXPECT_TRUE(
      testing::throws_with([&] { write_file_atomic(path, "abc"); },
                           {"write_file_atomic", path, "No such file or directory", "directory exists"}));
  EXPECT_TRUE(entries(dir_).empty());
}

TEST_F(AtomicFile, PathThatIsADirectoryIsLeftIntactWithNoTemporaries) {
  const fs::path target = dir_ / "run";
  fs::create_directories(target);
  write_file_atomic((target / "inside.txt").string(), "keep me");
  EXPECT_TRUE(testing::throws_with([&] { write_file_atomic(target.string(), "new bytes"); },
                                   {"write_file_atomic", target.string(), "renaming", "not a directory"}));
  EXPECT_TRUE(fs::is_directory(target));
  EXPECT_EQ(slurp(target / "inside.txt"), "keep me");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"run"});
  EXPECT_EQ(entries(target), std::vector<std::string>{"inside.txt"});
}

// A write that fails half way (the file-size limit stops it, as a full disk would) leaves the old
// file exactly as it was.
TEST_F(AtomicFile, FailedWriteLeavesTheOldFileUntouched) {
  const std::string path = (dir_ / "model.safetensors").string();
  const std::string old_bytes = random_bytes(1000, 3);
  write_file_atomic(path, old_bytes);

  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 4096;
  auto* previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const bool threw = testing::throws_with([&] { write_file_atomic(path, random_bytes(65536, 4)); },
                                          {"write_file_atomic", path, "writing failed", "File too large"});
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);

  EXPECT_TRUE(threw);
  EXPECT_EQ(slurp(path), old_bytes);
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"model.safetensors"});
}

// Writers racing on one path each use their own temporary, so the survivor is one whole write.
TEST_F(AtomicFile, ConcurrentWritersLeaveOneCompleteFile) {
  const std::string path = (dir_ / "shared.bin").string();
  std::vector<std::string> contents;
  for (uint64_t i = 0; i < 4; ++i) contents.push_back(random_bytes(20000 + 1000 * i, 10 + i));
  std::vector<std::thread> writers;
  for (const std::string& c : contents) {
    writers.emplace_back([&path, &c] {
      for (int k = 0; k < 5; ++k) write_file_atomic(path, c);
    });
  }
  for (std::thread& t : writers) t.join();
  const std::string result = read_file(path);
  EXPECT_NE(std::find(contents.begin(), contents.end(), result), contents.end());
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"shared.bin"});
}

TEST_F(AtomicFile, ReadFileNamesAMissingOrUnreadablePath) {
  const std::string missing = (dir_ / "absent.bin").string();
  EXPECT_TRUE(
      testing::throws_with([&] { read_file(missing); },
                           {"read_file", missing, "No such file or directory", "check that the path"}));
  EXPECT_TRUE(testing::throws_with([&] { read_file(dir_.string()); },
                                   {"read_file", dir_.string(), "Is a directory"}));
}

}  // namespace
}  // namespace octet
