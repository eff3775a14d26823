// Graph passes: the named rewrites a complete graph (backward included) may get
// before it is allocated (docs/design.md, "Training", the mixed-precision and
// fusion paragraphs). Each one folds nodes into fewer ones; two change values.
// Who runs them: an OptContext (OptConfig::passes; by default every pass valid
// for its graph) and the Generator (GeneratorOptions::passes; by default none),
// each keeping only the passes its backend has kernels for
// (Backend::supports_pass: the CpuBackend all, other backends none yet).
//
// | pass             | Graph method       | what it changes         | graphs              |
// |------------------|--------------------|-------------------------|---------------------|
// | fuse_bias        | fuse_matmul_bias   | nothing (bit-identical) | training, inference |
// | fuse_residual    | fuse_norm_residual | nothing (bit-identical) | training            |
// | bf16_grad_sums   | sum_bf16_gradients | bias gradients sum the  | training            |
// |                  |                    | bf16-rounded terms      |                     |
// |                  |                    | (2^-9 relative each)    |                     |
// | bf16_gelu_inputs | bf16_gelu_inputs   | GELU reads its input    | training, inference |
// |                  |                    | rounded to bf16 (2^-9   |                     |
// |                  |                    | relative)               |                     |
// | fuse_casts       | fuse_bf16_casts    | nothing (bit-identical) | training, inference |
// | fold_casts       | fold_bf16_casts    | nothing (bit-identical; | training, inference |
// |                  |                    | subnormals read as 0)   |                     |
//
// Passes run in this order. bf16_gelu_inputs and fold_casts need fuse_casts
// (the casts the first adds are meant to be fused; the second works on a
// fused graph). fuse_residual and bf16_grad_sums rewrite backward nodes: an
// inference graph has none. A pass asked for explicitly where it is not valid,
// or without one it needs, is a kiln::Error naming it (check_graph_passes).
// The tests train two transformer blocks with each pass and without it: the
// bit-identical ones give the same losses and params bit for bit, with
// bf16_grad_sums the losses stay within 1e-3 relative, with bf16_gelu_inputs
// within 1e-2 (docs/design.md, "Graph passes").
//
//   kiln::OptConfig cfg = ...;
//   cfg.passes = kiln::GraphPasses::defaults(kiln::GraphKind::training)
//                    .without(kiln::GraphPass::bf16_grad_sums);
#pragma once
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace kiln {

class Graph;

// In the order they run.
enum class GraphPass : uint8_t {
  fuse_bias,
  fuse_residual,
  bf16_grad_sums,
  bf16_gelu_inputs,
  fuse_casts,
  fold_casts,
};
inline constexpr int kGraphPassCount = 6;

// Training: forward, backward and optimizer nodes (an OptContext). Inference:
// forward nodes only (a forward-only OptContext, the Generator).
enum class GraphKind : uint8_t { training, inference };
const char* graph_kind_name(GraphKind k);

// A set of passes (a small bit set). Default-constructed: none.
class GraphPasses {
 public:
  constexpr GraphPasses() = default;
  constexpr GraphPasses(std::initializer_list<GraphPass> passes) {
    for (GraphPass p : passes) bits_ |= bit(p);
  }
  // Every pass valid for graphs of `kind` (the table's "graphs" column): what an
  // OptContext runs by default.
  static GraphPasses defaults(GraphKind kind);
  // A comma-separated list of pass names ("fuse_bias,fuse_casts"), "none" or
  // "all". Throws kiln::Error "[graph passes] unknown pass 'x' (passes: ...)".
  static GraphPasses parse(std::string_view list);

  constexpr bool has(GraphPass p) const { return (bits_ & bit(p)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr GraphPasses with(GraphPass p) const { return from_bits(bits_ | bit(p)); }
  constexpr GraphPasses without(GraphPass p) const { return from_bits(bits_ & ~bit(p)); }
  constexpr GraphPasses operator&(GraphPasses o) const { return from_bits(bits_ & o.bits_); }
  constexpr bool operator==(const GraphPasses&) const = default;
  // The names in run order, comma-separated; "none" when empty.
  std::string str() const;

 private:
  static constexpr uint32_t bit(GraphPass p) { return 1u << unsigned(p); }
  static constexpr GraphPasses from_bits(uint32_t b) {
    GraphPasses s;
    s.bits_ = b;
    return s;
  }
  uint32_t bits_ = 0;
};

// One row of the table above.
struct GraphPassInfo {
  GraphPass pass;
  const char* name;      // as parse() and the examples' --no-pass flags take it
  const char* method;    // the Graph method that does it
  const char* numerics;  // what it changes in the values computed
  bool training;         // valid for training graphs
  bool inference;        // valid for inference graphs
  GraphPasses needs;     // passes it must run with
};
std::span<const GraphPassInfo> graph_pass_table();  // in run order
const GraphPassInfo& graph_pass_info(GraphPass p);
const char* graph_pass_name(GraphPass p);

// Throws kiln::Error "[who] ..." when `passes` holds a pass not valid for graphs
// of `kind`, or one without a pass it needs (naming both).
void check_graph_passes(const char* who, GraphPasses passes, GraphKind kind);

// Runs `passes` on g (complete, backward included, not yet allocated) in run
// order; a pass whose prerequisite is not in the set is skipped. Returns the
// passes run.
GraphPasses run_graph_passes(Graph& g, GraphPasses passes);

}  // namespace kiln
