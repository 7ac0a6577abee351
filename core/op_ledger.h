#pragma once
// The op ledger: what a piece of work asks the kernels to do, counted where both devices share the
// code (the entry points in kernels/*.h and Tensor's own copies, casts and fills), so the counts are
// the same on the CPU and on a GPU. Per op name it records the calls, the bytes read and written
// (whole input and output tensors, at their storage dtype), and the matrix-product FLOPs (2 per
// multiply-add; element-wise arithmetic counts 0: it is bounded by its bytes).
//
//   OpLedger ledger;             // records on this thread while alive
//   train_step();
//   for (auto& [name, t] : ledger.ops()) ...   // or ledger.print(...)
//
// Only the outermost entry point on the stack records: what linear_forward does inside (a GEMM, a
// widening copy on the CPU) is linear_forward's business, counted once as linear_forward's bytes.
// That is what keeps the ledger device-independent, since the backends differ exactly there.
// With no ledger alive an entry point costs one thread-local load.
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>

namespace octet {

class Tensor;

enum class OpClass {
  kMatmul,  // GEMMs and attention: the FLOPs
  kMemory,  // everything else: element-wise, reductions, normalisation, copies, casts, the optimizer
};

struct OpTally {
  OpClass op_class = OpClass::kMemory;
  int64_t calls = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  double flops = 0;
  int64_t bytes() const { return bytes_read + bytes_written; }
  OpTally& operator+=(const OpTally& other);
};

using OpTallies = std::map<std::string, OpTally>;

// Arithmetic on ledgers, for per-block figures: a − b op by op (ops left with nothing dropped), and
// base + times·extra.
OpTallies ledger_difference(const OpTallies& a, const OpTallies& b);
OpTallies ledger_plus(OpTallies base, const OpTallies& extra, int64_t times = 1);

// A table, one line per op, matrix-product ops first, then the rest by traffic: calls as counted,
// MB read, MB written and GFLOP divided by `per` (images, say), and each memory op's share of the
// memory ops' bytes; then the two classes' sums.
std::string ledger_table(const OpTallies& ops, double per = 1.0);

class OpLedger {
 public:
  OpLedger();  // starts recording on the calling thread; a nested ledger takes over until it ends
  ~OpLedger();
  OpLedger(const OpLedger&) = delete;
  OpLedger& operator=(const OpLedger&) = delete;

  const std::map<std::string, OpTally>& ops() const { return ops_; }
  std::string table(double per = 1.0) const { return ledger_table(ops_, per); }
  OpTally total() const;
  OpTally total(OpClass op_class) const;
  // The tally of one op name (all zero when it never ran).
  OpTally op(const std::string& name) const;

  void record(const char* name, OpClass op_class, int64_t bytes_read, int64_t bytes_written, double flops);

  // The ledger recording on this thread, or null.
  static OpLedger* current();

 private:
  OpLedger* previous_;
  std::map<std::string, OpTally> ops_;
};

// Put at the top of a kernel entry point. It records one call of `name` when it is the outermost
// entry point on this thread and a ledger is recording; say what the call reads and writes with
// read(), write() and flops() (cheap no-ops otherwise: check counting() before costly sums).
class LedgerOp {
 public:
  explicit LedgerOp(const char* name, OpClass op_class = OpClass::kMemory);
  ~LedgerOp();
  LedgerOp(const LedgerOp&) = delete;
  LedgerOp& operator=(const LedgerOp&) = delete;

  bool counting() const { return ledger_ != nullptr; }
  LedgerOp& read(const Tensor& t);
  LedgerOp& read(std::initializer_list<const Tensor*> tensors);
  LedgerOp& write(const Tensor& t);
  LedgerOp& read_bytes(int64_t bytes);
  LedgerOp& write_bytes(int64_t bytes);
  LedgerOp& flops(double f);

 private:
  const char* name_;
  OpClass op_class_;
  OpLedger* ledger_;  // null unless this call records
  int64_t read_ = 0, written_ = 0;
  double flops_ = 0;
};

}  // namespace octet
