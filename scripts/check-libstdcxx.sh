#!/usr/bin/env bash
# Fails naming each binary that carries its own static copy of libstdc++ instead of linking the shared one.
#
#   scripts/check-libstdcxx.sh BINARY...
#
# Why: a module with libstdc++.a's objects inside runs them against the process's shared libstdc++ (Python's,
# LibTorch's); on the GPU machine the two copies' std::locale state disagreed and the first number formatted
# crashed (docs/history/gpu-run-1-2026-11-26-h200.md). std::locale::_S_initialize is defined only inside
# libstdc++ itself, so a binary that defines it holds a copy.
set -euo pipefail
(($#)) || { sed -n '4p' "$0" >&2; exit 2; }
bad=0
for f in "$@"; do
  [[ -f $f ]] || { echo "check-libstdcxx: $f: no such file (expected a built binary)" >&2; bad=1; continue; }
  # Read whole, not piped into grep -q: under pipefail nm's SIGPIPE would read as "not found".
  symbols=$(nm -D --defined-only "$f" 2>/dev/null; nm --defined-only "$f" 2>/dev/null || true)
  if grep -q ' _ZNSt6locale13_S_initializeEv$' <<<"$symbols"; then
    echo "check-libstdcxx: $f defines std::locale::_S_initialize: a static libstdc++ was linked into it" \
         "(expected the shared libstdc++.so.6; see CONVNETS_LIBSTDCXX in CMakeLists.txt)" >&2
    bad=1
  else
    echo "check-libstdcxx: $f links the shared libstdc++"
  fi
done
exit $bad
