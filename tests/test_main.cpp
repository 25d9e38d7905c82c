// GoogleTest entry point shared by the C++ test executables, and their zygote (tests/zygote.h).
#include "core/process_exit.h"
#include "core/threads.h"
#include "zygote.h"

#include <gtest/gtest.h>

#include <cstring>

namespace {

int run_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  convnets::configure_threads(0);
  return RUN_ALL_TESTS();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--zygote") == 0) {
    return convnets::finish(convnets::testing::serve_zygote(argv[2], run_tests));
  }
  return convnets::finish(run_tests(argc, argv));
}
