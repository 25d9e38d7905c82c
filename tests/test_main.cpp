// GoogleTest entry point shared by the C++ test executables.
#include "core/process_exit.h"
#include "core/threads.h"

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  convnets::configure_threads(0);
  return convnets::finish(RUN_ALL_TESTS());
}
