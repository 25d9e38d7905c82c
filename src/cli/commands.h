// Registration of the CLI's subcommands: one function per command, one file each.
#pragma once

namespace CLI {
class App;
}

namespace convnets::cli {

void add_models_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_classify_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_pack_command(CLI::App& app);

}  // namespace convnets::cli
