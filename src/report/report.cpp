#include "report/report.h"

#include "core/error.h"
#include "core/json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace convnets::report {
namespace {

// HTML text that stays valid UTF-8 whatever bytes a run's paths hold.
std::string escape(const std::string& s) {
  std::string out;
  for (char ch : utf8_escaped(s)) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string num(double v, int precision = 4) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

// "Nice" tick step (1, 2 or 5 x 10^k) giving about `target` ticks over the span.
double tick_step(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

Series series_of(const std::string& name, const std::vector<std::pair<int, nlohmann::json>>& epochs,
                 const std::string& key) {
  Series s{name, {}};
  for (const auto& [e, d] : epochs) {
    if (d.contains(key) && d[key].is_number()) s.points.emplace_back(e, d[key].get<double>());
  }
  return s;
}

// A DLLogger metric as a person reads it: a name in words and the value in
// its unit (DLE logs accuracy in %, latencies in seconds, throughput in
// images/s). Unknown keys keep their name and a plain number.
std::pair<std::string, std::string> human_metric(const std::string& key, const nlohmann::json& value) {
  if (!value.is_number()) return {key, value.is_string() ? value.get<std::string>() : value.dump()};
  const double v = value.get<double>();
  std::string prefix, metric = key;
  if (const auto dot = key.find('.'); dot != std::string::npos) {
    const std::string scope = key.substr(0, dot);
    prefix = scope == "val" ? "validation " : scope == "val_ema" ? "validation (EMA) " : scope == "train" ? "training " : scope + " ";
    metric = key.substr(dot + 1);
  }
  char buf[96];
  auto fmt = [&](const char* f, double x) {
    std::snprintf(buf, sizeof buf, f, x);
    return std::string(buf);
  };
  if (metric == "top1" || metric == "top5" || metric == "best_top1") {
    const std::string name = metric == "top5" ? "top-5" : metric == "best_top1" ? "best top-1" : "top-1";
    return {prefix + name, fmt("%.2f %%", v)};
  }
  if (metric == "compute_latency" || metric.rfind("compute_latency_", 0) == 0) {
    // DLE's compute_latency is the mean; _atNN a percentile (at100: the slowest batch).
    const std::string which = metric.size() > 16 ? metric.substr(16) : "mean";
    const std::string name = which == "mean" ? "latency, mean" : which == "at100" ? "latency, max" : "latency, p" + which.substr(2);
    return {prefix + name + " (per batch)", fmt("%.2f ms", v * 1e3)};
  }
  if (metric == "compute_ips") return {prefix + "throughput, forward only", fmt("%.1f images/s", v)};
  if (metric == "total_ips") return {prefix + "throughput, with data loading", fmt("%.1f images/s", v)};
  if (metric == "loss") return {prefix + "loss", fmt("%.4f", v)};
  if (metric == "steps") return {prefix + "optimizer steps", fmt("%.0f", v)};
  if (metric == "best_epoch") return {prefix + "best epoch", fmt("%.0f", v)};
  return {key, value.is_number_float() ? num(v, 6) : value.dump()};
}

}  // namespace

RunLog parse_dllogger(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path, "pass a run's workspace folder or its log.json");
  RunLog run;
  std::map<int, nlohmann::json> epochs;
  std::map<double, nlohmann::json> steps;
  std::string line;
  int number = 0, records = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.rfind("DLLL ", 0) != 0) continue;
    // A last line without its newline is being written (a live run) or was
    // cut by a kill: not an error, just not there yet.
    const bool unterminated = in.eof();
    nlohmann::json j;
    try {
      j = parse_json(std::string_view(line).substr(5), path + ":" + std::to_string(number) + " (a DLLogger record)");
    } catch (const Error&) {
      if (unterminated) break;
      throw;
    }
    ++records;
    if (j.value("type", "") != "LOG" || !j.contains("data")) continue;
    const auto& step = j["step"];
    const auto& data = j["data"];
    if (step.is_string() && step.get<std::string>() == "PARAMETER") {
      run.parameters.update(data);
      run.summary = nlohmann::json::object();  // a resumed run: the summary of an earlier invocation is not this one's end
    } else if (step.is_array() && step.size() == 1 && step[0].is_number()) {
      epochs[step[0].get<int>()] = data;  // a resumed epoch replaces the interrupted one
    } else if (step.is_array() && step.size() == 2 && step[0].is_number() && step[1].is_number()) {
      const double per_epoch = run.parameters.value("steps_per_epoch", 0.0);
      const double x = step[0].get<double>() - 1 + (per_epoch > 0 ? step[1].get<double>() / per_epoch : 0.0);
      steps[x] = data;
    } else if (step.is_array() && step.empty()) {
      run.summary = data;
    }
  }
  if (records == 0) throw Error(path + ": no DLLogger lines ('DLLL {...}')", "is this a convnets or DLE log.json?");
  for (auto& [e, d] : epochs) run.epochs.emplace_back(e, d);
  for (auto& [x, d] : steps) run.steps.emplace_back(x, d);
  return run;
}

std::string svg_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                      const std::vector<Series>& series) {
  const double W = 560, H = 330, left = 64, right = 16, top = 48, bottom = 48;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << ' ' << H << "\" role=\"img\" aria-label=\"" << escape(title) << "\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">"
    << escape(title) << "</text>\n";
  if (x0 > x1) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n</svg>";
    return o.str();
  }
  if (x1 == x0) x0 -= 0.5, x1 += 0.5;
  if (y1 == y0) y0 -= std::max(1e-3, std::fabs(y0) * 0.05), y1 += std::max(1e-3, std::fabs(y1) * 0.05);
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  const double pw = W - left - right, ph = H - top - bottom;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * ph; };
  o << "<g font-size=\"11\" fill=\"#333\" stroke-width=\"1\">\n";
  const double ys = tick_step(y1 - y0, 5);
  for (double t = std::ceil(y0 / ys) * ys; t <= y1 + 1e-12; t += ys) {
    o << "<line x1=\"" << left << "\" x2=\"" << W - right << "\" y1=\"" << Y(t) << "\" y2=\"" << Y(t)
      << "\" stroke=\"#e5e5e5\"/><text x=\"" << left - 6 << "\" y=\"" << Y(t) + 4 << "\" text-anchor=\"end\">"
      << num(std::fabs(t) < ys * 1e-6 ? 0.0 : t) << "</text>\n";
  }
  const double xs = std::max(tick_step(x1 - x0, 8), x1 - x0 >= 2 ? 1.0 : 0.0);
  for (double t = std::ceil(x0 / xs) * xs; t <= x1 + 1e-12; t += xs) {
    o << "<line x1=\"" << X(t) << "\" x2=\"" << X(t) << "\" y1=\"" << top + ph << "\" y2=\"" << top + ph + 4
      << "\" stroke=\"#333\"/><text x=\"" << X(t) << "\" y=\"" << top + ph + 17 << "\" text-anchor=\"middle\">"
      << num(t) << "</text>\n";
  }
  o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#333\"/>\n"
    << "<text x=\"" << left + pw / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">" << escape(x_label)
    << "</text>\n<text transform=\"translate(14," << top + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << escape(y_label) << "</text>\n</g>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const char* color = kColors[i % (sizeof kColors / sizeof *kColors)];
    o << "<g class=\"series\" data-name=\"" << escape(s.name) << "\">\n<polyline fill=\"none\" stroke=\"" << color
      << "\" stroke-width=\"2\" points=\"";
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(y)) o << num(X(x), 6) << ',' << num(Y(y), 6) << ' ';
    }
    o << "\"/>\n";
    if (s.points.size() <= 60) {
      for (const auto& [x, y] : s.points) {
        if (std::isfinite(y)) {
          o << "<circle cx=\"" << num(X(x), 6) << "\" cy=\"" << num(Y(y), 6) << "\" r=\"3\" fill=\"" << color
            << "\"><title>" << escape(s.name) << ": " << num(y, 6) << " at " << num(x) << "</title></circle>\n";
        }
      }
    }
    // Legend in a row between title and plot, so it never hides a line.
    const double lx = left + 175 * static_cast<double>(i);
    o << "<line x1=\"" << lx << "\" x2=\"" << lx + 20 << "\" y1=\"36\" y2=\"36\" stroke=\"" << color
      << "\" stroke-width=\"3\"/><text x=\"" << lx + 26 << "\" y=\"40\" font-size=\"11\">" << escape(s.name)
      << "</text>\n</g>\n";
  }
  o << "</svg>";
  return o.str();
}

void check_evaluation(const nlohmann::json& e, const std::string& source) {
  if (!e.is_object() || !e.contains("per_class") || !e.contains("confusion") || !e["confusion"].is_array() ||
      e["confusion"].empty()) {
    throw Error(source + " holds no per-class results", "write it with `convnets eval ... --per-class --json`");
  }
  const auto& rows = e["per_class"];
  const auto& m = e["confusion"];
  const std::size_t n = m.size();
  if (!rows.is_array() || rows.size() != n) {
    throw Error(source + ": per_class has " + std::to_string(rows.size()) + " classes, the confusion matrix " +
                std::to_string(n) + " rows");
  }
  for (const auto& row : m) {
    if (!row.is_array() || row.size() != n) {
      throw Error(source + ": the confusion matrix is not " + std::to_string(n) + " x " + std::to_string(n));
    }
    for (const auto& v : row) {
      if (!v.is_number()) throw Error(source + ": the confusion matrix holds a value that is not a count");
    }
  }
}

std::string svg_confusion(const nlohmann::json& e, const std::string& source) {
  check_evaluation(e, source);
  const auto& rows = e["per_class"];
  const auto& m = e["confusion"];
  const std::size_t n = m.size();
  std::vector<double> totals(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto& v : m[i]) totals[i] += v.get<double>();
  }
  // The diagonal is shaded by its share of the row, the errors by theirs against the largest error's, so the
  // worst confusion stands out however small it is.
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (i != j && totals[i] > 0) worst = std::max(worst, m[i][j].get<double>() / totals[i]);
    }
  }
  // Names on the axes while they fit, counts in the cells while they fit; a thousand classes are a picture of
  // the diagonal.
  const bool labels = n <= 40, counts = n <= 20;
  const double cell = n <= 20 ? 34 : n <= 40 ? 16 : std::max(1.0, 800.0 / static_cast<double>(n));
  const double margin = labels ? 130 : 50, size = cell * static_cast<double>(n);
  const auto name = [&](std::size_t i) { return rows[i].value("class", std::to_string(i)); };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(std::max(margin + size + 20, 640.0), 6)
    << "\" height=\"" << num(margin + size + 20, 6) << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n"
    << "<text x=\"10\" y=\"18\" font-size=\"14\" font-weight=\"bold\">Confusion matrix</text>\n"
    << "<text x=\"10\" y=\"36\">rows: true class; columns: top-1 prediction; blue: the row's share right; red: "
       "errors, against the largest</text>\n";
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      const double count = m[i][j].get<double>();
      if (count <= 0) continue;
      const double share = totals[i] > 0 ? count / totals[i] : 0;
      const double strength = i == j ? share : worst > 0 ? share / worst : 0;
      const int fade = static_cast<int>(255 * (1 - std::min(1.0, 0.1 + 0.9 * strength)));
      const std::string color = i == j ? "rgb(" + std::to_string(fade) + "," + std::to_string(fade) + ",255)"
                                       : "rgb(255," + std::to_string(fade) + "," + std::to_string(fade) + ")";
      const double x = margin + cell * static_cast<double>(j), y = margin + cell * static_cast<double>(i);
      o << "<rect x=\"" << num(x, 6) << "\" y=\"" << num(y, 6) << "\" width=\"" << num(cell, 6) << "\" height=\""
        << num(cell, 6) << "\" fill=\"" << color << "\"><title>" << escape(name(i)) << " -> " << escape(name(j))
        << ": " << static_cast<long long>(count) << " images (" << num(100 * share, 3) << " %)</title></rect>\n";
      if (counts) {
        o << "<text x=\"" << num(x + cell / 2, 6) << "\" y=\"" << num(y + cell / 2 + 4, 6)
          << "\" text-anchor=\"middle\" font-size=\"10\" fill=\"" << (strength > 0.6 ? "#fff" : "#222") << "\">"
          << static_cast<long long>(count) << "</text>\n";
      }
    }
  }
  o << "<rect x=\"" << num(margin, 6) << "\" y=\"" << num(margin, 6) << "\" width=\"" << num(size, 6)
    << "\" height=\"" << num(size, 6) << "\" fill=\"none\" stroke=\"#888\"/>\n";
  if (labels) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::string label = escape(name(i).substr(0, 18));
      const double c = margin + cell * (static_cast<double>(i) + 0.5);
      o << "<text x=\"" << num(margin - 4, 6) << "\" y=\"" << num(c + 4, 6) << "\" text-anchor=\"end\">" << label
        << "</text>\n<text transform=\"translate(" << num(c + 4, 6) << "," << num(margin - 4, 6)
        << ") rotate(-90)\">" << label << "</text>\n";
    }
  }
  o << "</svg>";
  return o.str();
}

namespace {

std::string per_class_table(const nlohmann::json& e) {
  std::ostringstream o;
  std::string k = "top5";
  for (auto it = e["per_class"][0].begin(); it != e["per_class"][0].end(); ++it) {
    if (it.key().rfind("top", 0) == 0 && it.key() != "top1") k = it.key();
  }
  o << "<table><tr><th>class</th><th>images</th><th>top-1</th><th>top-" << escape(k.substr(3))
    << "</th><th>precision</th><th>recall</th><th>F1</th></tr>";
  for (const auto& r : e["per_class"]) {
    o << "<tr><td>" << escape(r.value("class", std::string("?"))) << "</td><td>" << r.value("images", 0);
    for (const char* key : {"top1", k.c_str(), "precision", "recall", "f1"}) {
      o << "</td><td>" << num(r.value(key, 0.0), 4) << " %";
    }
    o << "</td></tr>";
  }
  o << "</table>\n";
  return o.str();
}

}  // namespace

std::string render_html(const RunLog& run, const std::string& title, int refresh_seconds,
                        const nlohmann::json* evaluation) {
  // The loss as logged every --print-freq steps (the window's mean), the
  // epoch means over it, and validation.
  Series step_loss{"train loss (per " + std::to_string(run.parameters.value("print_freq", 0)) + " steps)", {}};
  for (const auto& [x, d] : run.steps) {
    if (d.contains("train.loss") && d["train.loss"].is_number()) step_loss.points.emplace_back(x, d["train.loss"].get<double>());
  }
  std::vector<Series> loss{step_loss, series_of("train loss (epoch mean)", run.epochs, "train.loss"),
                           series_of("val loss", run.epochs, "val.loss")};

  std::vector<Series> top1{series_of("val top-1", run.epochs, "val.top1")};
  std::vector<Series> top5{series_of("val top-5", run.epochs, "val.top5")};
  if (!series_of("", run.epochs, "val_ema.top1").points.empty()) {
    top1.push_back(series_of("val top-1 (EMA)", run.epochs, "val_ema.top1"));
    top5.push_back(series_of("val top-5 (EMA)", run.epochs, "val_ema.top5"));
  }
  Series lr{"learning rate", {}};
  for (const auto& [x, d] : run.steps) {
    if (d.contains("train.lr")) lr.points.emplace_back(x, d["train.lr"].get<double>());
  }
  if (lr.points.empty()) lr = series_of("learning rate", run.epochs, "train.lr");
  std::vector<Series> ips{series_of("train images/s (total)", run.epochs, "train.total_ips"),
                          series_of("train images/s (compute)", run.epochs, "train.compute_ips")};

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  if (refresh_seconds > 0) o << "<meta http-equiv=\"refresh\" content=\"" << refresh_seconds << "\">\n";
  o << "<title>" << escape(title)
    << "</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222}"
       ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}"
       "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}"
       "th{background:#f5f5f5}</style></head><body>\n<h1>"
    << escape(title) << "</h1>\n";
  if (refresh_seconds > 0) {
    o << "<p class=\"live\">Live: the run is still going; this page is rewritten and reloads every "
      << refresh_seconds << " s.</p>\n";
  } else if (!finished(run)) {
    o << "<p class=\"live\">No summary: the run is still going or stopped before its end; the figures are those of "
         "the last epoch logged.</p>\n";
  }
  o << "<table><tr><th>arch</th><td>" << escape(run.parameters.value("arch", "?")) << "</td></tr>"
    << "<tr><th>epochs logged</th><td>" << run.epochs.size() << " of " << run.parameters.value("epochs", 0)
    << "</td></tr>";
  // The run's summary, or while it runs the last epoch's figures.
  const nlohmann::json& shown = !run.summary.empty() ? run.summary
                                : !run.epochs.empty() ? run.epochs.back().second
                                                      : run.summary;
  for (auto it = shown.begin(); it != shown.end(); ++it) {
    // convnets logs the mean latency under DLE's name and its own: shown once.
    const auto& key = it.key();
    if (key.size() > 16 && key.compare(key.size() - 16, 16, ".compute_latency") == 0 && shown.contains(key + "_mean"))
      continue;
    const auto [name, text] = human_metric(key, it.value());
    o << "<tr><th>" << escape(name) << "</th><td>" << escape(text) << "</td></tr>";
  }
  o << "</table>\n<div class=\"grid\">\n"
    << svg_chart("Loss", "epoch", "loss", loss) << '\n'
    << svg_chart("Top-1 accuracy", "epoch", "top-1 (%)", top1) << '\n'
    << svg_chart("Top-5 accuracy", "epoch", "top-5 (%)", top5) << '\n'
    << svg_chart("Learning rate", "epoch", "LR", {lr}) << '\n'
    << svg_chart("Throughput", "epoch", "images/s", ips) << "\n</div>\n";
  if (evaluation) {
    o << "<h2>Evaluation per class</h2>\n<p>" << escape(evaluation->value("images", 0) > 0
                                                          ? std::to_string(evaluation->value("images", 0)) + " images, top-1 " +
                                                                num(evaluation->value("val.top1", 0.0), 4) + " %"
                                                          : std::string())
      << "</p>\n" << svg_confusion(*evaluation, "the evaluation") << '\n' << per_class_table(*evaluation);
  }
  o << "<h2>Configuration</h2>\n<table>";
  for (auto it = run.parameters.begin(); it != run.parameters.end(); ++it) {
    // A text as it is: its JSON form would double the backslash of a \xNN escape.
    const auto& v = it.value();
    o << "<tr><th>" << escape(it.key()) << "</th><td>" << escape(v.is_string() ? v.get<std::string>() : v.dump())
      << "</td></tr>";
  }
  o << "</table>\n</body></html>\n";
  return o.str();
}

}  // namespace convnets::report
