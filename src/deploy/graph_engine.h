// The torch engine on CUDA, replaying one captured CUDA graph per batch size (issue 59): batches copied into each graph's static input, padded up to a captured size, the graphs' memory bounded and reported; and the rule that says which graph serves a batch.
#pragma once

#include "deploy/engine.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace convnets::deploy {

// How batches map to graphs: the user's --graph-batch-sizes and --graph-memory-mb.
struct GraphPolicy {
  // Declared sizes (ascending): each captured on its first use, every batch padded up to the smallest that holds
  // it; a batch larger than the last runs eagerly. Empty: each new batch size is captured on its first use.
  std::vector<std::int64_t> sizes;
  // The graphs' private memory together, in MiB: past it no new graph is captured (a batch then pads up to a
  // captured size that holds it, or runs eagerly).
  double memory_mb = 4096;
  // With BN folded (--fold-bn), each conv, its bias, activation and residual add as one cuDNN graph where cuDNN
  // has an engine (models::conv_bn_act); false: --no-fused-conv.
  bool fused_conv = true;
};

// What serves a batch of `rows`: the replay of a captured graph of `size` rows (padded: size > rows), a new capture
// of one, or the eager forward pass, with why.
struct GraphChoice {
  enum class How { Replay, Capture, Eager };
  How how = How::Eager;
  std::int64_t size = 0;
  std::string why;  // Eager: the reason, for the engine's description
};

// The rule, on what is captured (size -> its memory in MiB). Pure: the CPU tests check it.
GraphChoice choose_graph(const GraphPolicy& policy, const std::map<std::int64_t, double>& captured, std::int64_t rows);

// "--graph-batch-sizes 1,8,32": ascending, each positive, no repeats (the error names the flag).
std::vector<std::int64_t> parse_graph_sizes(const std::string& text);
// The same rules for a policy given whole (the Python package's graph_batch_sizes, graph_memory_mb); the error
// names the option as the caller spells it (core/options.h).
void check_graph_policy(const GraphPolicy& policy);

// The torch engine whose forward passes on CUDA replay captured graphs. The network runs in the runtime's half
// precision (fp16 for amp) or fp32, its parameters converted once (autocast's per-pass weight casts would be
// recorded into every graph); `spec.rt` must be a CUDA runtime.
std::unique_ptr<Engine> make_graphed_engine(EngineSpec spec, GraphPolicy policy);

// What a graphed engine holds now: "CUDA graphs: batch 1, 8 (padded from 5), 32; 312 MiB", then which convs ran
// fused (models::describe_fused_convs); "" for another engine.
std::string describe_graphs(const Engine& engine);

}  // namespace convnets::deploy
