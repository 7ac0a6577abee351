#pragma once
// A timeline of what one process did, written as a Chrome trace-event JSON file that Perfetto's
// trace viewer and chrome://tracing open. One file per rank: pid = rank, and one row (tid)
// per track: "compute" for forward and backward per module, "comm" for each collective from start
// to end, so overlap between them is visible.
//
//   trace::start(rank);                         // recording on
//   { trace::Scope s("forward blocks.0", "forward", "compute"); ... }
//   trace::complete("all_reduce(avg) 4.00 MB", "comm", "comm", start_us, end_us);
//   trace::write("trace.rank0.json");           // atomically; recording stays on
//
// While off (the default), every call returns at once after one relaxed atomic load. Recording is
// thread safe: a communication thread and the training thread may record at the same time.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace octet::trace {

struct Span {
  std::string name;
  std::string category;  // "forward", "backward", "comm", "step", ...
  std::string track;     // the row it is drawn on: "compute", "comm", "gpu compute", "gpu comm"
  int64_t start_us = 0;  // microseconds on now_us()'s clock
  int64_t end_us = 0;
};

// Turns recording on, for the process that is rank `rank` (the trace's pid), and clears what was
// recorded before.
void start(int rank = 0);
void stop();  // recording off; what was recorded stays until the next start()
bool enabled();

// Microseconds since an arbitrary fixed point of a monotonic clock (the same for every track).
int64_t now_us();

// A finished span.
void complete(std::string name, std::string category, std::string track, int64_t start_us, int64_t end_us);

// Spans whose times are only known later (CUDA events on a stream): `resolve` runs at write(),
// once, and returns them. It must not call back into trace.
void defer(std::function<std::vector<Span>()> resolve);

// Records [construction, destruction) as a span, when recording is on at construction.
class Scope {
 public:
  Scope(std::string name, std::string category, std::string track = "compute");
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool active_;
  std::string name_, category_, track_;
  int64_t start_us_ = 0;
};

// Everything recorded so far (deferred spans resolved), in recording order.
std::vector<Span> spans();
// Writes the trace-event JSON ({"traceEvents": [...]}: one "X" event per span, plus metadata naming
// the process "rank r" and each track) to `path`, atomically (a temporary file renamed into place).
void write(const std::string& path);

}  // namespace octet::trace
