// Entry point of the convnets executable: global flags, subcommand dispatch, error reporting.
#include "cli/commands.h"
#include "cli/fork_server.h"
#include "core/compat.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/process_exit.h"
#include "core/threads.h"
#include "deploy/engine.h"
#include "distributed/launcher.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <iostream>

namespace {

int run(int argc, char** argv) {
  convnets::configure_host_allocator();
  convnets::distributed::set_program_args(argc, argv);
  // Which worker of a data-parallel job speaks: every rank prints its own errors.
  std::string who;
  if (const char* rank = std::getenv("RANK")) {
    if (const char* world = std::getenv("WORLD_SIZE"); world && std::string(world) != "1") {
      who = std::string(" (rank ") + rank + " of " + world + ")";
    }
  }
  CLI::App app{"convnets: train, evaluate, benchmark and deploy image-classification ConvNets"};
  const std::string openvino = convnets::deploy::openvino_version();
  app.set_version_flag("--version", std::string("convnets " CONVNETS_VERSION " (") + convnets::compat::engine_versions() +
                                        (openvino.empty() ? "" : ", OpenVINO " + openvino) + ")");
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads for tensor kernels (default: OMP_NUM_THREADS, else all CPUs)")
      ->check(CLI::Range(0, 4096));
  app.require_subcommand(1);
  app.parse_complete_callback([&] { convnets::configure_threads(threads); });
  convnets::cli::add_models_command(app);
  convnets::cli::add_train_command(app);
  convnets::cli::add_eval_command(app);
  convnets::cli::add_classify_command(app);
  convnets::cli::add_export_command(app);
  convnets::cli::add_pack_command(app);
  convnets::cli::add_report_command(app);
  convnets::cli::add_bench_command(app);
  convnets::cli::add_serve_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::cout << app.version() << '\n';
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    const auto extras = app.remaining();
    if (app.get_subcommands().empty() && !extras.empty() && extras.front().rfind("-", 0) != 0) {
      // CLI11 would only say "a subcommand is required"; name what was typed instead.
      std::vector<std::string> commands;
      for (const auto* sub : app.get_subcommands({})) commands.push_back(sub->get_name());
      std::cerr << "convnets: error: unknown command '" << extras.front() << "'\n  hint: commands: "
                << convnets::join(commands) << '\n';
    } else {
      std::cerr << "convnets: error: " << e.what() << "\n  run 'convnets --help' or 'convnets COMMAND --help'\n";
    }
    return 2;
  } catch (const convnets::Error& e) {
    std::cerr << "convnets: error" << who << ": " << e.what() << '\n';
    if (!e.hint().empty()) std::cerr << "  hint: " << e.hint() << '\n';
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "convnets: error in LibTorch" << who << ": " << e.what_without_backtrace() << '\n';
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "convnets: error" << who << ": " << e.what() << '\n';
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--fork-server") return convnets::finish(convnets::cli::serve_forks(run));
  return convnets::finish(run(argc, argv));
}
