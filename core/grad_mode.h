#pragma once
// Whether differentiable operations record a graph, per thread. It lives in core (as in PyTorch's
// c10) because core's own tensor methods consult it; the guards users reach for are re-exported
// from autograd/.
namespace octet {

struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Scope in which no graph is recorded: evaluation, optimizer steps, backward closures.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Scope that turns recording back on inside a NoGradGuard.
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace octet
