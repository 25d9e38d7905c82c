// The GoogleTest executables' zygote: each CTest case runs in a child forked from one process that has loaded LibTorch.
#pragma once

#include <string>

namespace convnets::testing {

// CTest runs every GoogleTest case as a process of its own (gtest_discover_tests),
// and each spends about 0.35 s of CPU before main() loading and registering
// LibTorch's operators: 48 of the quick set's 534 test-seconds on the 2-core VM
// (docs/PERFORMANCE.md). `unit_tests --zygote SOCKET` pays that once and forks a
// child per case, the way `convnets --fork-server` does for the Python tests
// (src/cli/fork_server.h); this one listens on a Unix socket, because CTest
// starts each case as a separate process and runs two at a time.
//
// tests/zygote_client.cpp is the other end (CTest's command for each case,
// through the executables' CROSSCOMPILING_EMULATOR): it sends its argv, its
// working directory, its environment and its three standard streams
// (SCM_RIGHTS). The child takes those over and runs `run(argc, argv)` as
// main() would; the client exits with the child's status, or is killed with
// the child's signal. A client that goes away (CTest's timeout) takes its child
// with it.
//
// The server tells a client to run a fresh process instead (and it does) when
// the file the client names is not the one it loaded (a rebuild), or when
// the client's load-time variables (LD_*, OMP_*, MALLOC_*, ...) differ from the
// server's: those act while libraries load, which a fork has already done.
// It ends when told to stop, when its socket path is taken over by another
// server, or after `idle_seconds` without a connection.
int serve_zygote(const std::string& socket_path, int (*run)(int argc, char** argv), int idle_seconds = 900);

}  // namespace convnets::testing
