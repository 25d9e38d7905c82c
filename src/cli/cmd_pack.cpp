// `convnets pack`: any data source convnets reads, written as WebDataset tar shards with DALI index files.
#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
#include "data/pack.h"
#include "data/shards.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

namespace fs = std::filesystem;

namespace convnets::cli {
namespace {

struct PackArgs {
  std::string data, output, split;
  std::uint64_t shard_size = std::uint64_t(256) << 20;
  std::uint64_t seed = 0;
  std::int64_t max_images = 0;
  bool shuffle = false, quiet = false, json = false;
};

std::string megabytes(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

void run(const PackArgs& a) {
  std::vector<std::string> splits;
  if (!a.split.empty()) {
    splits = {a.split};
  } else if (data::has_splits(a.data)) {
    splits = {"train", "val"};
  } else {
    splits = {"train"};
  }
  // Nothing already written is replaced: an older pack's extra shards would
  // otherwise be read as part of this one.
  std::error_code ec;
  if (fs::is_directory(a.output, ec)) {
    for (const auto& split : splits) {
      std::vector<std::string> existing;
      for (const auto& e : fs::directory_iterator(a.output, ec)) {
        const std::string f = e.path().filename().string();
        if (f.rfind(split + "-", 0) == 0 && f.size() > 4 && f.compare(f.size() - 4, 4, ".tar") == 0) existing.push_back(f);
      }
      if (!existing.empty())
        throw Error(a.output + " already holds " + std::to_string(existing.size()) + " " + split + "-*.tar shard(s)",
                    "pack into a new folder, or remove the old shards first");
    }
  }
  // Every split is listed before anything is written: a source whose splits
  // disagree on the classes fails without leaving half a pack.
  std::vector<data::DatasetPtr> sources;
  for (const auto& split : splits)
    sources.push_back(data::head(data::open_dataset(a.data, split), static_cast<std::size_t>(a.max_images)));
  for (std::size_t k = 1; k < sources.size(); ++k)
    if (sources[k]->classes() != sources[0]->classes())
      throw Error(a.data + ": the " + splits[k] + " split has " + std::to_string(sources[k]->num_classes()) +
                      " classes that differ from the " + std::to_string(sources[0]->num_classes()) + " of " + splits[0],
                  "both splits need the same class folders");
  fs::create_directories(a.output, ec);
  if (ec) throw Error(a.output + ": cannot create the output folder: " + ec.message());
  data::write_class_names(sources[0]->classes(), a.output);

  data::PackOptions o;
  o.output = a.output, o.shard_size = a.shard_size, o.shuffle = a.shuffle, o.seed = a.seed;
  if (!a.quiet && !a.json) o.progress = [](const std::string& line) { std::cout << "pack: wrote " << line << std::endl; };
  nlohmann::json report = nlohmann::json::object();
  for (std::size_t k = 0; k < splits.size(); ++k) {
    if (!a.json) std::cout << "pack: " << splits[k] << " from " << sources[k]->description() << std::endl;
    const auto s = data::pack_split(*sources[k], splits[k], o);
    report[splits[k]] = {{"shards", s.shards}, {"samples", s.samples}, {"bytes", s.bytes}, {"skipped", s.skipped}};
    if (a.json) continue;
    std::cout << "pack: " << splits[k] << ": " << s.shards.size() << " shard" << (s.shards.size() == 1 ? "" : "s")
              << ", " << s.samples << " samples, " << megabytes(s.bytes) << " in " << a.output << "/" << splits[k]
              << "-{000000.." << std::string(6 - std::min<std::size_t>(6, std::to_string(s.shards.size() - 1).size()), '0')
              << s.shards.size() - 1 << "}.tar, " << s.skipped.size() << " skipped\n";
    for (std::size_t i = 0; i < s.skipped.size() && i < 20; ++i) std::cout << "  skipped " << utf8_escaped(s.skipped[i]) << '\n';
    if (s.skipped.size() > 20) std::cout << "  ... and " << s.skipped.size() - 20 << " more (--json lists all)\n";
  }
  if (a.json) std::cout << dump_json(report, 2) << '\n';
}

}  // namespace

void add_pack_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "pack", "Write a dataset as WebDataset tar shards (+ DALI index files) for train, eval and bench data");
  auto a = std::make_shared<PackArgs>();
  cmd->add_option("DATA", a->data, "what to pack: an image folder, a train/val root, a list file, an IDX folder, shards")
      ->required();
  cmd->add_option("-o,--output", a->output, "the folder the shards go to (SPLIT-NNNNNN.tar, .idx, classes.txt)")->required();
  cmd->add_option("--shard-size", a->shard_size, "bytes per shard, with units (default 256MB)")
      ->transform(CLI::AsSizeValue(true));
  cmd->add_option("--split", a->split, "pack only this split (default: train and val when DATA has both, else train)")
      ->check(CLI::IsMember({"train", "val"}));
  cmd->add_flag("--shuffle", a->shuffle, "write the samples in a seeded random order, so that each shard mixes classes");
  cmd->add_option("--seed", a->seed, "seed of --shuffle");
  cmd->add_option("--max-images", a->max_images, "pack only the first N samples of each split (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--quiet", a->quiet, "no line per shard written");
  cmd->add_flag("--json", a->json, "print the summary as JSON (every skipped file with its reason)");
  cmd->callback([a] { run(*a); });
}

}  // namespace convnets::cli
