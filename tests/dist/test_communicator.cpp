// kiln/dist.h in a single process (how every test binary runs: not under an MPI
// launcher): rank 0 of 1, collectives leave values as they are, bad input is a
// kiln::Error, and DataParallel trains exactly like no hook at all.
// tests/dist_mpi runs the same API across processes under mpirun.
#include <gtest/gtest.h>

#include "../opt/opt_test_util.h"
#include "common/error_check.h"
#include "kiln/dist.h"

namespace kiln::test {
namespace {

TEST(Communicator, SingleProcessIsRankZeroOfOne) {
  if (dist::launched_by_mpi()) GTEST_SKIP() << "started by an MPI launcher";
  dist::Communicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_TRUE(comm.is_root());
  EXPECT_FALSE(comm.uses_mpi());
  comm.barrier();
  std::vector<double> d = {1.5, -2};
  comm.allreduce(std::span<double>(d), dist::ReduceOp::mean);
  EXPECT_EQ(d, (std::vector<double>{1.5, -2}));

  Context ctx;
  Tensor t = ctx.tensor(f32, {3}, "t");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  t.set<float>({1, 2, 3});
  comm.allreduce(t);
  comm.allreduce(t, dist::ReduceOp::mean);
  comm.broadcast(t);
  EXPECT_EQ(t.get<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(Communicator, TimeoutCanBeSet) {
  dist::Communicator comm;
  comm.set_timeout(2.5);
  EXPECT_EQ(comm.timeout(), 2.5);
}

TEST(Communicator, BadTensorsAreErrors) {
  dist::Communicator comm;
  Context ctx;
  Tensor h = ctx.tensor(f16, {4}, "half");
  Tensor i = ctx.tensor(i32, {4}, "ids");
  Tensor none = ctx.tensor(f32, {2}, "no_memory");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  Tensor late = ctx.tensor(f32, {2}, "late");
  EXPECT_KILN_ERROR(comm.allreduce(h), "dist", "f32", "'half'", "f16");
  EXPECT_KILN_ERROR(comm.allreduce(i, dist::ReduceOp::mean), "dist", "'ids'", "i32");
  EXPECT_KILN_ERROR(comm.allreduce(late), "dist", "'late'", "no memory");
  EXPECT_KILN_ERROR(comm.broadcast(late), "dist", "'late'", "no memory");
  EXPECT_KILN_ERROR(comm.allreduce(Tensor()), "dist", "undefined");
  (void)none;
}

// One rank: the hook adds nothing, so training is bit-identical to no hook.
TEST(DataParallel, OneRankTrainsLikeNoHook) {
  dist::Communicator comm;
  if (comm.size() != 1) GTEST_SKIP();
  Dataset data = make_blobs(192, 8);
  Mlp a(16), b(16);
  dist::DataParallel dp(comm, {.bucket_bytes = 64});
  OptConfig ca = a.config(32), cb = b.config(32);
  cb.parallel = &dp;
  OptContext oa(ca), ob(cb);
  a.init(3);
  b.init(3);
  FitOptions o;
  o.epochs = 2;
  o.progress = false;
  fit(oa, data, o);
  fit(ob, data, o);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(values(a.params()[k]), values(b.params()[k]));
  EXPECT_KILN_ERROR(OptContext(cb), "dist", "already serves");
}

}  // namespace
}  // namespace kiln::test
