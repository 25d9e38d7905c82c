// Registration of the CLI's subcommands (one function per command, one file each) and the flags several share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}

namespace convnets::deploy {
struct DynamicBatching;
struct InferenceOptions;
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
void add_serve_command(CLI::App& app);
// `bench serve`, under `bench` (cli/bench_serve.cpp).
void add_bench_serve(CLI::App& bench);

// --precision as classify and eval take it: convnets' names, in any case, so
// that DLE classify.py's AMP | FP32 read as amp | fp32. Pure fp16 (FP16) is
// refused by name, pointing to amp.
CLI::Option* add_precision_option(CLI::App* cmd, std::string& target);
// ASCII letters in lower case: the values DLE's scripts write in capitals (AMP, TF32) read as convnets' own.
std::string lower_case(std::string value);

// DLE's model flags that have an equivalent rather than a counterpart (main.py's and classify.py's --pretrained, the
// ResNets' --trt), refused with the convnets way named.
void add_dle_model_refusals(CLI::App* cmd);

// --fold-bn, each command's help after `prefix`.
CLI::Option* add_fold_bn_option(CLI::App* cmd, bool& target, const std::string& prefix = "");
// How classify, eval and serve load a network for inference, declared once into `io`: --device, --precision,
// --key-layout, --memory-format, --engine, --ema, --fold-bn, the CUDA graphs' flags and --float. Each command
// declares its own checkpoint, --arch, --num-classes and --image-size (their spellings and meanings differ).
void add_inference_options(CLI::App* cmd, deploy::InferenceOptions& io);

// --key-layout: how a plain weights file names its tensors (options::key_layout).
CLI::Option* add_key_layout_option(CLI::App* cmd, std::string& target);
// --no-cuda-graph, --graph-batch-sizes, --graph-memory-mb: the inference engine's CUDA graphs
// (deploy/graph_engine.h), into `options` (a deploy::InferenceOptions' fields).
void add_graph_options(CLI::App* cmd, bool& cuda_graph, std::vector<std::int64_t>& sizes, double& memory_mb,
                       bool& fused_conv);

// --max-batch-size, --max-queue-delay-us, --preferred-batch-sizes, --instances (--engine-count-per-device) and
// --max-queue-size: Triton's dynamic batching, as serve batches by it and export --format triton writes it, each
// help line after `prefix`. DynamicBatching::validate checks them together.
void add_batching_options(CLI::App* cmd, deploy::DynamicBatching& batching, const std::string& prefix = "");

}  // namespace convnets::cli
