// `convnets --fork-server`: runs command lines sent on stdin, each in a child forked from one loaded process.
#pragma once

namespace convnets::cli {

// Each `convnets` process spends about 0.3 s of CPU before main() (loading and
// registering LibTorch's operators), which a test suite that starts it
// several hundred times pays again and again. A fork of a process that has
// done exactly that and nothing else starts where a fresh process would be
// at main(), in milliseconds: the Chrome/Android "zygote". The test suite's
// helper (tests/python/runner.py) starts one per test process.
//
// Protocol, one JSON object per line; every string is bytes, each byte sent as
// the character of the same code point (Latin-1). Request on stdin:
//   {"argv": [...], "env": {"NAME": "value", ...}, "cwd": DIR,
//    "stdin": PATH, "stdout": PATH, "stderr": PATH}
// Replies on stdout: {"pid": N} once the child runs, then {"returncode": R}
// when it has ended (R: its exit status, or -SIGNAL, as Python's subprocess
// reports it). A malformed request gets {"error": "..."} and no child. The
// server ends at the end of its input.
//
// The child replaces its whole environment with `env` and its standard
// streams with the three files, then runs `run(argc, argv)` as main() would.
// Settings that libraries read while loading (LD_*, MALLOC_*, OMP_* read by
// libgomp, GLIBC_TUNABLES) stay the server's: a caller that changes those
// starts a real process instead.
int serve_forks(int (*run)(int argc, char** argv));

}  // namespace convnets::cli
