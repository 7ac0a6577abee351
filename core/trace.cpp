#include "core/trace.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"

namespace octet::trace {

namespace {

// The rows every trace shares get fixed ids, so they sit in the same order in every rank's file;
// any other track is numbered after them in order of first appearance.
constexpr const char* kKnownTracks[] = {"compute", "comm", "gpu compute", "gpu comm"};

struct Recorder {
  // Read on every call while off, so it is apart from the mutex-guarded state.
  std::atomic<bool> enabled{false};

  std::mutex mutex;  // guards everything below
  int rank = 0;
  std::vector<Span> spans;
  std::vector<std::function<std::vector<Span>()>> deferred;

  // Serialises resolution, so that a second spans() or write() arriving while the first one runs
  // resolvers outside `mutex` waits for their spans instead of returning without them.
  std::mutex resolving;
};

Recorder& recorder() {
  static Recorder instance;
  return instance;
}

// Runs the deferred resolvers recorded so far, once each, and appends their spans. The resolvers run
// without `mutex` held, so recording threads are not blocked while they wait on CUDA events.
void resolve_deferred(Recorder& r) {
  std::lock_guard resolving(r.resolving);
  std::vector<std::function<std::vector<Span>()>> pending;
  {
    std::lock_guard lock(r.mutex);
    pending.swap(r.deferred);
  }
  std::vector<Span> resolved;
  for (auto& resolve : pending) {
    std::vector<Span> more = resolve();
    for (Span& span : more) resolved.push_back(std::move(span));
  }
  std::lock_guard lock(r.mutex);
  for (Span& span : resolved) r.spans.push_back(std::move(span));
}

std::map<std::string, int> track_ids(const std::vector<Span>& spans) {
  std::map<std::string, int> ids;
  int next = 1;
  for (const char* track : kKnownTracks) ids[track] = next++;
  for (const Span& span : spans) {
    if (ids.emplace(span.track, next).second) ++next;
  }
  return ids;
}

nlohmann::json metadata(const char* what, int pid, int tid, nlohmann::json args) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

std::string trace_json(int rank, const std::vector<Span>& spans) {
  const std::map<std::string, int> ids = track_ids(spans);
  nlohmann::json events = nlohmann::json::array();
  events.push_back(metadata("process_name", rank, 0, {{"name", "rank " + std::to_string(rank)}}));
  events.push_back(metadata("process_sort_index", rank, 0, {{"sort_index", rank}}));
  std::map<int, std::string> used;  // only the tracks that hold spans get a row
  for (const Span& span : spans) used.emplace(ids.at(span.track), span.track);
  for (const auto& [tid, track] : used) {
    events.push_back(metadata("thread_name", rank, tid, {{"name", track}}));
    events.push_back(metadata("thread_sort_index", rank, tid, {{"sort_index", tid}}));
  }
  for (const Span& span : spans) {
    events.push_back({{"name", span.name},
                      {"cat", span.category},
                      {"ph", "X"},
                      {"ts", span.start_us},
                      {"dur", span.end_us - span.start_us},
                      {"pid", rank},
                      {"tid", ids.at(span.track)}});
  }
  const nlohmann::json document = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  // Span names come from module names and user strings; replace invalid UTF-8 rather than throw.
  return document.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void start(int rank) {
  Recorder& r = recorder();
  {
    std::lock_guard lock(r.mutex);
    r.rank = rank;
    r.spans.clear();
    r.deferred.clear();
  }
  r.enabled.store(true, std::memory_order_relaxed);
}

void stop() { recorder().enabled.store(false, std::memory_order_relaxed); }

bool enabled() { return recorder().enabled.load(std::memory_order_relaxed); }

int64_t now_us() {
  // steady_clock is CLOCK_MONOTONIC on Linux: one clock for every process on the machine, so the
  // ranks' files line up when opened together.
  const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::microseconds>(since_epoch).count();
}

void complete(std::string name, std::string category, std::string track, int64_t start_us, int64_t end_us) {
  Recorder& r = recorder();
  if (!r.enabled.load(std::memory_order_relaxed)) return;
  Span span{std::move(name), std::move(category), std::move(track), start_us, end_us};
  std::lock_guard lock(r.mutex);
  r.spans.push_back(std::move(span));
}

void defer(std::function<std::vector<Span>()> resolve) {
  Recorder& r = recorder();
  if (!r.enabled.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(r.mutex);
  r.deferred.push_back(std::move(resolve));
}

Scope::Scope(std::string name, std::string category, std::string track) : active_(enabled()) {
  if (!active_) return;
  name_ = std::move(name);
  category_ = std::move(category);
  track_ = std::move(track);
  start_us_ = now_us();
}

Scope::~Scope() {
  if (active_) complete(std::move(name_), std::move(category_), std::move(track_), start_us_, now_us());
}

std::vector<Span> spans() {
  Recorder& r = recorder();
  resolve_deferred(r);
  std::lock_guard lock(r.mutex);
  return r.spans;
}

void write(const std::string& path) {
  Recorder& r = recorder();
  resolve_deferred(r);
  int rank = 0;
  std::vector<Span> copy;  // rendered outside the lock, so recording threads do not wait on it
  {
    std::lock_guard lock(r.mutex);
    rank = r.rank;
    copy = r.spans;
  }
  const std::string json = trace_json(rank, copy);
  try {
    write_file_atomic(path, json);
  } catch (const Error& e) {
    // The message already names the path, the system's reason and the fix; say who was writing.
    throw Error("trace::write: " + std::string(e.what()));
  }
}

}  // namespace octet::trace
