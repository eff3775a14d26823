// Cases "*_mt": big enough (~50k-250k elements of work) that CPU kernels split
// their work over threads (kMinWorkPerThread is 16k elements), so the backend
// checks (2 and 3 threads vs 1, bit for bit) test the multi-threaded paths, and
// long rows / many blocks go through the kernels' vector loops and block sums.
// Too big for finite differences: grad mode compares the CPU's gradients with
// the reference's (fd = false); the small cases check the backward rules.
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

Case mt(std::string name, std::vector<Op> ops, std::vector<Input> ins, BuildFn f, bool grad) {
  Case c = make_case(std::move(name), std::move(ops), std::move(ins), std::move(f), grad);
  c.fd = false;
  return c;
}

void add_elementwise_mt(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(96, 1024), C = z(1031, 4099);
  cs.push_back(mt(
      "add_bcast_row_mt", {Op::ADD}, {in("a", {R, C}), in("b", {C})},
      [](Context&, X x) { return x[0] + x[1]; }, true));
  cs.push_back(mt(
      "mul_bcast_col_mt", {Op::MUL}, {in("a", {R, C}), in("b", {R, 1})},
      [](Context&, X x) { return x[0] * x[1]; }, true));
  cs.push_back(mt(
      "sub_strided_mt", {Op::SUB},
      {with(in("a", {R, C}), Layout::transposed), with(in("b", {R, C}), Layout::narrowed)},
      [](Context&, X x) { return x[0] - x[1]; }, true));
  cs.push_back(mt(
      "div_bcast_lead_mt", {Op::DIV},
      {in("a", {4, R, z(263, 1031)}), in("b", {R, z(263, 1031)}, gen::magnitude(0.5, 2))},
      [](Context&, X x) { return x[0] / x[1]; }, true));
  cs.push_back(mt(
      "where_mt", {Op::WHERE},
      {constant(in("cond", {R, 1}, gen::choice({0, 1}))), in("a", {R, C}),
       with(in("b", {R, C}), Layout::transposed)},
      [](Context&, X x) { return where(x[0], x[1], x[2]); }, true));
  Case cmp = mt(
      "cmp_mt", {Op::COMPARE},
      {in("a", {R, C}, gen::choice({0, 1, 2})), in("b", {C}, gen::choice({0, 1, 2}))},
      [](Context&, X x) { return le(x[0], x[1]); }, false);
  cmp.tol = {0, 0};
  cs.push_back(cmp);
  struct Un {
    const char* name;
    Op op;
    Tensor (*f)(Tensor);
    Layout l;
    Gen g;
  };
  const Un uns[] = {
      {"exp_mt", Op::EXP, [](Tensor x) { return kiln::exp(x); }, Layout::contig,
       gen::uniform(-3, 3)},
      {"log_mt", Op::LOG, [](Tensor x) { return kiln::log(x); }, Layout::contig,
       gen::uniform(0.1, 4)},
      {"tanh_strided_mt", Op::TANH, [](Tensor x) { return kiln::tanh(x); }, Layout::transposed,
       gen::uniform(-3, 3)},
      {"gelu_erf_mt", Op::GELU_ERF, [](Tensor x) { return kiln::gelu(x); }, Layout::contig,
       gen::uniform(-4, 4)},
      {"gelu_tanh_narrowed_mt", Op::GELU, [](Tensor x) { return kiln::gelu(x, GeluApprox::tanh); },
       Layout::narrowed, gen::uniform(-4, 4)},
      {"silu_mt", Op::SILU, [](Tensor x) { return kiln::silu(x); }, Layout::contig,
       gen::uniform(-5, 5)},
      {"softplus_mt", Op::SOFTPLUS, [](Tensor x) { return kiln::softplus(x); }, Layout::contig,
       gen::uniform(-5, 5)},
      {"relu_mt", Op::RELU, [](Tensor x) { return kiln::relu(x); }, Layout::contig,
       gen::away_from(-2, 2, {0})},
      {"sqrt_mt", Op::SQRT, [](Tensor x) { return kiln::sqrt(x); }, Layout::permuted,
       gen::uniform(0.1, 4)},
      {"pow_mt", Op::POW, [](Tensor x) { return kiln::pow(x, 1.5f); }, Layout::contig,
       gen::uniform(0.1, 4)},
  };
  for (const Un& u : uns) {
    auto f = u.f;
    cs.push_back(mt(
        u.name, {u.op}, {with(in("x", {R, C}, u.g), u.l)}, [f](Context&, X x) { return f(x[0]); },
        true));
  }
  // GELU reading bf16 x (Graph::bf16_gelu_inputs), split over threads.
  cs.push_back(mt(
      "gelu_erf_bf16_x_mt", {Op::GELU_ERF}, {as(in("x", {R, C}, gen::uniform(-4, 4)), DType::bf16)},
      [](Context&, X x) { return kiln::gelu(x[0]); }, false));
  cs.push_back(mt(
      "gelu_erf_back_bf16_x_mt", {Op::GELU_ERF_BACK},
      {in("dy", {R, C}), as(in("x", {R, C}, gen::uniform(-4, 4)), DType::bf16)},
      [R, C](Context&, X x) {
        return detail::make_op(Op::GELU_ERF_BACK, DType::f32, Shape{R, C}, {x[0], x[1]});
      },
      true));
  const DType conv[][2] = {{DType::f32, DType::f16},
                           {DType::bf16, DType::f32},
                           {DType::f32, DType::i32},
                           {DType::i32, DType::f32}};
  const char* names[] = {"copy_f32_f16_mt", "copy_bf16_f32_strided_mt", "copy_f32_i32_mt",
                         "copy_i32_f32_mt"};
  for (int k = 0; k < 4; ++k) {
    const DType to = conv[k][1];
    const Gen g = conv[k][0] == DType::i32 ? gen::integers(-5000, 5000) : gen::uniform(-50, 50);
    Case c = mt(
        names[k], {Op::COPY},
        {with(as(in("x", {R, C}, g), conv[k][0]), k == 1 ? Layout::transposed : Layout::contig)},
        [to](Context&, X x) { return x[0].to(to); }, false);
    c.tol = {0, 0};
    cs.push_back(c);
  }
  cs.push_back(mt(
      "dropout_mt", {Op::RAND_MASK}, {in("x", {R, C})},
      [](Context&, X x) { return dropout(x[0], 0.3f, 1234, true); }, true));
}

void add_reduce_mt(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(384, 2048), C = z(263, 2051);
  cs.push_back(mt(
      "sum_all_mt", {Op::SUM}, {in("x", {R, C})}, [](Context&, X x) { return sum(x[0]); }, true));
  cs.push_back(mt(
      "sum_axis0_mt", {Op::SUM}, {in("x", {R, C})}, [](Context&, X x) { return sum(x[0], 0); },
      true));
  cs.push_back(mt(
      "sum_axis1_transposed_mt", {Op::SUM}, {with(in("x", {R, C}), Layout::transposed)},
      [](Context&, X x) { return sum(x[0], 1); }, true));
  cs.push_back(mt(
      "mean_axis1_3d_mt", {Op::SUM}, {in("x", {4, R / 4, C})},
      [](Context&, X x) { return mean(x[0], 1, true); }, true));
  cs.push_back(mt(
      "max_axis1_mt", {Op::MAX}, {in("x", {R, C}, gen::distinct(-3, 3))},
      [](Context&, X x) { return max(x[0], 1); }, true));
  cs.push_back(mt(
      "max_axis0_mt", {Op::MAX}, {in("x", {R, C}, gen::distinct(-3, 3))},
      [](Context&, X x) { return max(x[0], 0); }, true));
  cs.push_back(mt(
      "max_all_mt", {Op::MAX}, {in("x", {R, C}, gen::distinct(-3, 3))},
      [](Context&, X x) { return max(x[0]); }, true));
  Case am = mt(
      "argmax_mt", {Op::ARGMAX}, {in("x", {R, C}, gen::choice({0, 1, 2, 3}))},
      [](Context&, X x) { return argmax(x[0], 1); }, false);
  am.tol = {0, 0};
  cs.push_back(am);
  Case ce = mt(
      "count_equal_mt", {Op::COUNT_EQUAL},
      {in("a", {R, C}, gen::choice({0, 1})), in("b", {R, C}, gen::choice({0, 1}))},
      [](Context&, X x) { return count_equal(x[0], x[1]); }, false);
  ce.tol = {0, 0};
  cs.push_back(ce);
}

void add_nn_mt(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(64, 512), C = z(1031, 4099);
  const Gen mg = gen::uniform(-2, 0);
  cs.push_back(mt(
      "softmax_mask_causal_mt", {Op::SOFTMAX}, {in("x", {R, C}), constant(in("mask", {C}, mg))},
      [](Context&, X x) {
        SoftmaxOptions o;
        o.scale = 0.5f;
        o.mask = x[1];
        o.causal = true;
        return softmax(x[0], o);
      },
      true));
  cs.push_back(mt(
      "log_softmax_mt", {Op::LOG_SOFTMAX}, {with(in("x", {R, C}), Layout::transposed)},
      [](Context&, X x) { return log_softmax(x[0]); }, true));
  cs.push_back(mt(
      "layer_norm_affine_mt", {},
      {in("x", {R, C}), in("w", {C}, gen::uniform(0.5, 1.5)), in("b", {C})},
      [](Context&, X x) { return layer_norm(x[0], x[1], x[2]); }, true));
  cs.push_back(mt(
      "rms_norm_mt", {}, {in("x", {R, C}), in("w", {C}, gen::uniform(0.5, 1.5))},
      [](Context&, X x) { return rms_norm(x[0], x[1]); }, true));
  const int64_t N = z(256, 1024), K = z(263, 1000);
  cs.push_back(mt(
      "cross_entropy_mt", {},
      {in("logits", {N, K}, gen::uniform(-3, 3)), in_i32("labels", {N}, gen::integers(0, K - 1))},
      [](Context&, X x) { return cross_entropy(x[0], x[1]); }, true));
  Case oh = mt(
      "one_hot_mt", {Op::ONE_HOT}, {in_i32("labels", {N * 4}, gen::integers(0, K - 1))},
      [K](Context&, X x) { return one_hot(x[0], K); }, false);
  oh.tol = {0, 0};
  cs.push_back(oh);
  cs.push_back(mt(
      "matmul_mt", {Op::MATMUL},
      {in("a", {z(96, 1024), z(300, 1024)}), in("b", {z(300, 1024), z(130, 1024)})},
      [](Context&, X x) { return matmul(x[0], x[1]); }, true));
  cs.push_back(mt(
      "matmul_batched_transposed_mt", {Op::MATMUL},
      {with(in("a", {4, z(40, 256), z(150, 512)}), Layout::transposed),
       in("b", {z(150, 512), z(70, 256)})},
      [](Context&, X x) { return matmul(x[0], x[1]); }, true));
  // Embedding: many rows hit the same table rows (scatter-add in the backward pass).
  cs.push_back(mt(
      "embedding_mt", {Op::EMBEDDING},
      {in("w", {z(50, 8192), z(130, 512)}),
       in_i32("idx", {z(900, 8192)}, gen::integers(0, z(49, 8191)))},
      [](Context&, X x) { return embedding(x[0], x[1]); }, true));
  cs.push_back(mt(
      "concat_pad_repeat_mt", {Op::CONCAT, Op::PAD, Op::REPEAT},
      {in("a", {z(48, 256), z(515, 2048)}),
       with(in("b", {z(48, 256), z(515, 2048)}), Layout::transposed)},
      [](Context&, X x) {
        return repeat(pad(concat({x[0], x[1]}, 0), {1, 2, 0, 1}), {1, 2});
      },
      true));
}

void add_conv_mt(std::vector<Case>& cs, Sz z) {
  const int64_t B = z(4, 16), C = z(8, 32), H = z(24, 64);
  cs.push_back(mt(
      "conv2d_mt", {Op::CONV2D},
      {in("x", {B, C, H, H}), in("w", {16, C, 3, 3}, gen::uniform(-0.3, 0.3)), in("b", {16})},
      [](Context&, X x) {
        Conv2dOptions o;
        o.padding[0] = o.padding[1] = 1;
        return conv2d(x[0], x[1], x[2], o);
      },
      true));
  auto pool = [](bool is_max) {
    return [is_max](Context&, X x) {
      Pool2dOptions o;
      o.kernel[0] = o.kernel[1] = 3;
      o.stride[0] = o.stride[1] = 2;
      o.padding[0] = o.padding[1] = 1;
      return is_max ? max_pool2d(x[0], o) : avg_pool2d(x[0], o);
    };
  };
  cs.push_back(mt("max_pool2d_mt", {Op::MAX_POOL2D},
                  {in("x", {B, 2 * C, H + 8, H + 8}, gen::distinct(-3, 3))}, pool(true), true));
  cs.push_back(mt("avg_pool2d_mt", {Op::AVG_POOL2D},
                  {with(in("x", {B, 2 * C, H + 8, H + 8}), Layout::transposed)}, pool(false),
                  true));
}

}  // namespace

void add_thread_cases(std::vector<Case>& cs, Sz z) {
  add_elementwise_mt(cs, z);
  add_reduce_mt(cs, z);
  add_nn_mt(cs, z);
  add_conv_mt(cs, z);
}

}  // namespace kiln::test
