// Module::save / load: round trips, strict and non-strict loading, and that a
// failed load (name, shape, dtype, corrupt file) leaves the model untouched.
#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "nn_test_util.h"

namespace kiln::test {
namespace {

// fc1 -> fc2, optionally with an extra head (names the other model lacks).
struct Net : nn::Module {
  nn::Linear& fc1;
  nn::Linear& fc2;
  Net(Context& ctx, int64_t hidden = 4, bool head = false)
      : Module(ctx),
        fc1(add<nn::Linear>("fc1", 3, hidden)),
        fc2(add<nn::Linear>("fc2", hidden, 2)) {
    if (head) add<nn::Linear>("head", 2, 2);
  }
};

std::vector<std::vector<float>> values_of(const nn::Module& m) {
  std::vector<std::vector<float>> v;
  for (Tensor t : m.parameters()) v.push_back(t.get<float>());
  return v;
}

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Models {
  Context ctx;
  CpuBackend cpu{1};
  template <class... A>
  std::unique_ptr<Net> make(uint64_t seed, A... args) {
    auto n = std::make_unique<Net>(ctx, args...);
    n->allocate(cpu);
    n->init(seed);
    return n;
  }
};

TEST(NnStateDict, SaveThenLoadRestoresEveryParamByName) {
  kiln_test::TempDir dir;
  Models m;
  auto a = m.make(1), b = m.make(2);
  ASSERT_NE(values_of(*a), values_of(*b));
  a->save(dir.file("net.gguf"));
  GgufFile f(dir.file("net.gguf"));
  std::vector<std::string> names;
  for (const GgufTensorInfo& i : f.tensors()) names.push_back(i.name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  const auto r = b->load(dir.file("net.gguf"));
  EXPECT_TRUE(r.missing.empty() && r.unexpected.empty());
  EXPECT_EQ(values_of(*b), values_of(*a));
}

TEST(NnStateDict, TiedWeightsAreStoredOnce) {
  kiln_test::TempDir dir;
  Context ctx;
  CpuBackend cpu(1);
  struct Tied : nn::Module {
    nn::Embedding& wte;
    nn::Linear& lm_head;
    explicit Tied(Context& c)
        : Module(c),
          wte(add<nn::Embedding>("wte", 5, 3)),
          lm_head(add<nn::Linear>("lm_head", 3, 5, false)) {
      lm_head.tie("weight", wte.weight());
    }
  } a(ctx), b(ctx);
  a.allocate(cpu);
  b.allocate(cpu);
  a.init(1);
  a.save(dir.file("tied.gguf"));
  EXPECT_EQ(GgufFile(dir.file("tied.gguf")).tensors().size(), 1u);
  b.load(dir.file("tied.gguf"));
  EXPECT_EQ(b.lm_head.weight().get<float>(), a.wte.weight().get<float>());
}

TEST(NnStateDict, StrictLoadNamesTheFirstMismatchAndChangesNothing) {
  kiln_test::TempDir dir;
  Models m;
  auto small = m.make(1), big = m.make(2, 4, true), wide = m.make(3, 5);
  small->save(dir.file("small.gguf"));
  big->save(dir.file("big.gguf"));
  wide->save(dir.file("wide.gguf"));

  auto target = m.make(4);
  const auto before = values_of(*target);
  EXPECT_NE(
      error_of([&] {
        target->load(dir.file("big.gguf"));
      }).find("load " + dir.file("big.gguf") + ": unexpected 'head.weight' [2, 2] in the file"),
      std::string::npos);
  EXPECT_EQ(values_of(*target), before);  // fc1 and fc2 matched, but nothing was loaded

  auto with_head = m.make(5, 4, true);
  const auto before_head = values_of(*with_head);
  EXPECT_NE(error_of([&] {
              with_head->load(dir.file("small.gguf"));
            }).find("the file has no 'head.weight' [2, 2]"),
            std::string::npos);
  EXPECT_EQ(values_of(*with_head), before_head);

  // A shape mismatch fails also without strict (as in PyTorch).
  for (bool strict : {true, false}) {
    EXPECT_NE(error_of([&] {
                target->load(dir.file("wide.gguf"), strict);
              }).find("'fc1.weight' is [5, 3] in the file but [4, 3] in the model"),
              std::string::npos);
    EXPECT_EQ(values_of(*target), before);
  }
}

TEST(NnStateDict, DtypeMismatchIsNamed) {
  kiln_test::TempDir dir;
  Models m;
  auto target = m.make(1);
  GgufWriter w;
  for (auto& [name, t] : target->state_dict()) {
    std::vector<uint8_t> bytes(size_t(t.numel()) * 2);
    w.add_tensor_data(name, name == "fc2.weight" ? f16 : f32, t.shape(),
                      name == "fc2.weight" ? bytes : std::vector<uint8_t>(size_t(t.numel()) * 4));
  }
  w.save(dir.file("f16.gguf"));
  const auto before = values_of(*target);
  EXPECT_NE(error_of([&] {
              target->load(dir.file("f16.gguf"));
            }).find("'fc2.weight' is f16 in the file but f32 in the model"),
            std::string::npos);
  EXPECT_EQ(values_of(*target), before);
}

TEST(NnStateDict, NonStrictLoadsWhatMatchesAndListsTheRest) {
  kiln_test::TempDir dir;
  Models m;
  auto big = m.make(1, 4, true);
  big->save(dir.file("big.gguf"));
  auto small = m.make(2);
  const auto r = small->load(dir.file("big.gguf"), /*strict=*/false);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"head.weight", "head.bias"}));
  EXPECT_EQ(small->fc1.weight().get<float>(), big->fc1.weight().get<float>());
  EXPECT_EQ(small->fc2.bias().get<float>(), big->fc2.bias().get<float>());

  auto with_head = m.make(3, 4, true);
  const std::vector<float> head_before = with_head->parameter("head.weight").get<float>();
  small->save(dir.file("small.gguf"));
  const auto r2 = with_head->load(dir.file("small.gguf"), false);
  EXPECT_EQ(r2.missing, (std::vector<std::string>{"head.weight", "head.bias"}));
  EXPECT_TRUE(r2.unexpected.empty());
  EXPECT_EQ(with_head->parameter("head.weight").get<float>(), head_before);
  EXPECT_EQ(with_head->fc1.weight().get<float>(), small->fc1.weight().get<float>());
}

TEST(NnStateDict, CorruptFilesAndBadUseFailCleanly) {
  kiln_test::TempDir dir;
  Models m;
  auto a = m.make(1);
  a->save(dir.file("net.gguf"));
  // Cut the file short (into the tensor data): the reader rejects it before
  // anything is written.
  const auto size = std::filesystem::file_size(dir.file("net.gguf"));
  std::filesystem::copy_file(dir.file("net.gguf"), dir.file("cut.gguf"));
  std::filesystem::resize_file(dir.file("cut.gguf"), size - 40);
  auto b = m.make(2);
  const auto before = values_of(*b);
  EXPECT_NE(error_of([&] { b->load(dir.file("cut.gguf")); }).find("[gguf]"), std::string::npos);
  EXPECT_EQ(values_of(*b), before);
  EXPECT_NE(error_of([&] { b->load(dir.file("missing.gguf")); }).find("missing.gguf"),
            std::string::npos);
  EXPECT_NE(error_of([&] { a->save(dir.file("net.bin")); }).find("unknown model file extension"),
            std::string::npos);
  Net unallocated(m.ctx);
  EXPECT_NE(error_of([&] { unallocated.load(dir.file("net.gguf")); }).find("has no memory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { unallocated.save(dir.file("x.gguf")); }).find("has no memory"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::test
