// `convnets report`: renders a run's log.json as one self-contained HTML page.
#include "cli/commands.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "report/report.h"

#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <memory>

namespace convnets::cli {

void add_report_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Render a training run's log as an HTML page with SVG charts");
  struct Args {
    std::string run, output = "report.html", title;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("RUN", a->run, "the run's workspace folder, or its DLLogger log.json")->required();
  cmd->add_option("-o,--output", a->output, "HTML file to write");
  cmd->add_option("--title", a->title, "page title (default: the run's arch and folder)");
  cmd->callback([a] {
    namespace fs = std::filesystem;
    const std::string log = fs::is_directory(a->run) ? (fs::path(a->run) / "log.json").string() : a->run;
    const auto run = report::parse_dllogger(log);
    const std::string title =
        a->title.empty() ? "convnets run: " + run.parameters.value("arch", std::string("?")) + " (" + a->run + ")"
                         : a->title;
    const std::string html = report::render_html(run, title);
    write_file_atomically(a->output, html);
    std::cout << "report: " << a->output << " (" << run.epochs.size() << " epochs, " << html.size() / 1024
              << " KiB)\n";
  });
}

}  // namespace convnets::cli
