// `convnets report`: renders a run's log.json as one self-contained HTML page.
#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"
#include "report/report.h"
#include "train/dllogger.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

namespace convnets::cli {

namespace {

bool holds_a_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  return std::getline(in, line) && !in.eof();
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Render a training run's log as an HTML page with SVG charts");
  struct Args {
    std::string run, output = "report.html", title, eval;
    int watch = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("RUN", a->run, "the run's workspace folder, or its DLLogger log.json")->required();
  cmd->add_option("-o,--output", a->output, "HTML file to write");
  cmd->add_option("--title", a->title, "page title (default: the run's arch and folder)");
  cmd->add_option("--eval", a->eval,
                  "add an evaluation's per-class table and confusion matrix: the JSON of `convnets eval --per-class "
                  "--json`");
  cmd->add_option("--watch", a->watch,
                  "rewrite the page every SECONDS while the run is live (the page reloads itself); stop when the run "
                  "logs its summary, or when no process writes its log any more (killed)")
      ->check(CLI::Range(1, 86400));
  cmd->callback([a] {
    namespace fs = std::filesystem;
    std::optional<nlohmann::json> evaluation;
    if (!a->eval.empty()) {
      evaluation = read_json_file(a->eval, "the --eval results");
      report::check_evaluation(*evaluation, "--eval " + a->eval);  // before any page is written
    }
    // A watched workspace may not exist yet: the run is starting.
    const bool folder = fs::is_directory(a->run) || (a->watch > 0 && !fs::exists(a->run) &&
                                                     fs::path(a->run).extension() != ".json");
    const std::string log = folder ? (fs::path(a->run) / "log.json").string() : a->run;
    // Each poll: whether a process writes the log (its writer's lock), and
    // how many polls in a row found none while the log stood still. Two such
    // polls rule out a run caught between creating its log and locking it,
    // and keep a run whose locks this machine does not see (NFS mounted
    // nolock) live while it writes.
    int quiet_polls = 0;
    std::uintmax_t last_size = 0;
    auto probe = [&] {
      const auto holder = train::being_written(log);
      std::error_code ec;
      const std::uintmax_t size = fs::file_size(log, ec);
      quiet_polls = holder == false && !ec && size == last_size ? quiet_polls + 1 : 0;
      last_size = ec ? 0 : size;
      return holder == true;
    };
    for (;;) {
      const bool writing = a->watch > 0 && probe();
      // A watched run may not have created its log yet, or not finished its
      // first line (the log exists, locked, from a moment before it). One
      // that died in between leaves it empty, and nobody writes it.
      if (a->watch > 0 && !holds_a_line(log)) {
        if (quiet_polls >= 2) {
          throw Error(log + " holds no complete line and no process writes it: the run stopped before logging anything",
                      "see the run's own output for why it stopped");
        }
        std::this_thread::sleep_for(std::chrono::seconds(a->watch));
        continue;
      }
      const auto run = report::parse_dllogger(log);
      // A summary ends the watch unless a process still writes the log: a
      // resumed run, whose log holds the summary of the invocation before it
      // until its own first line, and locks it from its first moment.
      bool live = a->watch > 0 && (!report::finished(run) || writing);
      // A run killed (or failed) before its summary never logs one, and its
      // lock went with it. Trusted only from a writer that says it locks
      // (DLE's Python DLLogger does not; convnets logs from before the
      // log_lock field are told by their resumed_from field).
      const bool stopped = live && quiet_polls >= 2 &&
                           run.parameters.value("log_lock", run.parameters.contains("resumed_from"));
      live = live && !stopped;
      const std::string title =
          a->title.empty() ? "convnets run: " + run.parameters.value("arch", std::string("?")) + " (" + a->run + ")"
                           : a->title;
      const std::string html = report::render_html(run, title, live ? a->watch : 0, evaluation ? &*evaluation : nullptr);
      write_file_atomically(a->output, html);
      std::cout << "report: " << a->output << " (" << run.epochs.size() << " epochs, " << html.size() / 1024
                << " KiB" << (live ? ", live" : "") << ")" << std::endl;
      if (stopped)
        std::cout << "report: the run stopped without logging its summary (killed, or it failed): no process is "
                     "writing " << log << std::endl;
      if (!live) return;
      std::this_thread::sleep_for(std::chrono::seconds(a->watch));
    }
  });
}

}  // namespace convnets::cli
