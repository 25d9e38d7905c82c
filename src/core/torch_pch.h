// Precompiled header: the LibTorch C++ API, which every heavy translation unit needs.
#pragma once
#include <torch/torch.h>
