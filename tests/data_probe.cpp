// data_probe: a thin command-line window onto the codec and transforms, so the Python tests can compare them with PIL and torchvision.
#include "codec/jpeg.h"
#include "codec/png.h"
#include "data/sampler.h"
#include "data/transforms.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

using namespace convnets;

namespace {

std::vector<std::uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_ppm(const std::string& path, const codec::ImageView& v) {
  std::ofstream out(path, std::ios::binary);
  out << "P6\n" << v.width << ' ' << v.height << "\n255\n";
  for (int y = 0; y < v.height; ++y) out.write(reinterpret_cast<const char*>(v.row(y)), std::streamsize(v.width) * 3);
}

data::SampleData sample(const std::string& path) {
  data::SampleData s;
  s.name = path;
  s.bytes = read_all(path);
  return s;
}

// Every command writes its result to the file named last.
const char* kUsage =
    "usage: data_probe decode FILE OUT.ppm\n"
    "       data_probe region FILE X Y W H OUT.ppm\n"
    "       data_probe eval FILE SIZE CROP_RATIO OUT.ppm\n"
    "       data_probe crop FILE TOP LEFT H W SIZE FLIP DCT PIL_ORDER OUT.ppm\n"
    "       data_probe rrc WIDTH HEIGHT COUNT SEED SCALE_MIN OUT.txt\n"
    "       data_probe sampler N WORLD RANK SEED EPOCH SHUFFLE DROP_TAIL OUT.txt\n"
    "       data_probe batch   (one command per line on stdin: loading LibTorch once, not per command)\n";

void run(const std::vector<std::string>& a) {
  const int argc = static_cast<int>(a.size());
  const std::string cmd = argc > 1 ? a[1] : "";
  auto arg = [&](int i) { return a[i]; };
  auto num = [&](int i) { return std::atoi(a[i].c_str()); };
  if (cmd == "decode" && argc == 4) {
    const auto bytes = read_all(arg(2));
    codec::Image img;
    if (codec::sniff_format(bytes.data(), bytes.size()) == codec::ImageFormat::Png)
      codec::decode_png(bytes.data(), bytes.size(), arg(2), img);
    else
      img = codec::decode_jpeg(bytes.data(), bytes.size(), arg(2));
    write_ppm(arg(3), img.view());
  } else if (cmd == "region" && argc == 8) {
    const auto bytes = read_all(arg(2));
    codec::JpegDecoder d;
    d.open(bytes.data(), bytes.size(), arg(2));
    write_ppm(arg(7), d.decode(8, {num(3), num(4), num(5), num(6)}));
  } else if (cmd == "eval" && argc == 6) {
    const data::Transform t(data::TransformOptions::eval(num(3), std::atof(a[4].c_str())));
    data::Workspace ws;
    std::vector<std::uint8_t> out(std::size_t(t.size()) * t.size() * 3);
    data::Rng rng(0);
    t.apply(sample(arg(2)), rng, ws, out.data(), nullptr);
    write_ppm(arg(5), {out.data(), t.size(), t.size(), 3, std::ptrdiff_t(t.size()) * 3});
  } else if (cmd == "crop" && argc == 12) {
    auto o = data::TransformOptions::train(num(7));
    o.dct_scaling = num(9) != 0;
    o.pil_exact = num(10) != 0;
    const data::Transform t(o);
    data::Workspace ws;
    std::vector<std::uint8_t> out(std::size_t(t.size()) * t.size() * 3);
    t.apply_crop(sample(arg(2)), {num(3), num(4), num(5), num(6)}, num(8) != 0, ws, out.data(), nullptr);
    write_ppm(arg(11), {out.data(), t.size(), t.size(), 3, std::ptrdiff_t(t.size()) * 3});
  } else if (cmd == "rrc" && argc == 8) {
    data::RandomResizedCropParams p;
    p.scale_min = std::atof(a[6].c_str());
    std::ofstream out(arg(7));
    for (int k = 0; k < num(4); ++k) {
      data::Rng rng(std::strtoull(a[5].c_str(), nullptr, 10), 0, k);
      const auto b = data::random_resized_crop_box(num(2), num(3), p, rng);
      out << b.top << ' ' << b.left << ' ' << b.height << ' ' << b.width << '\n';
    }
  } else if (cmd == "sampler" && argc == 10) {
    data::ShardOptions o;
    o.world_size = num(3);
    o.rank = num(4);
    o.seed = std::strtoull(a[5].c_str(), nullptr, 10);
    o.shuffle = num(7) != 0;
    o.drop_tail = num(8) != 0;
    std::ofstream out(arg(9));
    for (auto i : data::shard_indices(std::size_t(num(2)), o, num(6))) out << i << ' ';
  } else {
    throw Error(std::string("bad command line\n") + kUsage);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 2 && std::string(argv[1]) == "batch") {
    std::string line;
    while (std::getline(std::cin, line)) {
      std::istringstream words(line);
      std::vector<std::string> a{argv[0]};
      for (std::string w; words >> w;) a.push_back(w);
      if (a.size() > 1) run(a);
    }
  } else {
    run(std::vector<std::string>(argv, argv + argc));
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "data_probe: " << e.what() << '\n';
  return 1;
}
