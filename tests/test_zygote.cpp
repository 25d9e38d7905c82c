// The zygote's probe case (tests/python/test_zygote.py runs it, directly and through the zygote, and compares).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <unistd.h>

// Disabled, so only a run that names it runs it; gtest_discover_tests leaves it out (TEST_FILTER).
TEST(DISABLED_ZygoteProbe, DoesWhatTheEnvironmentSays) {
  const char* what = std::getenv("CONVNETS_ZYGOTE_PROBE");
  ASSERT_NE(what, nullptr) << "CONVNETS_ZYGOTE_PROBE is unset: tests/python/test_zygote.py sets it";
  std::string line;
  std::getline(std::cin, line);
  char cwd[4096] = {};
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  const char* mark = std::getenv("CONVNETS_ZYGOTE_MARK");
  std::printf("probe pid=%d ppid=%d cwd=%s stdin=%s mark=%s\n", static_cast<int>(::getpid()),
              static_cast<int>(::getppid()), cwd, line.c_str(), mark == nullptr ? "(unset)" : mark);
  std::fflush(stdout);
  const std::string w = what;
  if (w == "fail") {
    ADD_FAILURE() << "asked to fail";
  } else if (w == "abort") {
    std::abort();
  } else if (w == "sleep") {
    std::ofstream(std::getenv("CONVNETS_ZYGOTE_PID_FILE")) << ::getpid() << '\n';
    std::this_thread::sleep_for(std::chrono::seconds(60));
  } else {
    ASSERT_EQ(w, "pass");
  }
}
