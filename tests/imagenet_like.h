// Where the ImageNet-like JPEG set is (scripts/make_imagenet_like.py, run by the imagenet_like_data CTest fixture).
#pragma once

#include <cstdlib>
#include <string>

// Empty when the fixture did not set CONVNETS_IMAGENET_LIKE: tests then skip and say so.
inline std::string imagenet_like() {
  const char* env = std::getenv("CONVNETS_IMAGENET_LIKE");
  return env ? env : "";
}
