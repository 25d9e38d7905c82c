#include "runtime/tuner.h"

#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <sstream>

namespace convnets::runtime {
namespace {

constexpr const char* kFormat = "convnets tuning cache 1";

std::optional<models::FusionPath> path_of(const std::string& name) {
  for (const auto p : models::all_fusion_paths()) {
    if (name == models::path_name(p)) return p;
  }
  return std::nullopt;
}

nlohmann::json device_json(const TuningDevice& d) {
  return {{"gpu", d.gpu}, {"sms", d.sms}, {"cudnn", d.cudnn}, {"convnets", d.convnets}};
}

TuningDevice device_of(const nlohmann::json& j) {
  TuningDevice d;
  d.gpu = j.at("gpu").get<std::string>();
  d.sms = j.at("sms").get<int>();
  d.cudnn = j.at("cudnn").get<long>();
  d.convnets = j.at("convnets").get<std::string>();
  return d;
}

nlohmann::json choice_json(const ShapeChoice& c) {
  nlohmann::json ms = nlohmann::json::object(), refused = nlohmann::json::object();
  for (const auto& cand : c.candidates) {
    if (cand.refusal.empty()) ms[models::path_name(cand.path)] = cand.ms;
    else refused[models::path_name(cand.path)] = cand.refusal;
  }
  return {{"path", models::path_name(c.chosen)}, {"blocks", c.blocks}, {"ms", ms}, {"refused", refused}};
}

ShapeChoice choice_of(const std::string& key, const nlohmann::json& j) {
  ShapeChoice c;
  c.key = key;
  const auto chosen = path_of(j.at("path").get<std::string>());
  if (!chosen) throw Error("an unknown path '" + j.at("path").get<std::string>() + "'");
  c.chosen = *chosen;
  c.blocks = j.value("blocks", std::vector<std::string>{});
  // Held here: items() of a temporary would outlive it.
  const auto times = j.value("ms", nlohmann::json::object()), refusals = j.value("refused", nlohmann::json::object());
  for (const auto& [name, ms] : times.items()) {
    if (const auto p = path_of(name)) c.candidates.push_back({*p, ms.get<double>(), "", "", true});
  }
  for (const auto& [name, why] : refusals.items()) {
    if (const auto p = path_of(name)) c.candidates.push_back({*p, 0, why.get<std::string>(), "", true});
  }
  c.from_cache = true;
  return c;
}

std::string ms_text(double ms) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(ms < 10 ? 3 : 1) << ms;
  return s.str();
}

// "layer1.1-2", "layer2.0", "layer3.1, layer4.2": block names, a stage's run of consecutive blocks folded.
std::string block_names(const std::vector<std::string>& names) {
  if (names.size() == 1) return names[0];
  const auto dot = names.front().rfind('.');
  const auto stage = names.front().substr(0, dot + 1);
  bool run = dot != std::string::npos;
  for (std::size_t i = 0; run && i < names.size(); ++i) {
    run = names[i].rfind(stage, 0) == 0 && names[i].substr(dot + 1) == std::to_string(std::stoi(names[0].substr(dot + 1)) + static_cast<int>(i));
  }
  if (run) return names.front() + "-" + names.back().substr(dot + 1);
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::string TuningDevice::str() const {
  std::ostringstream s;
  s << gpu << " (" << sms << " SMs), cuDNN " << cudnn << ", convnets " << convnets;
  return s.str();
}

std::optional<models::FusionPath> fastest(const std::vector<Candidate>& candidates, bool require_numerics,
                                          double tie) {
  const Candidate* best = nullptr;
  for (const auto& c : candidates) {
    if (!c.refusal.empty() || (require_numerics && !c.numerics_ok)) continue;
    if (!best || c.ms < best->ms) best = &c;
  }
  if (!best) return std::nullopt;
  // The simplest path within the tie of the fastest: a difference inside the timer's noise buys no complexity.
  for (const auto p : models::all_fusion_paths()) {
    for (const auto& c : candidates) {
      if (c.path == p && c.refusal.empty() && (!require_numerics || c.numerics_ok) && c.ms <= best->ms * (1 + tie)) {
        return p;
      }
    }
  }
  return best->path;
}

TuningCache::TuningCache(std::string path, TuningDevice device) : path_(std::move(path)), device_(std::move(device)) {
  std::error_code ec;
  if (path_.empty() || !std::filesystem::exists(path_, ec)) return;
  try {
    const auto j = read_json_file(path_, "tuning cache");
    if (j.value("format", std::string()) != kFormat) {
      throw Error("its format is '" + j.value("format", std::string()) + "', expected '" + kFormat + "'");
    }
    for (const auto& entry : j.at("devices")) {
      const auto d = device_of(entry.at("device"));
      if (d == device_) {
        for (const auto& [key, choice] : entry.at("shapes").items()) mine_[key] = choice_of(key, choice);
      } else {
        others_.emplace_back(d, entry.at("shapes").dump());
      }
    }
  } catch (const std::exception& e) {
    readable_ = false;
    mine_.clear();
    others_.clear();
    note_ = "tuning cache " + path_ + " is unreadable (" + e.what() + "): not used, not overwritten; delete it or " +
            "pass --tuning-cache PATH";
  }
}

const ShapeChoice* TuningCache::find(const std::string& key) const {
  const auto it = mine_.find(key);
  return it == mine_.end() ? nullptr : &it->second;
}

void TuningCache::record(const ShapeChoice& choice) { mine_[choice.key] = choice; }

bool TuningCache::save() {
  if (path_.empty() || !readable_) return false;
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& [d, shapes] : others_) {
    devices.push_back({{"device", device_json(d)}, {"shapes", nlohmann::json::parse(shapes)}});
  }
  nlohmann::json shapes = nlohmann::json::object();
  for (const auto& [key, choice] : mine_) shapes[key] = choice_json(choice);
  devices.push_back({{"device", device_json(device_)}, {"shapes", shapes}});
  try {
    const auto folder = std::filesystem::path(path_).parent_path();
    if (!folder.empty()) std::filesystem::create_directories(folder);
    write_file_atomically(path_, dump_json(nlohmann::json{{"format", kFormat}, {"devices", devices}}, 1) + "\n");
  } catch (const std::exception& e) {
    note_ = std::string("the tuning cache was not written: ") + e.what();
    return false;
  }
  return true;
}

std::string TuningCache::stale() const {
  if (others_.empty()) return "";
  std::ostringstream s;
  for (std::size_t i = 0; i < others_.size(); ++i) {
    const auto n = nlohmann::json::parse(others_[i].second).size();
    s << (i ? "; " : "") << n << " shape" << (n == 1 ? "" : "s") << " measured on " << others_[i].first.str();
  }
  s << ": not this GPU or software (" << device_.str() << "), ignored";
  return s.str();
}

std::string default_tuning_cache() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return (std::filesystem::path(xdg) / "convnets" / "tuning.json").string();
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return (std::filesystem::path(home) / ".cache" / "convnets" / "tuning.json").string();
  }
  return "";
}

std::string shape_key(const models::FusionTunable& block, at::ScalarType dtype, bool channels_last) {
  std::ostringstream s;
  s << block.signature() << " | input ";
  const auto sizes = block.last_input_sizes();
  for (std::size_t i = 0; i < sizes.size(); ++i) s << (i ? "x" : "") << sizes[i];
  s << " | " << c10::toString(dtype) << (channels_last ? " nhwc" : " nchw");
  return s.str();
}

TuneReport tune(torch::nn::Module& model, const models::FusedBnContext& context, BlockTimer& timer,
                TuningCache* cache) {
  const auto t0 = std::chrono::steady_clock::now();
  TuneReport report;
  report.mode = context.mode;
  if (cache) report.cache_path = cache->path();
  const auto admitted = models::admitted_paths(context.mode);
  const bool automatic = context.mode == models::FusionMode::Auto;
  // Blocks of one key share one decision, made at the first of them.
  std::vector<std::pair<ShapeChoice, std::vector<models::FusionTunable*>>> groups;
  for (auto& [name, block] : models::tunable_blocks(model)) {
    if (block->last_input_sizes().empty()) {
      throw Error("the step tuner: block " + name + " has not run a training forward (its input shape is unknown)");
    }
    const auto key = shape_key(*block, context.dtype, context.channels_last);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first.key == key; });
    if (it == groups.end()) {
      ShapeChoice c;
      c.key = key;
      it = groups.insert(groups.end(), {c, {}});
    }
    it->first.blocks.push_back(name);
    it->second.push_back(block);
  }
  for (auto& [choice, blocks] : groups) {
    auto& first = *blocks.front();
    // What each admitted path is, before anything runs.
    std::vector<Candidate> candidates;
    std::vector<models::FusionPath> runnable;
    for (const auto p : admitted) {
      Candidate c;
      c.path = p;
      c.refusal = first.path_refusal(p, context);
      if (c.refusal.empty() && automatic) {
        if (const auto why = models::unverified(p, context.dtype); !why.empty()) c.refusal = "unverified: " + why;
      }
      if (c.refusal.empty()) runnable.push_back(p);
      candidates.push_back(std::move(c));
    }
    const ShapeChoice* hit = cache ? cache->find(choice.key) : nullptr;
    if (hit && std::find(runnable.begin(), runnable.end(), hit->chosen) != runnable.end()) {
      choice.candidates = hit->candidates;
      choice.chosen = hit->chosen;
      choice.from_cache = true;
      ++report.cached;
    } else if (runnable.size() <= 1) {
      // Nothing to choose between: no timing.
      choice.candidates = std::move(candidates);
      choice.chosen = runnable.empty() ? models::FusionPath::Unfused : runnable.front();
    } else {
      const auto timed = timer.time(first.module(), first, runnable, first.last_input_sizes(), context.dtype);
      for (auto& c : candidates) {
        for (const auto& t : timed) {
          if (t.path == c.path) c = t;
        }
      }
      choice.candidates = std::move(candidates);
      // A path that failed its numerics check is never taken over one that passed; a forced family whose every
      // path failed still runs (its note says so), auto then runs unfused.
      auto best = fastest(choice.candidates, true);
      if (!best && !automatic) best = fastest(choice.candidates, false);
      choice.chosen = best ? *best : automatic ? models::FusionPath::Unfused : runnable.front();
      ++report.timed;
      // A forced family's timings say nothing of the paths it left out: only auto's decisions are kept.
      if (cache && automatic) cache->record(choice);
    }
    for (const auto& c : choice.candidates) {
      if (c.path == choice.chosen && !c.numerics_ok) {
        choice.note = std::string(models::path_name(c.path)) + " is forced by --fusion " +
                      models::mode_name(context.mode) + " though its numerics differ: " + c.numerics;
      }
    }
    for (auto* b : blocks) b->set_path(choice.chosen);
    report.shapes.push_back(choice);
  }
  if (cache) {
    report.cache_note = cache->stale();
    if (!cache->note().empty()) report.cache_note += (report.cache_note.empty() ? "" : "; ") + cache->note();
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string TuneReport::describe() const {
  if (shapes.empty()) return "";
  std::ostringstream s;
  s << "--fusion " << models::mode_name(mode) << ": ";
  if (timed == 0 && cached == 0) {
    s << "nothing to time (one path admitted per block)";
  } else {
    s << timed << " block shape" << (timed == 1 ? "" : "s") << " timed in " << std::fixed << std::setprecision(1)
      << seconds << " s, " << cached << " from the cache";
    if (timed == 0) s << " (timed nothing)";
  }
  if (!cache_path.empty()) s << " (" << cache_path << ")";
  for (const auto& c : shapes) {
    s << "\n  " << block_names(c.blocks) << ": " << models::path_name(c.chosen);
    std::string timed_text, refused_text;
    for (const auto& cand : c.candidates) {
      if (cand.refusal.empty() && cand.ms > 0) {
        timed_text += (timed_text.empty() ? "" : ", ") + std::string(models::path_name(cand.path)) + " " +
                      ms_text(cand.ms) + (cand.numerics_ok ? "" : " (numerics: " + cand.numerics + ")");
      } else if (!cand.refusal.empty()) {
        refused_text += (refused_text.empty() ? "" : "; ") + std::string(models::path_name(cand.path)) + ": " +
                        cand.refusal;
      }
    }
    if (!timed_text.empty()) s << " (ms a forward+backward: " << timed_text << (c.from_cache ? ", cached" : "") << ")";
    if (!refused_text.empty()) s << "; not candidates: " << refused_text;
    if (!c.note.empty()) s << "; " << c.note;
  }
  if (!cache_note.empty()) s << "\n  " << cache_note;
  return s.str();
}

}  // namespace convnets::runtime
