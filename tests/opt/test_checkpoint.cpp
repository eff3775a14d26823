// Checkpoints: a resumed run ends with the same parameters as an uninterrupted
// one; corrupt or mismatched files are kiln::Errors that leave the context as it
// was. Also: a non-finite loss stops training with an error naming the step.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "opt_test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

using kiln_test::TempDir;

FitOptions opts(int64_t epochs) {
  FitOptions o;
  o.epochs = epochs;
  o.progress = false;
  o.val_split = 0.1;
  o.seed = 77;
  return o;
}

OptConfig config_for(const Mlp& mlp, OptimizerType kind) {
  OptConfig c = mlp.config(60);
  c.optimizer = kind;
  OptimizerParams p;
  p.adamw.lr = 0.01f;
  p.sgd.lr = 0.05f;
  p.sgd.momentum = 0.9f;
  c.schedule = schedule::cosine(p, 5, 0.001f);  // depends on the step count and run length
  return c;
}

TEST(Checkpoint, ResumeEqualsUninterruptedRun) {
  TempDir dir;
  for (OptimizerType kind : {OptimizerType::adamw, OptimizerType::sgd}) {
    Dataset data = make_blobs(660, 8);
    // Uninterrupted: 4 epochs.
    Mlp full(30);
    OptContext a(config_for(full, kind));
    full.init(4);
    fit(a, data, opts(4));

    // The same run interrupted after 2 epochs and saved; a fresh model and
    // context load the file and continue.
    const std::string path = dir.file(std::string("ckpt_") + optimizer_name(kind) + ".gguf");
    {
      Mlp first(30);
      OptContext b(config_for(first, kind));
      first.init(4);
      FitOptions o = opts(4);
      o.on_epoch = [](const EpochResult& e) { return e.epoch < 1; };
      EXPECT_EQ(fit(b, data, o).size(), 2u);
      b.save(path, true, {{"kiln.test.note", GgufValue("half way")}});
    }
    Mlp resumed(30);
    OptContext c(config_for(resumed, kind));
    resumed.init(999);  // overwritten by the checkpoint
    GgufFile f = c.load(path);
    EXPECT_EQ(f.get("kiln.test.note").as_string(), "half way");
    EXPECT_EQ(c.epoch(), 2);
    EXPECT_EQ(c.step(), a.step() / 2);
    const auto h = fit(c, data, opts(4));
    EXPECT_EQ(h.size(), 2u);
    EXPECT_EQ(h.front().epoch, 2);
    EXPECT_EQ(c.step(), a.step());
    const auto pa = full.params(), pc = resumed.params();
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(values(pa[i]), values(pc[i])) << optimizer_name(kind) << " " << pa[i].name();
    const OptimizerState sa = a.state(full.w1), sc = c.state(resumed.w1);
    if (kind == OptimizerType::adamw) {
      EXPECT_EQ(values(sa.m), values(sc.m));
      EXPECT_EQ(values(sa.v), values(sc.v));
    } else {
      EXPECT_EQ(values(sa.buf), values(sc.buf));
    }
  }
}

TEST(Checkpoint, WeightsOnlyAndMismatches) {
  TempDir dir;
  Dataset data = make_blobs(120, 1);
  Mlp mlp(30);
  OptContext opt(config_for(mlp, OptimizerType::adamw));
  mlp.init(1);
  fit(opt, data, opts(1));
  const std::string weights = dir.file("w.gguf"), full = dir.file("full.gguf");
  opt.save(weights, false);
  opt.save(full);
  {
    GgufFile f(weights);
    EXPECT_EQ(f.tensors().size(), 4u);
    EXPECT_FALSE(f.has("kiln.opt.step"));
    GgufFile g(full);
    EXPECT_EQ(g.tensors().size(), 12u);
    EXPECT_EQ(g.get("kiln.opt.optimizer").as_string(), "adamw");
  }
  // SGD context vs an AdamW file.
  Mlp other(30);
  OptContext sgd(config_for(other, OptimizerType::sgd));
  other.init(2);
  const auto before = values(other.w1);
  EXPECT_THROW(sgd.load(full), Error);
  EXPECT_EQ(values(other.w1), before);
  sgd.load(full, false);  // weights only: fine
  EXPECT_EQ(values(other.w1), values(mlp.w1));
  // Other shapes: an error naming the tensor, nothing changed.
  Mlp wide(30, 32);
  OptContext w(config_for(wide, OptimizerType::adamw));
  wide.init(3);
  const auto wb = values(wide.b2);
  try {
    w.load(full);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w1'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(values(wide.b2), wb);
}

TEST(Checkpoint, CorruptFilesAreErrors) {
  TempDir dir;
  Dataset data = make_blobs(120, 1);
  Mlp mlp(30);
  OptContext opt(config_for(mlp, OptimizerType::adamw));
  mlp.init(1);
  fit(opt, data, opts(1));
  const std::string path = dir.file("good.gguf");
  opt.save(path);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 100u);
  const auto w1 = values(mlp.w1);
  auto write = [&](const std::string& b) {
    const std::string p = dir.file("bad.gguf");
    std::ofstream(p, std::ios::binary) << b;
    return p;
  };
  int errors = 0, cases = 0;
  // Truncations at many points before the end of the last tensor's data (the
  // alignment padding after it may go), and flipped bytes in the header.
  size_t data_end = 0;
  const GgufFile good(path);
  for (const GgufTensorInfo& t : good.tensors())
    data_end = std::max(data_end, size_t(t.offset + t.nbytes));
  ASSERT_LE(data_end, bytes.size());
  for (size_t cut = 0; cut < data_end; cut += std::max<size_t>(1, data_end / 97)) {
    ++cases;
    try {
      opt.load(write(bytes.substr(0, cut)));
      ADD_FAILURE() << "truncated to " << cut << " of " << bytes.size() << " bytes: no error";
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_EQ(errors, cases);
  for (size_t pos = 0; pos < 200 && pos < bytes.size(); pos += 3) {
    std::string b = bytes;
    b[pos] = char(b[pos] ^ 0x5a);
    try {
      opt.load(write(b));
    } catch (const Error&) {}
  }
  opt.load(path);  // the good file still loads
  EXPECT_EQ(values(mlp.w1), w1);
  EXPECT_THROW(opt.load(dir.file("missing.gguf")), Error);
}

TEST(Checkpoint, SaveMidAccumulationIsAnError) {
  TempDir dir;
  Dataset data = make_blobs(120, 1);
  Mlp mlp(30);
  OptContext opt(config_for(mlp, OptimizerType::adamw));
  mlp.init(1);
  data.get_batch(opt.inputs(), opt.labels(), 0);
  opt.train_batch();
  EXPECT_THROW(opt.save(dir.file("x.gguf")), Error);
  opt.save(dir.file("w.gguf"), false);  // weights alone are fine
  Mlp unnamed(30);
  unnamed.w1.set_name("");
  OptContext u(unnamed.config());
  EXPECT_THROW(u.save(dir.file("u.gguf")), Error);
}

TEST(Fit, NonFiniteLossStopsWithTheStep) {
  Dataset data = make_blobs(300, 1);
  data.data<float>()[2 * 250] = NAN;  // sample 250: in the 5th logical batch of 60 (step 4)
  Mlp mlp(30);
  OptContext opt(mlp.config(60));
  mlp.init(1);
  FitOptions o;
  o.epochs = 1;
  o.progress = false;
  o.shuffle = false;
  try {
    fit(opt, data, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[fit] loss is NaN at step 4", 0), 0u) << e.what();
  }
  EXPECT_EQ(opt.step(), 4);  // the bad batch was not stepped
  for (float x : values(mlp.w1)) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace kiln::test
