#include "core/trace.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tests/testing.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The recorder is process-wide: every test starts it afresh and leaves it off.
class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("octet_trace_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    trace::stop();
    fs::remove_all(dir_);
  }

  json write_and_parse(const std::string& name) {
    const fs::path path = dir_ / name;
    trace::write(path.string());
    std::ifstream in(path);
    return json::parse(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  }

  fs::path dir_;
};

std::vector<json> events_with_phase(const json& doc, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

const json& span_named(const std::vector<json>& spans, const std::string& name) {
  for (const json& e : spans) {
    if (e.at("name") == name) return e;
  }
  throw std::runtime_error("no span named " + name);
}

TEST_F(TraceTest, WritesCompleteEventsWithRankPidAndOneTidPerTrack) {
  trace::start(3);
  // "comm" recorded first: the shared tracks keep their fixed ids whatever the recording order.
  trace::complete("all_reduce 4 MB", "comm", "comm", 120, 180);
  trace::complete("forward blocks.0", "forward", "compute", 100, 150);
  trace::complete("optimizer", "step", "my track", 10, 20);
  trace::complete("backward blocks.0", "backward", "compute", 200, 260);
  const json doc = write_and_parse("trace.json");

  EXPECT_EQ(doc.at("displayTimeUnit"), "ms");
  const std::vector<json> spans = events_with_phase(doc, "X");
  ASSERT_EQ(spans.size(), 4u);
  for (const json& e : spans) {
    for (const char* key : {"name", "cat", "ph", "ts", "dur", "pid", "tid"}) EXPECT_TRUE(e.contains(key)) << key;
    EXPECT_EQ(e.at("pid"), 3);
  }
  const json& comm = span_named(spans, "all_reduce 4 MB");
  const json& fwd = span_named(spans, "forward blocks.0");
  const json& bwd = span_named(spans, "backward blocks.0");
  const json& mine = span_named(spans, "optimizer");
  EXPECT_EQ(comm.at("cat"), "comm");
  EXPECT_EQ(comm.at("ts"), 120);
  EXPECT_EQ(comm.at("dur"), 60);
  EXPECT_EQ(bwd.at("cat"), "backward");
  EXPECT_EQ(bwd.at("ts"), 200);
  EXPECT_EQ(bwd.at("dur"), 60);
  EXPECT_EQ(fwd.at("tid"), bwd.at("tid"));
  EXPECT_NE(fwd.at("tid"), comm.at("tid"));
  EXPECT_NE(mine.at("tid"), comm.at("tid"));
  EXPECT_NE(mine.at("tid"), fwd.at("tid"));
  EXPECT_LT(fwd.at("tid").get<int>(), comm.at("tid").get<int>());  // compute's row above comm's

  // Metadata: the process is "rank 3"; each tid that holds spans is named after its track, once.
  std::map<int, std::string> thread_names;
  int process_names = 0;
  for (const json& m : events_with_phase(doc, "M")) {
    EXPECT_EQ(m.at("pid"), 3);
    if (m.at("name") == "process_name") {
      ++process_names;
      EXPECT_EQ(m.at("args").at("name"), "rank 3");
    } else if (m.at("name") == "thread_name") {
      EXPECT_TRUE(thread_names.emplace(m.at("tid").get<int>(), m.at("args").at("name").get<std::string>()).second);
    }
  }
  EXPECT_EQ(process_names, 1);
  const std::map<int, std::string> expected = {{fwd.at("tid").get<int>(), "compute"},
                                               {comm.at("tid").get<int>(), "comm"},
                                               {mine.at("tid").get<int>(), "my track"}};
  EXPECT_EQ(thread_names, expected);
}

TEST_F(TraceTest, NamesThatNeedEscapingRoundTrip) {
  trace::start(0);
  const std::string awkward = "quote \" backslash \\ newline \n tab \t é";
  trace::complete(awkward, "forward", "compute", 1, 2);
  const json doc = write_and_parse("escaped.json");
  EXPECT_EQ(events_with_phase(doc, "X").at(0).at("name"), awkward);
}

TEST_F(TraceTest, ScopeRecordsItsLifetimeOnNowUsClock) {
  trace::start(0);
  const int64_t before = trace::now_us();
  {
    trace::Scope scope("step 1", "step", "compute");
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  const int64_t after = trace::now_us();
  const std::vector<trace::Span> spans = trace::spans();
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].name, "step 1");
  EXPECT_EQ(spans[0].category, "step");
  EXPECT_EQ(spans[0].track, "compute");
  EXPECT_GE(spans[0].start_us, before);
  EXPECT_LE(spans[0].end_us, after);
  EXPECT_GE(spans[0].end_us - spans[0].start_us, 3000);
}

TEST_F(TraceTest, TwoThreadsRecordEverySpanIntact) {
  trace::start(1);
  constexpr int kPerThread = 2000;
  auto record = [](const std::string& track) {
    for (int i = 0; i < kPerThread; ++i) {
      if (i % 2 == 0) {
        trace::Scope scope(track + " " + std::to_string(i), "test", track);
      } else {
        trace::complete(track + " " + std::to_string(i), "test", track, i, i + 1);
      }
    }
  };
  std::thread comm(record, "comm");
  record("compute");
  comm.join();

  const std::vector<trace::Span> spans = trace::spans();
  ASSERT_EQ(spans.size(), 2u * kPerThread);
  std::map<std::string, std::set<std::string>> names_by_track;
  for (const trace::Span& s : spans) {
    EXPECT_EQ(s.name.substr(0, s.track.size()), s.track);  // no span mixed up with the other thread's
    names_by_track[s.track].insert(s.name);
  }
  EXPECT_EQ(names_by_track["comm"].size(), static_cast<size_t>(kPerThread));
  EXPECT_EQ(names_by_track["compute"].size(), static_cast<size_t>(kPerThread));
}

TEST_F(TraceTest, OffRecordsNothingAndKeepsWhatWasRecorded) {
  trace::start(0);
  trace::complete("kept", "test", "compute", 1, 2);
  trace::stop();
  EXPECT_FALSE(trace::enabled());
  bool resolved = false;
  trace::complete("dropped", "test", "compute", 3, 4);
  { trace::Scope scope("dropped scope", "test"); }
  trace::defer([&] {
    resolved = true;
    return std::vector<trace::Span>{{"dropped deferred", "test", "gpu comm", 5, 6}};
  });
  const std::vector<trace::Span> spans = trace::spans();
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].name, "kept");
  EXPECT_FALSE(resolved);
}

TEST_F(TraceTest, ScopeOpenedWhileOffStaysOffWhenRecordingStarts) {
  trace::stop();
  {
    trace::Scope scope("opened while off", "test");
    trace::start(0);
  }
  EXPECT_TRUE(trace::spans().empty());
}

TEST_F(TraceTest, DeferredSpansResolveOnceAtTheFirstRead) {
  trace::start(2);
  int calls = 0;
  trace::defer([&] {
    ++calls;
    return std::vector<trace::Span>{{"nccl all_reduce", "comm", "gpu comm", 10, 30},
                                    {"gemm", "compute", "gpu compute", 12, 20}};
  });
  trace::complete("host", "forward", "compute", 5, 40);
  EXPECT_EQ(calls, 0);  // not at defer()

  EXPECT_EQ(trace::spans().size(), 3u);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(trace::spans().size(), 3u);  // not resolved again, not duplicated
  const json doc = write_and_parse("deferred.json");
  EXPECT_EQ(calls, 1);
  const std::vector<json> spans = events_with_phase(doc, "X");
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(span_named(spans, "nccl all_reduce").at("dur"), 20);
  EXPECT_NE(span_named(spans, "nccl all_reduce").at("tid"), span_named(spans, "gemm").at("tid"));

  // One deferred after a read is resolved at the next read.
  trace::defer([] { return std::vector<trace::Span>{{"later", "comm", "gpu comm", 50, 60}}; });
  EXPECT_EQ(trace::spans().size(), 4u);
}

TEST_F(TraceTest, StartClearsSpansAndDropsUnresolvedDeferrals) {
  trace::start(0);
  bool resolved = false;
  trace::complete("old", "test", "compute", 1, 2);
  trace::defer([&] {
    resolved = true;
    return std::vector<trace::Span>{};
  });
  trace::start(5);
  EXPECT_TRUE(trace::spans().empty());
  EXPECT_FALSE(resolved);
  trace::complete("new", "test", "compute", 1, 2);
  const json doc = write_and_parse("restarted.json");
  EXPECT_EQ(events_with_phase(doc, "X").at(0).at("pid"), 5);
}

TEST_F(TraceTest, WriteReplacesTheFileWholeAndLeavesNoTemporary) {
  const fs::path path = dir_ / "trace.rank0.json";
  {
    std::ofstream old(path);
    old << std::string(100000, 'x');  // longer than the new trace: a torn write would leave a tail
  }
  trace::start(0);
  trace::complete("forward", "forward", "compute", 1, 2);
  const json doc = write_and_parse("trace.rank0.json");  // parses: no stale bytes after the JSON
  EXPECT_EQ(events_with_phase(doc, "X").size(), 1u);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"trace.rank0.json"});
}

TEST_F(TraceTest, WriteToAMissingDirectoryThrowsNamingThePathAndTheFix) {
  trace::start(0);
  trace::complete("forward", "forward", "compute", 1, 2);
  const fs::path path = dir_ / "no such dir" / "trace.json";
  try {
    trace::write(path.string());
    FAIL() << "trace::write into a missing directory did not throw";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("trace::write"), std::string::npos) << message;
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find("writable"), std::string::npos) << message;
  }
  EXPECT_FALSE(fs::exists(dir_ / "no such dir"));
  EXPECT_EQ(trace::spans().size(), 1u);  // a failed write loses nothing
}

TEST_F(TraceTest, NowUsIsMonotonicMicroseconds) {
  const int64_t a = trace::now_us();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const int64_t b = trace::now_us();
  EXPECT_GE(b - a, 2000);
  EXPECT_LT(b - a, 2000000);
}

}  // namespace
}  // namespace octet
