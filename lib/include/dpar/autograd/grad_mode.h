#pragma once

namespace dpar {

// Whether ops record autograd history on this thread (like torch.no_grad()).
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: disables gradient recording in its scope, restores the previous mode after.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace dpar
