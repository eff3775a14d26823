// The backend registry: list, pick by name, register.
#include <gtest/gtest.h>

#include <algorithm>

#include "kiln/cpu.h"
#include "kiln/ext/registry.h"

using namespace kiln;

TEST(Registry, ListsCpuLastAndBlasWhenBuiltWithIt) {
  const std::vector<std::string> names = backend_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.back(), "cpu");
  const bool blas = std::find(names.begin(), names.end(), "blas") != names.end();
#if KILN_HAVE_BLAS
  EXPECT_TRUE(blas);
  EXPECT_EQ(names.front(), "blas");
#else
  EXPECT_FALSE(blas);
#endif
  for (const BackendInfo& b : backend_list()) {
    EXPECT_FALSE(b.description.empty()) << b.name;
    EXPECT_TRUE(b.make) << b.name;
  }
}

TEST(Registry, MakesBackendsByNameCaseInsensitively) {
  std::unique_ptr<Backend> cpu = make_backend("CPU", {.n_threads = 1});
  ASSERT_NE(cpu, nullptr);
  EXPECT_STREQ(cpu->name(), "CPU");
  EXPECT_EQ(dynamic_cast<CpuBackend&>(*cpu).n_threads(), 1);
  EXPECT_TRUE(has_backend("Cpu"));
  EXPECT_FALSE(has_backend("tpu"));
#if KILN_HAVE_BLAS
  std::vector<std::unique_ptr<Backend>> two = make_backends("blas, cpu", {.n_threads = 1});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_STREQ(two[0]->name(), "BLAS");
  EXPECT_STREQ(two[1]->name(), "CPU");
#endif
}

TEST(Registry, UnknownNamesListWhatIsAvailable) {
  try {
    make_backend("tpu");
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[make_backend] unknown backend 'tpu' (available: "), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_backends(""), Error);
}

TEST(Registry, RegisteredBackendsCanBePreferred) {
  register_backend({"cpu1", "a one-thread CPU backend",
                    [](const BackendOptions&) -> std::unique_ptr<Backend> {
                      return std::make_unique<CpuBackend>(1);
                    }},
                   /*preferred=*/true);
  EXPECT_EQ(backend_names().front(), "cpu1");
  EXPECT_EQ(dynamic_cast<CpuBackend&>(*make_backend("cpu1", {.n_threads = 4})).n_threads(), 1);
  // Same name again: replaced, not duplicated.
  register_backend({"CPU1", "again", [](const BackendOptions&) -> std::unique_ptr<Backend> {
                      return std::make_unique<CpuBackend>(2);
                    }});
  const std::vector<std::string> names = backend_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "CPU1"), 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "cpu1"), 0);
  EXPECT_EQ(dynamic_cast<CpuBackend&>(*make_backend("cpu1")).n_threads(), 2);
  EXPECT_THROW(register_backend({"", "", nullptr}), Error);
}

// A backend whose memory is not the host's (as CUDA's): with host_fallback,
// make_backends adds the CPU after it; a list that has a host backend is kept.
TEST(Registry, HostFallbackAddsTheCpuAfterAnAcceleratorAlone) {
  struct DeviceMemory : BufferType {
    const char* name() const override { return "device-like"; }
    size_t alignment() const override { return 64; }
    bool is_host() const override { return false; }
    std::unique_ptr<Buffer> alloc(size_t size) override { return host_buffer_type().alloc(size); }
  };
  struct DeviceLike : CpuBackend {
    DeviceLike() : CpuBackend(1) {}
    BufferType& buffer_type() override {
      static DeviceMemory memory;
      return memory;
    }
  };
  register_backend({"devlike", "a backend with non-host memory",
                    [](const BackendOptions&) -> std::unique_ptr<Backend> {
                      return std::make_unique<DeviceLike>();
                    }});
  EXPECT_EQ(make_backends("devlike", {.n_threads = 1}).size(), 1u);
  const auto with_host = make_backends("devlike", {.n_threads = 1, .host_fallback = true});
  ASSERT_EQ(with_host.size(), 2u);
  EXPECT_TRUE(with_host[1]->buffer_type().is_host());
  EXPECT_STREQ(with_host[1]->name(), "CPU");
  EXPECT_EQ(make_backends("cpu", {.n_threads = 1, .host_fallback = true}).size(), 1u);
  EXPECT_EQ(make_backends("devlike cpu", {.n_threads = 1, .host_fallback = true}).size(), 2u);
}
