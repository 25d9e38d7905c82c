// convnets::Error: the one exception type for user-facing failures (bad flag, bad file, bad layer).
#pragma once

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace convnets {

// What kind of failure an Error is, for callers that map it onto their own
// error types (the Python package: ValueError, FileNotFoundError, OSError).
enum class ErrorKind {
  Invalid,   // a bad value, flag, file content or layer
  NotFound,  // a path that does not exist
  Io,        // a system call that failed on something that exists (permissions, disk full, ...)
};

// A user error carries what went wrong (naming the file, flag or layer) and,
// separately, what to do about it, so the CLI can print both without a stack trace.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string hint = {}, ErrorKind kind = ErrorKind::Invalid)
      : std::runtime_error(what), hint_(std::move(hint)), kind_(kind) {}
  const std::string& hint() const { return hint_; }
  ErrorKind kind() const { return kind_; }

 private:
  std::string hint_;
  ErrorKind kind_;
};

// The kind of a failed system call's errno: a missing path is NotFound.
inline ErrorKind errno_kind(int err) { return err == ENOENT || err == ENOTDIR ? ErrorKind::NotFound : ErrorKind::Io; }

// "cannot open 'PATH': No such file or directory": a failed system call, right after it.
inline std::string system_error(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

// That message as an Error of errno's kind. `err` defaults to errno as the
// call site sees it, before anything here can change it.
class SystemError : public Error {
 public:
  SystemError(const std::string& what, const std::string& path, int err = errno)
      : Error(what + " '" + path + "': " + std::strerror(err), {}, errno_kind(err)) {}
};

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

// Throws "NAME 'value': expected a | b | c" unless `value` is one of `choices`
// (NAME as the caller spells the option: a flag, or a keyword argument).
inline void check_choice(const std::string& name, const std::string& value,
                         std::initializer_list<const char*> choices) {
  for (const char* c : choices) {
    if (value == c) return;
  }
  throw Error(name + " '" + value + "': expected " + join(choices, " | "));
}

}  // namespace convnets
