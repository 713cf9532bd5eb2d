// The process mesh: shapes checked before any communication, and for every dp × cp shape of the
// world a collective on each axis whose result names the axis's members. Local here; MPI under
// mpirun with 2 and 3 ranks (MpiSelf.Mesh, started by MpiIntegration.CommunicatorOps) and 4 ranks
// (dp 2 × cp 2, MpiIntegration.MeshOnFourRanks); MPI and NCCL as singletons in communicator_test.cc.
#include "zaya/dist/mesh.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "communicator_test_util.h"
#include "test_util.h"

namespace zaya::dist {
using test_support::Buf;

namespace {

std::string error_of(Communicator& world, int dp, int cp) {
  try {
    Mesh m(world, dp, cp);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The world ranks of this rank's group on `axis`, learned by an all_gather over that axis (the
// started form, so the Works of a sub-communicator are covered too), and a sum over it.
std::vector<int32_t> members(Communicator& axis, int world_rank) {
  Buf<int32_t> mine(axis, {world_rank}), all(axis, axis.size(), -1);
  axis.start_all_gather(mine.data(), all.data(), 1, DType::i32).wait();
  return all.get();
}

void check_mesh(Communicator& world, int dp, int cp) {
  SCOPED_TRACE(str("mesh dp ", dp, " x cp ", cp, " on rank ", world.rank()));
  Mesh mesh(world, dp, cp);
  const int me = world.rank();
  ASSERT_EQ(mesh.dp_size(), dp);
  ASSERT_EQ(mesh.cp_size(), cp);
  ASSERT_EQ(mesh.dp().size(), dp);
  ASSERT_EQ(mesh.cp().size(), cp);
  EXPECT_EQ(Mesh::world_rank(mesh.dp_rank(), mesh.cp_rank(), cp), me);
  EXPECT_EQ(mesh.dp().rank(), mesh.dp_rank());
  EXPECT_EQ(mesh.cp().rank(), mesh.cp_rank());
  EXPECT_EQ(mesh.dp().backend(), world.backend());
  EXPECT_EQ(mesh.cp().device(), world.device());
  // cp is the fastest-varying axis: a cp group is consecutive world ranks, a dp group strided by cp.
  std::vector<int32_t> cp_expected, dp_expected;
  for (int j = 0; j < cp; ++j) cp_expected.push_back(mesh.dp_rank() * cp + j);
  for (int j = 0; j < dp; ++j) dp_expected.push_back(j * cp + mesh.cp_rank());
  EXPECT_EQ(members(mesh.cp(), me), cp_expected);
  EXPECT_EQ(members(mesh.dp(), me), dp_expected);
  // A reduction on each axis sums exactly its members.
  Buf<int64_t> v(world, {me}), w(world, {me});
  mesh.dp().all_reduce(v.data(), v.data(), 1, DType::i64);
  mesh.cp().all_reduce(w.data(), w.data(), 1, DType::i64);
  int64_t dp_sum = 0, cp_sum = 0;
  for (int r : dp_expected) dp_sum += r;
  for (int r : cp_expected) cp_sum += r;
  EXPECT_EQ(v.get()[0], dp_sum);
  EXPECT_EQ(w.get()[0], cp_sum);
  world.barrier();
}

}  // namespace

void test_support::check_meshes(Communicator& world) {
  const int n = world.size();
  for (int dp = 1; dp <= n; ++dp)
    if (n % dp == 0) check_mesh(world, dp, n / dp);
  // Bad shapes are refused on every rank alike, before any communication, naming the sizes.
  EXPECT_NE(error_of(world, 0, n).find("dp and cp must be positive, found dp = 0, cp = " + std::to_string(n)),
            std::string::npos);
  EXPECT_NE(error_of(world, n, -1).find("found dp = " + std::to_string(n) + ", cp = -1"), std::string::npos);
  EXPECT_NE(error_of(world, n + 1, 1).find(str("dp × cp = ", n + 1, " × 1 = ", n + 1, " ranks, but the world has ", n)),
            std::string::npos)
      << error_of(world, n + 1, 1);
  EXPECT_NE(error_of(world, n, 2).find(str(" = ", 2 * n, " ranks, but the world has ", n)), std::string::npos);
  world.barrier();
}

TEST(LocalMesh, OneByOneAndBadShapes) {
  auto c = make_local_communicator();
  test_support::check_meshes(*c);
  EXPECT_NE(error_of(*c, 2, 1).find("dp × cp = 2 × 1 = 2 ranks, but the world has 1"), std::string::npos)
      << error_of(*c, 2, 1);
}

TEST(MpiSelf, Mesh) {
  if (!test_support::is_mpi_child()) GTEST_SKIP() << "runs only as an mpirun child of MpiIntegration.CommunicatorOps";
  Communicator& c = test_support::mpi_self_world();
  ASSERT_GE(c.size(), 2);
  test_support::check_meshes(c);
}

TEST(MpiIntegration, MeshOnFourRanks) {
  const test::CliRun r = test::run_shell(test_support::mpirun(4, "-x ZAYA_MPI_SELF_TEST=1") + test_support::self_exe() +
                                         " --gtest_filter=MpiSelf.Mesh --gtest_brief=1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("SKIPPED"), std::string::npos) << r.output;
}

}  // namespace zaya::dist
