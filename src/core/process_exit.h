// How convnets' executables end: output flushed, then straight out without static destructors.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace convnets {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

// LibTorch's static registrations (every operator's dispatch entries and
// schemas) are torn down one by one by exit(): 0.13 s of the 0.46 s that
// `convnets --version` took on the 2-core VM, in every process, and the test
// suite starts about 600 of them. The kernel frees memory and closes files
// faster, as clang does for itself (-disable-free). What must outlive a
// command is written by the command before it returns (checkpoints, logs and
// reports are closed in scope), so only the stdio buffers remain: flushed here.
// Sanitizer builds return normally, so LeakSanitizer's exit-time check and
// the static destructors themselves stay under test there.
// main's last statement: `return convnets::finish(run(...))`.
inline int finish(int code) {
  if (kSanitizedBuild) return code;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace convnets
