// convnets::Error: the one exception type for user-facing failures (bad flag, bad file, bad layer).
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace convnets {

// A user error carries what went wrong (naming the file, flag or layer) and,
// separately, what to do about it, so the CLI can print both without a stack trace.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string hint = {})
      : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// "cannot open 'PATH': No such file or directory": a failed system call, right after it.
inline std::string system_error(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

// "a, b, c": for error messages that list the valid choices.
template <typename Range>
std::string join(const Range& items, const std::string& sep = ", ") {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

}  // namespace convnets
