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

// P6 for RGB, P5 for one channel.
void write_ppm(const std::string& path, const codec::ImageView& v) {
  std::ofstream out(path, std::ios::binary);
  out << (v.channels == 1 ? "P5\n" : "P6\n") << v.width << ' ' << v.height << "\n255\n";
  for (int y = 0; y < v.height; ++y)
    out.write(reinterpret_cast<const char*>(v.row(y)), std::streamsize(v.width) * v.channels);
}

// A binary PPM/PGM (P6 or P5, maxval 255) as PIL's Image.save writes it.
codec::Image read_ppm(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string magic;
  int w = 0, h = 0, maxval = 0;
  in >> magic >> w >> h >> maxval;
  in.get();
  if (!in || (magic != "P6" && magic != "P5") || maxval != 255)
    throw Error(path + ": expected a binary PPM or PGM (P6 or P5, maxval 255)");
  codec::Image img;
  img.width = w, img.height = h, img.channels = magic == "P6" ? 3 : 1;
  img.pixels.resize(std::size_t(w) * h * img.channels);
  in.read(reinterpret_cast<char*>(img.pixels.data()), std::streamsize(img.pixels.size()));
  if (!in) throw Error(path + ": truncated PPM");
  return img;
}

std::vector<double> numbers(const std::string& csv) {
  std::vector<double> v;
  std::stringstream s(csv);
  for (std::string x; std::getline(s, x, ',');) v.push_back(std::atof(x.c_str()));
  return v;
}

// One Pillow operation by name, as tests/python/test_augment.py calls it.
void pil_op(const std::string& op, const std::vector<double>& args, data::Resample r, const data::Fill& fill,
            data::ImageRef img) {
  std::vector<std::uint8_t> scratch;
  namespace pil = data::pil;
  if (op == "affine" && args.size() == 6) pil::affine(img, {args[0], args[1], args[2], args[3], args[4], args[5]}, r, fill, scratch);
  else if (op == "rotate") pil::rotate(img, args.at(0), r, fill, scratch);
  else if (op == "autocontrast") pil::auto_contrast(img);
  else if (op == "equalize") pil::equalize(img);
  else if (op == "invert") pil::invert(img);
  else if (op == "posterize") pil::posterize(img, static_cast<int>(args.at(0)));
  else if (op == "solarize") pil::solarize(img, args.at(0));
  else if (op == "solarize_add") pil::solarize_add(img, static_cast<int>(args.at(0)));
  else if (op == "color") pil::color(img, args.at(0), scratch);
  else if (op == "contrast") pil::contrast(img, args.at(0), scratch);
  else if (op == "brightness") pil::brightness(img, args.at(0), scratch);
  else if (op == "sharpness") pil::sharpness(img, args.at(0), scratch);
  else throw Error("augop: unknown op " + op);
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
    "       data_probe eval FILE SIZE CROP_RATIO [FILTER] OUT.ppm\n"
    "       data_probe crop FILE TOP LEFT H W SIZE FLIP DCT PIL_ORDER [FILTER] OUT.ppm\n"
    "       data_probe rrc WIDTH HEIGHT COUNT SEED SCALE_MIN OUT.txt\n"
    "       data_probe sampler N WORLD RANK SEED EPOCH SHUFFLE DROP_TAIL OUT.txt\n"
    "       data_probe augop IN.ppm OP ARGS RESAMPLE FILL OUT.ppm   (ARGS, FILL: comma-separated)\n"
    "       data_probe augtrace POLICY COUNT SEED SIZE OUT.txt\n"
    "       data_probe erase COUNT SEED SIZE PROB OUT.txt\n"
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
  } else if (cmd == "eval" && (argc == 6 || argc == 7)) {
    const auto filter = argc == 7 ? data::parse_filter(a[5], "FILTER") : data::Filter::Bilinear;
    const data::Transform t(data::TransformOptions::eval(num(3), std::atof(a[4].c_str()), filter));
    data::Workspace ws;
    std::vector<std::uint8_t> out(std::size_t(t.size()) * t.size() * 3);
    data::Rng rng(0);
    t.apply(sample(arg(2)), rng, ws, out.data(), nullptr);
    write_ppm(a.back(), {out.data(), t.size(), t.size(), 3, std::ptrdiff_t(t.size()) * 3});
  } else if (cmd == "crop" && (argc == 12 || argc == 13)) {
    auto o = data::TransformOptions::train(num(7));
    if (argc == 13) o.filter = data::parse_filter(a[11], "FILTER");
    o.dct_scaling = num(9) != 0;
    o.pil_exact = num(10) != 0;
    const data::Transform t(o);
    data::Workspace ws;
    std::vector<std::uint8_t> out(std::size_t(t.size()) * t.size() * 3);
    t.apply_crop(sample(arg(2)), {num(3), num(4), num(5), num(6)}, num(8) != 0, ws, out.data(), nullptr);
    write_ppm(a.back(), {out.data(), t.size(), t.size(), 3, std::ptrdiff_t(t.size()) * 3});
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
  } else if (cmd == "augop" && argc == 8) {
    codec::Image img = read_ppm(arg(2));
    const auto f = numbers(arg(6));
    const data::Resample r = arg(5) == "nearest"    ? data::Resample::Nearest
                             : arg(5) == "bicubic" ? data::Resample::Bicubic
                                                   : data::Resample::Bilinear;
    pil_op(arg(3), numbers(arg(4)), r,
           {std::uint8_t(f.at(0)), std::uint8_t(f.at(1)), std::uint8_t(f.at(2))},
           {img.pixels.data(), img.width, img.height, img.channels});
    write_ppm(arg(7), img.view());
  } else if (cmd == "augtrace" && argc == 7) {
    // The policy's choices on random images: one "op arg" line per applied op, "--" after each image.
    const data::Augmenter aug(data::parse_augment_policy(arg(2), "POLICY"), {124, 116, 104}, true,
                              data::Resample::Bilinear);
    const int n = num(5);
    std::vector<std::uint8_t> img(std::size_t(n) * n * 3), scratch;
    std::vector<data::Augmenter::Applied> trace;
    std::ofstream out(arg(6));
    for (int k = 0; k < num(3); ++k) {
      data::Rng rng(std::strtoull(a[4].c_str(), nullptr, 10), 0, k);
      for (auto& v : img) v = static_cast<std::uint8_t>(rng.next());
      trace.clear();
      aug.apply({img.data(), n, n, 3}, rng, scratch, &trace);
      for (const auto& t : trace) out << t.op << ' ' << t.arg << '\n';
      out << "--\n";
    }
  } else if (cmd == "erase" && argc == 7) {
    data::ErasingParams p;
    p.prob = std::atof(a[5].c_str());
    std::ofstream out(arg(6));
    for (int k = 0; k < num(2); ++k) {
      data::Rng rng(std::strtoull(a[3].c_str(), nullptr, 10), 0, k);
      data::EraseBox b;
      data::draw_erase_boxes(p, num(4), num(4), rng, &b);
      out << b.top << ' ' << b.left << ' ' << b.height << ' ' << b.width << '\n';
    }
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
