// kiln-mnist: trains and evaluates the MNIST models of ggml's MNIST example with
// kiln's training API (same setup: AdamW lr 1e-3, logical batch 1000, physical
// batch 500, 30 epochs, 5% validation), so results compare one to one.
//
//   kiln-mnist train --model fc|cnn [--epochs N] [--backend cpu|blas|cuda|blas,cpu]
//                    [--threads N] [--out FILE] [--resume FILE] [--data DIR]
//   kiln-mnist eval --model FILE [--backend ...] [--threads N] [--data DIR]
//   (both: [--tf32] f32 matmuls and convolutions on TF32 tensor cores with cuda)
//
// Both end with one summary line on stdout:
//   test_loss=0.0652 test_acc=98.01±0.14%        (train adds train_time_s=...)
// train also writes FILE (weights + optimizer state, resumable with --resume),
// and FILE's .csv (per-epoch loss/accuracy) and .svg (training curves) next to it.
// Exit codes: 0 ok, 1 error (kiln::Error message on stderr), 2 bad arguments.
//
// Under mpirun (mpirun -np N kiln-mnist train ...) the N processes train one
// model data-parallel (kiln/dist.h): the logical batch of 1000 is split among
// them (N must divide it), so results compare with one process; rank 0 prints
// and writes the files, the others stay quiet.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kiln/dist.h"
#include "kiln/kiln.h"
#include "kiln/opt.h"
#include "kiln/registry.h"
#include "mnist_data.h"
#include "model.h"
#include "report.h"

namespace {

constexpr int64_t kPhysicalBatch = 500;
constexpr int64_t kLogicalBatch = 1000;
constexpr double kValSplit = 0.05;

struct Args {
  std::string cmd;
  std::string model;  // train: fc|cnn; eval: the model file
  int64_t epochs = 30;
  std::string backend = "cpu";
  int threads = 0;
  std::string out, resume, data;
  uint64_t seed = 1;
  bool progress = true;
  bool tf32 = false;  // cuda: f32 matmuls on TF32 tensor cores
  std::string precision = "f32";
  kiln::DType matmul_precision() const { return precision == "bf16" ? kiln::bf16 : kiln::f32; }
};

// The command line (CLI11): `train` and `eval` subcommands. Returns false with
// *rc set when the program should end (help: 0, bad arguments: 2).
bool parse(int argc, char** argv, Args& a, int* rc) {
  CLI::App app{"kiln-mnist: trains and evaluates ggml's MNIST models with kiln"};
  app.require_subcommand(1);
  auto common = [&](CLI::App* c) {
    c->add_option("--backend", a.backend,
                  "cpu (default), blas, cuda, or several in order of preference (blas,cpu); "
                  "an accelerator alone gets the CPU after it for the ops it lacks");
    c->add_option("--threads", a.threads, "threads per backend (default: all hardware threads)")
        ->check(CLI::NonNegativeNumber);
    c->add_option(
        "--data", a.data,
        "directory of the MNIST IDX files (default data/mnist; see scripts/get-mnist.sh)");
    c->add_flag(
        "--quiet", [&](int64_t) { a.progress = false; }, "no progress bar");
    c->add_flag("--tf32", a.tf32,
                "with cuda: f32 matmuls (and the convolutions' products) on TF32 tensor cores "
                "(PyTorch's cuDNN default for convolutions); default full f32");
    c->add_option("--precision", a.precision,
                  "matmul precision: f32 (default) or bf16 (bf16 operands, f32 accumulation; "
                  "weights, gradients and optimizer state stay f32)")
        ->check(CLI::IsMember({"f32", "bf16"}));
  };
  CLI::App* train = app.add_subcommand("train", "train a model; writes FILE, FILE's .csv and .svg");
  train->add_option("--model", a.model, "fc or cnn")->check(CLI::IsMember({"fc", "cnn"}));
  train->add_option("--epochs", a.epochs, "epochs in total (default 30)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--out", a.out, "model file (default mnist-<model>.gguf)");
  train->add_option("--resume", a.resume,
                    "continue a run from a file saved by train (up to --epochs in total)");
  train->add_option("--seed", a.seed, "init and shuffle seed (default 1)");
  common(train);
  CLI::App* eval = app.add_subcommand("eval", "evaluate a model file on the test set");
  eval->add_option("--model", a.model, "model file written by train")->required();
  common(eval);
  try {
    app.parse(argc, argv);
    if (train->parsed() && a.model.empty() && a.resume.empty())
      throw CLI::RequiredError("--model (or --resume)");
  } catch (const CLI::ParseError& e) {
    *rc = app.exit(e) == 0 ? 0 : 2;
    return false;
  }
  a.cmd = train->parsed() ? "train" : "eval";
  return true;
}

// data/mnist relative to the working directory, else the source tree's.
std::string data_dir(const Args& a) {
  if (!a.data.empty()) return a.data;
  std::string d = mnist::kDefaultDir;
#ifdef KILN_SOURCE_DIR
  if (!std::filesystem::exists(d + "/" + mnist::kTestImages)) {
    const std::string alt = std::string(KILN_SOURCE_DIR) + "/" + d;
    if (std::filesystem::exists(alt + "/" + mnist::kTestImages)) return alt;
  }
#endif
  return d;
}

// The backends named by --backend (one: it runs everything; several: the scheduler).
struct Backends {
  std::vector<std::unique_ptr<kiln::Backend>> owned;
  std::vector<kiln::Backend*> list;
  std::string names;
};
Backends make_backends(const Args& a) {
  Backends b;
  kiln::BackendOptions o;
  o.n_threads = a.threads;
  o.host_fallback = true;  // --backend cuda: the CPU runs the ops it lacks
  o.tf32 = a.tf32;
  b.owned = kiln::make_backends(a.backend, o);
  // Timings compare only at one TF32 setting: say which (docs/cuda.md).
  if (a.backend.find("cuda") != std::string::npos)
    std::fprintf(stderr, "kiln-mnist: cuda f32 matmuls %s\n",
                 a.tf32 ? "on TF32 (--tf32)" : "in full f32");
  for (auto& p : b.owned) {
    b.list.push_back(p.get());
    b.names += (b.names.empty() ? "" : ",") + std::string(p->name());
  }
  return b;
}

// With several backends: which ops of the training graph run on a backend
// other than the first (the preferred one), e.g. CPU fallbacks of --backend cuda.
void report_placement(const kiln::OptContext& opt, const Backends& be) {
  if (be.list.size() < 2) return;
  std::string elsewhere;
  for (kiln::TensorNode* n : opt.graph().nodes()) {
    const kiln::Op op = kiln::Tensor(n).op();
    const kiln::OpKind k = kiln::op_kind(op);
    kiln::Backend* b = opt.backend_of(n);
    if ((k != kiln::OpKind::COMPUTE && k != kiln::OpKind::ALIAS) || !b || b == be.list[0]) continue;
    const std::string item = std::string(kiln::op_name(op)) + " (" + b->name() + ")";
    if (elsewhere.find(item) == std::string::npos)
      elsewhere += (elsewhere.empty() ? "" : ", ") + item;
  }
  std::fprintf(stderr, "kiln-mnist: ops not on %s: %s\n", be.list[0]->name(),
               elsewhere.empty() ? "none" : elsewhere.c_str());
}

std::string summary(const kiln::Result& r) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "test_loss=%.4f test_acc=%.2f\u00b1%.2f%%", r.loss(),
                100 * r.accuracy(), 100 * r.accuracy_unc());
  return buf;
}

mnist::EpochRow row_of(const kiln::EpochResult& e) {
  mnist::EpochRow r;
  r.epoch = e.epoch + 1;
  r.train_loss = e.train.loss();
  r.train_loss_unc = e.train.loss_unc();
  r.train_acc = 100 * e.train.accuracy();
  r.train_acc_unc = 100 * e.train.accuracy_unc();
  r.val_loss = e.val.loss();
  r.val_loss_unc = e.val.loss_unc();
  r.val_acc = 100 * e.val.accuracy();
  r.val_acc_unc = 100 * e.val.accuracy_unc();
  r.seconds = e.seconds;
  return r;
}

std::string model_kind_of(const std::string& path) {
  kiln::GgufFile f(path);
  const kiln::GgufValue* v = f.find("kiln.mnist.model");
  if (!v) kiln::fail("mnist", path, ": not a kiln-mnist model (no kiln.mnist.model key)");
  return v->as_string();
}

// Per rank: the logical batch 1000 split among the ranks, physical <= 500.
struct Batches {
  int64_t physical, logical;
};
Batches batches_for(int ranks) {
  if (kLogicalBatch % ranks != 0)
    kiln::fail("mnist", "the logical batch ", kLogicalBatch, " does not split among ", ranks,
               " ranks");
  const int64_t logical = kLogicalBatch / ranks;
  return {std::min(kPhysicalBatch, logical), logical};
}

int train(const Args& a, kiln::dist::Communicator& comm) {
  const bool root = comm.rank() == 0;
  std::string kind = a.model;
  if (!a.resume.empty()) {
    const std::string saved = model_kind_of(a.resume);
    if (!kind.empty() && kind != saved)
      kiln::fail("mnist", a.resume, " holds a '", saved, "' model, not '", kind, "'");
    kind = saved;
  }
  const std::string out = a.out.empty() ? "mnist-" + kind + ".gguf" : a.out;
  const std::string dir = data_dir(a);
  kiln::Dataset train_set = mnist::load_train(dir);
  kiln::Dataset test_set = mnist::load_test(dir);

  Backends be = make_backends(a);
  const Batches bs = batches_for(comm.size());
  mnist::Model m = mnist::Model::build(kind, bs.physical, a.matmul_precision());
  kiln::dist::DataParallel dp(comm);
  kiln::OptConfig cfg;
  cfg.inputs = m.images;
  cfg.outputs = m.logits;
  cfg.loss = kiln::LossKind::cross_entropy;
  cfg.model = m.net.get();
  cfg.logical_batch = bs.logical;
  cfg.backends = be.list;  // AdamW with default parameters (lr 1e-3)
  cfg.parallel = &dp;
  kiln::OptContext opt(cfg);
  report_placement(opt, be);
  std::vector<mnist::EpochRow> rows;
  if (a.resume.empty()) {
    m.net->init(a.seed);  // the params have memory now (the context's)
  } else {
    opt.load(a.resume);
    for (const mnist::EpochRow& r : mnist::read_csv(mnist::sibling(a.resume, ".csv")))
      if (r.epoch <= opt.epoch()) rows.push_back(r);
    if (root)
      std::fprintf(stderr, "kiln-mnist: resumed %s at epoch %lld (step %lld)\n", a.resume.c_str(),
                   (long long)opt.epoch(), (long long)opt.step());
  }
  const std::string threads = a.threads > 0 ? std::to_string(a.threads) : "all";
  if (root) {
    std::fprintf(
        stderr,
        "kiln-mnist: model %s, backend %s, threads %s, batch %lld (logical %lld), %lld epochs\n",
        kind.c_str(), be.names.c_str(), threads.c_str(), (long long)bs.physical,
        (long long)bs.logical, (long long)a.epochs);
    if (comm.size() > 1)
      std::fprintf(stderr, "kiln-mnist: %d ranks (MPI), batch per step %lld in all\n", comm.size(),
                   (long long)(bs.logical * comm.size()));
    std::fprintf(
        stderr,
        "kiln-mnist: memory: %.1f MiB params/gradients/optimizer state/inputs, %.1f MiB graph\n",
        double(opt.static_bytes()) / (1 << 20), double(opt.memory_plan().buffer_size) / (1 << 20));
  }

  kiln::FitOptions fo;
  fo.epochs = a.epochs;
  fo.val_split = kValSplit;
  fo.seed = a.seed;
  fo.progress = a.progress;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<kiln::EpochResult> history = kiln::fit(opt, train_set, fo);
  const double train_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const kiln::EpochResult& e : history) rows.push_back(row_of(e));

  opt.save(out, true, {{"kiln.mnist.model", kiln::GgufValue(kind)}});  // rank 0 writes
  if (root) {
    mnist::write_csv(mnist::sibling(out, ".csv"), rows);
    mnist::write_svg(mnist::sibling(out, ".svg"), rows, "kiln-mnist " + kind);
  }
  const kiln::Result test = kiln::evaluate(opt, test_set, test_set.all());
  if (root) std::printf("%s train_time_s=%.2f\n", summary(test).c_str(), train_s);
  return 0;
}

int eval(const Args& a, kiln::dist::Communicator& comm) {
  const std::string kind = model_kind_of(a.model);
  kiln::Dataset test_set = mnist::load_test(data_dir(a));
  Backends be = make_backends(a);
  mnist::Model m =
      mnist::Model::build(kind, batches_for(comm.size()).physical, a.matmul_precision());
  kiln::dist::DataParallel dp(comm);  // each rank evaluates its share
  kiln::OptConfig cfg;
  cfg.parallel = &dp;
  cfg.inputs = m.images;
  cfg.outputs = m.logits;
  cfg.model = m.net.get();
  cfg.backends = be.list;
  cfg.forward_only = true;
  kiln::OptContext opt(cfg);
  opt.load(a.model, /*with_optimizer_state=*/false);
  const kiln::Result test =
      kiln::evaluate(opt, test_set, test_set.all(), a.progress && comm.rank() == 0);
  if (comm.rank() == 0) std::printf("%s\n", summary(test).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  int rc = 0;
  if (!parse(argc, argv, a, &rc)) return rc;
  // One process, or every process of an mpirun job.
  kiln::dist::Communicator comm;
  try {
    return a.cmd == "train" ? train(a, comm) : eval(a, comm);
  } catch (const kiln::Error& e) {
    // Under mpirun the other ranks would wait for this one: end them all.
    if (comm.size() > 1) comm.abort(std::string("kiln-mnist: ") + e.what());
    std::fprintf(stderr, "kiln-mnist: %s\n", e.what());
    return 1;
  }
}
