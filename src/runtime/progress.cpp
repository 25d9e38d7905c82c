#include "runtime/progress.h"

#include <unistd.h>

#include <cstdio>

namespace convnets::runtime {
namespace {

std::string duration(double s) {
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  }
  return buf;
}

}  // namespace

Progress::Progress(std::string phase, std::int64_t total, std::int64_t print_every, bool terminal, std::int64_t first)
    : phase_(std::move(phase)), total_(total), every_(print_every), terminal_(terminal), first_(first),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

bool Progress::stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

void Progress::update(std::int64_t done, double images_per_s, const std::string& extra) {
  const auto now = std::chrono::steady_clock::now();
  const bool last = done == total_;
  if (terminal_) {
    // Redraw at most 10 times a second: the terminal must not slow training.
    if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else if (done % every_ != 0 && !last) {
    return;
  }
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double per_step = done > first_ ? elapsed / static_cast<double>(done - first_) : 0.0;
  const double eta = per_step * static_cast<double>(total_ - done);
  if (terminal_) {
    std::printf("\r\033[K%s %lld/%lld  %.0f img/s  %s  ETA %s", phase_.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), images_per_s, extra.c_str(), duration(eta).c_str());
  } else {
    std::printf("%s %lld/%lld  %.0f img/s  %s  ETA %s\n", phase_.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), images_per_s, extra.c_str(), duration(eta).c_str());
  }
  std::fflush(stdout);
}

void Progress::finish(const std::string& summary) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::printf(terminal_ ? "\r\033[K%s  %s  (%s)\n" : "%s  %s  (%s)\n", phase_.c_str(), summary.c_str(),
              duration(elapsed).c_str());
  std::fflush(stdout);
}

}  // namespace convnets::runtime
