/* A preloaded library that prints the native frames of a crash: gpu.sh runs its steps with it, because the GPU
 * machine has no gdb and a segfault there otherwise says only "exit 139".
 *
 * Each frame is printed as "crash-frame FILE OFFSET SYMBOL" (OFFSET from the file's load address), which gpu.sh
 * turns into function names with addr2line. backtrace() and fprintf are not async-signal-safe: acceptable in a
 * process that is dying anyway, and the frames are what the next session needs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static void print_frames(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  fprintf(stderr, "crash-frames: signal %d (%s), %d frames\n", sig, strsignal(sig), n);
  for (int i = 0; i < n; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) && info.dli_fname) {
      fprintf(stderr, "crash-frame %s 0x%lx %s\n", info.dli_fname,
              (unsigned long)((const char*)frames[i] - (const char*)info.dli_fbase), info.dli_sname ? info.dli_sname : "?");
    }
  }
  fflush(stderr);
  signal(sig, SIG_DFL);  /* the default action (a core, the 128 + signal exit status) follows */
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  const int signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
  for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; ++i) signal(signals[i], print_frames);
}
