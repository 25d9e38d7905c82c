// Limits on sizes read from untrusted files that are shared by several parsers (the others live beside their parser).
#pragma once

#include <cstdint>

namespace convnets {

// Classes a label or a classifier may have: far above ImageNet-21k's 21,841,
// and far below what would make a class-name list or a classifier layer a
// memory problem (a list-file label of 35,052,806 once meant 35 million names).
constexpr std::int64_t kMaxClasses = 1'000'000;

}  // namespace convnets
