// `convnets report`: a run's DLLogger log turned into one self-contained HTML page with SVG charts.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace convnets::report {

struct RunLog {
  nlohmann::json parameters = nlohmann::json::object();   // merged PARAMETER entries
  std::vector<std::pair<double, nlohmann::json>> steps;    // (fractional epoch, data) of [epoch, iteration] entries
  std::vector<std::pair<int, nlohmann::json>> epochs;      // (epoch, data) of [epoch] entries
  nlohmann::json summary = nlohmann::json::object();       // the [] entry
};

// Reads "DLLL {...}" lines (other lines are ignored, as DLE's parsers do). A
// resumed run's repeated epochs keep the latest entry. Throws Error naming the
// file and line for malformed JSON, or when there are no DLLogger lines.
RunLog parse_dllogger(const std::string& path);

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

// An SVG line chart with axes, ticks and a legend; no scripts, no external assets.
std::string svg_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<Series>& series);

// Whether the run has ended: its summary entry (step []) is logged.
inline bool finished(const RunLog& run) { return !run.summary.empty(); }

// The whole page: summary (in %, ms and images/s), loss (per logged step and
// per epoch), top-1, top-5, learning-rate and throughput charts, configuration.
// refresh_seconds > 0: a live page that reloads itself that often.
// `evaluation`: the output of `convnets eval --per-class --json` (null: none),
// drawn as its per-class table and confusion matrix.
std::string render_html(const RunLog& run, const std::string& title, int refresh_seconds = 0,
                        const nlohmann::json* evaluation = nullptr);

// Throws Error naming `source` unless `evaluation` holds the per-class results
// of `eval --per-class --json`: a class list and a square matrix of counts.
void check_evaluation(const nlohmann::json& evaluation, const std::string& source);

// The confusion matrix of `eval --per-class --json` as an SVG heat map: a
// cell per (true, predicted) pair shaded by its share of the true class's
// images, its count in the cell's tooltip. Throws as check_evaluation.
std::string svg_confusion(const nlohmann::json& evaluation, const std::string& source);

}  // namespace convnets::report
