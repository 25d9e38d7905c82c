// Fuzz target: the dataset index readers on arbitrary files: IDX image and
// label files (raw and gzip, Fashion-MNIST's format) and PaddleClas list files,
// then every sample's load.
#include "data/dataset.h"
#include "fuzz_input.h"

#include <algorithm>

using namespace convnets;

namespace {
fuzz::MemFile images("images"), labels("labels");
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Params p(data, size);
  const int mode = p.byte() % 2;
  try {
    data::DatasetPtr ds;
    if (mode == 0) {
      // The images file, then the labels file: the split point is a parameter.
      const std::size_t split = p.size() ? p.u16() % (p.size() + 1) : 0;
      images.write(p.data(), std::min(split, p.size()));
      labels.write(p.data() + std::min(split, p.size()), p.size() - std::min(split, p.size()));
      ds = data::idx_files(images.path(), labels.path());
    } else {
      images.write(p.data(), p.size());
      ds = data::list_file(images.path(), "/nonexistent-root");
    }
    data::SampleData s;
    for (std::size_t i = 0; i < std::min<std::size_t>(ds->size(), 64); ++i) {
      (void)ds->label(i);
      (void)ds->name(i);
      try {
        ds->load(i, s);
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
