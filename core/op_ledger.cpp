// The op ledger (core/op_ledger.h): a per-thread stack of ledgers and the outermost-call rule.
#include "core/op_ledger.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/tensor.h"

namespace octet {

namespace {

thread_local OpLedger* current_ledger = nullptr;
thread_local int entry_depth = 0;  // kernel entry points on this thread's stack

}  // namespace

OpTally& OpTally::operator+=(const OpTally& other) {
  calls += other.calls;
  bytes_read += other.bytes_read;
  bytes_written += other.bytes_written;
  flops += other.flops;
  return *this;
}

OpLedger::OpLedger() : previous_(current_ledger) { current_ledger = this; }
OpLedger::~OpLedger() { current_ledger = previous_; }

OpLedger* OpLedger::current() { return current_ledger; }

void OpLedger::record(const char* name, OpClass op_class, int64_t bytes_read, int64_t bytes_written, double flops) {
  OpTally& t = ops_[name];
  t.op_class = op_class;
  t.calls += 1;
  t.bytes_read += bytes_read;
  t.bytes_written += bytes_written;
  t.flops += flops;
}

OpTally OpLedger::total() const {
  OpTally sum;
  for (const auto& [name, t] : ops_) sum += t;
  return sum;
}

OpTally OpLedger::total(OpClass op_class) const {
  OpTally sum;
  sum.op_class = op_class;
  for (const auto& [name, t] : ops_) {
    if (t.op_class == op_class) sum += t;
  }
  return sum;
}

OpTally OpLedger::op(const std::string& name) const {
  const auto it = ops_.find(name);
  return it == ops_.end() ? OpTally{} : it->second;
}

OpTallies ledger_difference(const OpTallies& a, const OpTallies& b) {
  OpTallies d;
  for (const auto& [name, t] : a) {
    OpTally x = t;
    if (const auto it = b.find(name); it != b.end()) {
      x.calls -= it->second.calls;
      x.bytes_read -= it->second.bytes_read;
      x.bytes_written -= it->second.bytes_written;
      x.flops -= it->second.flops;
    }
    if (x.calls != 0 || x.bytes() != 0 || x.flops != 0) d[name] = x;
  }
  return d;
}

OpTallies ledger_plus(OpTallies base, const OpTallies& extra, int64_t times) {
  for (const auto& [name, t] : extra) {
    OpTally& s = base[name];
    s.op_class = t.op_class;
    for (int64_t i = 0; i < times; ++i) s += t;
  }
  return base;
}

std::string ledger_table(const OpTallies& ops, double per) {
  std::vector<std::pair<std::string, OpTally>> rows(ops.begin(), ops.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    if (a.second.op_class != b.second.op_class) return a.second.op_class == OpClass::kMatmul;
    return a.second.bytes() > b.second.bytes();
  });
  OpTally matmul, memory;
  for (const auto& [name, t] : rows) (t.op_class == OpClass::kMatmul ? matmul : memory) += t;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "  %-28s %8s %11s %11s %10s %7s\n", "op", "calls", "MB read", "MB written",
                "GFLOP", "share");
  out += line;
  const auto emit = [&](const std::string& name, const OpTally& t, bool share) {
    const double mb = 1e6 * per;
    std::snprintf(line, sizeof line, "  %-28s %8lld %11.3f %11.3f %10.4f", name.c_str(),
                  static_cast<long long>(t.calls), static_cast<double>(t.bytes_read) / mb,
                  static_cast<double>(t.bytes_written) / mb, t.flops / 1e9 / per);
    out += line;
    if (share && memory.bytes() > 0) {
      std::snprintf(line, sizeof line, " %6.1f%%", 100.0 * static_cast<double>(t.bytes()) / static_cast<double>(memory.bytes()));
      out += line;
    }
    out += "\n";
  };
  for (const auto& [name, t] : rows) emit(name, t, t.op_class == OpClass::kMemory);
  emit("= matmul ops (GEMM, attention)", matmul, false);
  emit("= memory ops (everything else)", memory, false);
  return out;
}

LedgerOp::LedgerOp(const char* name, OpClass op_class)
    : name_(name), op_class_(op_class), ledger_(entry_depth == 0 ? current_ledger : nullptr) {
  ++entry_depth;
}

LedgerOp::~LedgerOp() {
  --entry_depth;
  if (ledger_ != nullptr) ledger_->record(name_, op_class_, read_, written_, flops_);
}

LedgerOp& LedgerOp::read(const Tensor& t) {
  if (ledger_ != nullptr && t.defined()) read_ += static_cast<int64_t>(t.nbytes());
  return *this;
}
LedgerOp& LedgerOp::read(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) read(*t);
  return *this;
}
LedgerOp& LedgerOp::write(const Tensor& t) {
  if (ledger_ != nullptr && t.defined()) written_ += static_cast<int64_t>(t.nbytes());
  return *this;
}
LedgerOp& LedgerOp::read_bytes(int64_t bytes) {
  if (ledger_ != nullptr) read_ += bytes;
  return *this;
}
LedgerOp& LedgerOp::write_bytes(int64_t bytes) {
  if (ledger_ != nullptr) written_ += bytes;
  return *this;
}
LedgerOp& LedgerOp::flops(double f) {
  if (ledger_ != nullptr) flops_ += f;
  return *this;
}

}  // namespace octet
