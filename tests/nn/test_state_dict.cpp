// Module::save / load in both formats (.gguf, .safetensors): round trips,
// strict and non-strict loading, and that a failed load (name, shape, dtype,
// corrupt file) leaves the model untouched.
#include <filesystem>
#include <fstream>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "nn_test_util.h"

namespace kiln::test {
namespace {

// fc1 -> fc2, optionally with an extra head (names the other model lacks).
struct StateDictNet : nn::Module {
  nn::Linear& fc1;
  nn::Linear& fc2;
  StateDictNet(Context& ctx, int64_t hidden = 4, bool head = false)
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

struct Models {
  Context ctx;
  CpuBackend cpu{1};
  template <class... A>
  std::unique_ptr<StateDictNet> make(uint64_t seed, A... args) {
    auto n = std::make_unique<StateDictNet>(ctx, args...);
    n->allocate(cpu);
    n->init(seed);
    return n;
  }
};

// The parameter is the file extension: ".gguf" or ".safetensors".
class NnStateDict : public ::testing::TestWithParam<std::string> {
 protected:
  std::string file(const std::string& stem) const { return dir_.file(stem + GetParam()); }
  // "[gguf]" or "[safetensors]": how the format's reader starts its errors.
  std::string reader_tag() const { return "[" + GetParam().substr(1) + "]"; }

 private:
  kiln_test::TempDir dir_;
};

TEST_P(NnStateDict, SaveThenLoadRestoresEveryParamByName) {
  Models m;
  auto a = m.make(1), b = m.make(2);
  ASSERT_NE(values_of(*a), values_of(*b));
  a->save(file("net"));
  std::vector<std::string> names;
  const auto reader = open_state_dict(file("net"));
  for (const TensorInfo& i : reader->tensors()) names.push_back(i.name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  const auto r = b->load(file("net"));
  EXPECT_TRUE(r.missing.empty() && r.unexpected.empty());
  EXPECT_EQ(values_of(*b), values_of(*a));
}

TEST_P(NnStateDict, FileLoadsWithTheGenericStateDictApi) {
  Models m;
  auto a = m.make(1);
  a->save(file("net"));
  Context ctx;
  Tensor w = ctx.tensor(f32, {2, 4}, "w");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  const std::vector<NamedTensor> want = {{"fc2.weight", w}};
  const std::vector<std::string> unused = load_state_dict(file("net"), want);
  EXPECT_EQ(unused, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.bias"}));
  EXPECT_EQ(w.get<float>(), a->fc2.weight().get<float>());
}

TEST_P(NnStateDict, TiedWeightsAreStoredOnce) {
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
  a.save(file("tied"));
  EXPECT_EQ(open_state_dict(file("tied"))->tensors().size(), 1u);
  b.load(file("tied"));
  EXPECT_EQ(b.lm_head.weight().get<float>(), a.wte.weight().get<float>());
}

TEST_P(NnStateDict, StrictLoadNamesTheMissingOrUnexpectedKeyAndChangesNothing) {
  Models m;
  auto small = m.make(1), big = m.make(2, 4, true);
  small->save(file("small"));
  big->save(file("big"));

  auto target = m.make(4);
  const auto before = values_of(*target);
  EXPECT_NE(kiln_test::error_message([&] {
              target->load(file("big"));
            }).find("[nn] load " + file("big") + ": unexpected 'head.weight' [2, 2] in the file"),
            std::string::npos);
  EXPECT_EQ(values_of(*target), before);  // fc1 and fc2 matched, but nothing was loaded

  auto with_head = m.make(5, 4, true);
  const auto before_head = values_of(*with_head);
  EXPECT_NE(kiln_test::error_message([&] {
              with_head->load(file("small"));
            }).find("[nn] load " + file("small") + ": the file has no 'head.weight' [2, 2]"),
            std::string::npos);
  EXPECT_EQ(values_of(*with_head), before_head);
}

TEST_P(NnStateDict, ShapeMismatchIsNamedAndChangesNothingAlsoWhenNotStrict) {
  Models m;
  m.make(3, 5)->save(file("wide"));  // fc1 [5, 3], fc2 [2, 5]
  auto target = m.make(4);           // fc1 [4, 3], fc2 [2, 4]
  const auto before = values_of(*target);
  for (bool strict : {true, false}) {  // as in PyTorch, shapes must match either way
    const std::string e = kiln_test::error_message([&] { target->load(file("wide"), strict); });
    EXPECT_NE(e.find(reader_tag() + " " + file("wide") + ": tensor 'fc1.weight' is "),
              std::string::npos)
        << e;
    EXPECT_NE(
        e.find("[5, 3] in the file but target " + target->fc1.weight().label() + " is f32 [4, 3]"),
        std::string::npos)
        << e;
    EXPECT_EQ(values_of(*target), before);
  }
}

TEST_P(NnStateDict, DtypeMismatchIsNamedAndChangesNothing) {
  Models m;
  auto target = m.make(1);
  // The model's names and shapes, fc2.weight stored as f16.
  Context ctx;
  std::vector<NamedTensor> sd;
  for (auto& [name, t] : target->state_dict())
    sd.push_back({name, ctx.tensor(name == "fc2.weight" ? f16 : f32, t.shape(), name)});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  save_state_dict(file("f16"), sd);

  const auto before = values_of(*target);
  const std::string e = kiln_test::error_message([&] { target->load(file("f16")); });
  EXPECT_NE(e.find("tensor 'fc2.weight' is "), std::string::npos) << e;
  EXPECT_NE(
      e.find("[2, 4] in the file but target " + target->fc2.weight().label() + " is f32 [2, 4]"),
      std::string::npos)
      << e;
  EXPECT_EQ(values_of(*target), before);
}

TEST_P(NnStateDict, NonStrictLoadsWhatMatchesAndListsTheRest) {
  Models m;
  auto big = m.make(1, 4, true);
  big->save(file("big"));
  auto small = m.make(2);
  const auto r = small->load(file("big"), /*strict=*/false);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"head.weight", "head.bias"}));
  EXPECT_EQ(small->fc1.weight().get<float>(), big->fc1.weight().get<float>());
  EXPECT_EQ(small->fc2.bias().get<float>(), big->fc2.bias().get<float>());

  auto with_head = m.make(3, 4, true);
  const std::vector<float> head_before = with_head->parameter("head.weight").get<float>();
  small->save(file("small"));
  const auto r2 = with_head->load(file("small"), false);
  EXPECT_EQ(r2.missing, (std::vector<std::string>{"head.weight", "head.bias"}));
  EXPECT_TRUE(r2.unexpected.empty());
  EXPECT_EQ(with_head->parameter("head.weight").get<float>(), head_before);
  EXPECT_EQ(with_head->fc1.weight().get<float>(), small->fc1.weight().get<float>());
}

TEST_P(NnStateDict, CorruptFilesFailWithTheReadersErrorAndChangeNothing) {
  Models m;
  auto a = m.make(1);
  a->save(file("net"));
  const std::string saved = file("net");
  auto b = m.make(2);
  const auto before = values_of(*b);
  auto expect_rejected = [&](const std::string& path) {
    const std::string e = kiln_test::error_message([&] { b->load(path); });
    EXPECT_NE(e.find(reader_tag() + " " + path + ": "), std::string::npos) << e;
    EXPECT_EQ(values_of(*b), before) << path;
  };
  // Cut short, into the tensor data (fc2's 40 bytes; GGUF pads after them).
  std::filesystem::copy_file(saved, file("cut"));
  std::filesystem::resize_file(file("cut"), std::filesystem::file_size(saved) - 40);
  expect_rejected(file("cut"));
  // One byte more than the tensors cover.
  std::filesystem::copy_file(saved, file("long"));
  std::ofstream(file("long"), std::ios::binary | std::ios::app) << 'x';
  if (GetParam() == ".safetensors") expect_rejected(file("long"));  // GGUF allows padding
  // Not a model file at all.
  std::ofstream(file("garbage"), std::ios::binary) << "this is not a model file, just some text";
  expect_rejected(file("garbage"));
  // Empty.
  std::ofstream(file("empty"), std::ios::binary).flush();
  expect_rejected(file("empty"));
}

TEST_P(NnStateDict, BadUseFailsCleanly) {
  Models m;
  auto a = m.make(1);
  a->save(file("net"));
  EXPECT_NE(kiln_test::error_message([&] { a->load(file("missing")); }).find(file("missing")),
            std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] {
              a->save(file("net") + ".bin");
            }).find("unknown model file extension"),
            std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] {
              a->load(file("net") + ".bin");
            }).find("unknown model file extension"),
            std::string::npos);
  StateDictNet unallocated(m.ctx);
  EXPECT_NE(kiln_test::error_message([&] { unallocated.load(file("net")); }).find("has no memory"),
            std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] { unallocated.save(file("x")); }).find("has no memory"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Formats, NnStateDict, ::testing::Values(".gguf", ".safetensors"),
                         [](const auto& info) { return info.param.substr(1); });

}  // namespace
}  // namespace kiln::test
