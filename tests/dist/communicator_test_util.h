// Shared by the communicator tests: device-agnostic buffers, the ways the tests start MPI (as
// mpirun children or as a singleton child process), and the checks that every backend runs.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "zaya/core/tensor.h"
#include "zaya/dist/communicator.h"

namespace zaya::dist::test_support {

// A buffer on the communicator's device (a Tensor there), filled from a host vector and read back
// into it, so the same checks run on host buffers (MPI) and device buffers (NCCL).
template <class T>
class Buf {
 public:
  Buf(const Communicator& c, std::vector<T> init) : host_(std::move(init)), t_(host_view().to(c.device())) {}
  Buf(const Communicator& c, size_t n, T fill) : Buf(c, std::vector<T>(n, fill)) {}
  T* data() { return static_cast<T*>(t_.raw()); }
  // The contents as they are now.
  const std::vector<T>& get() {
    host_view().copy_from(t_);
    return host_;
  }

 private:
  Tensor host_view() {
    return Tensor::borrow(host_.data(), Shape{static_cast<int64_t>(host_.size())}, dtype_of<T>::value);
  }
  std::vector<T> host_;
  Tensor t_;
};

// MpiSelf.* run only as ranks of `mpirun` started by MpiIntegration.CommunicatorOps (2 and 3
// ranks) or MpiIntegration.MeshOnFourRanks, which set ZAYA_MPI_SELF_TEST.
inline bool is_mpi_child() { return std::getenv("ZAYA_MPI_SELF_TEST") != nullptr; }

// The MPI world every MpiSelf.* test of one child process shares: MPI cannot start again in a
// process that finalized it, so the communicator (and MPI) lives until the process exits.
inline Communicator& mpi_self_world() {
  static std::unique_ptr<Communicator> world = make_mpi_communicator({.timeout_s = 20});
  return *world;
}

// The tests that start MPI in-process (a singleton: no launcher) run their checks in a child
// process, this test binary again filtered to the same test, with ZAYA_MPI_SINGLETON_CHILD set. The
// parent stays free of MPI: MPI cannot start again in a process that finalized it, and a singleton
// start leaves OMPI_/PMIX_ variables in the environment that break later mpirun launches from the
// same process (MpiIntegration.*, when the binary runs whole). Isolated singleton: no runtime
// daemon to start, which a bare GPU image lacks.
inline bool is_singleton_child() { return std::getenv("ZAYA_MPI_SINGLETON_CHILD") != nullptr; }

inline std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

// Runs this binary's test `name` as a singleton child; expects it to pass (not skip).
inline void run_as_singleton_child(const std::string& name) {
  const test::CliRun run = test::run_shell("ZAYA_MPI_SINGLETON_CHILD=1 OMPI_MCA_ess_singleton_isolated=1 " +
                                           self_exe() + " --gtest_filter=" + name);
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("[  PASSED  ] 1 test."), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("SKIPPED"), std::string::npos) << run.output;
}

// `mpirun --oversubscribe -np N` with the variables OpenMPI needs to run as root (scripts/env.sh
// sets them too; the tests must not depend on it).
inline std::string mpirun(int np, const std::string& extra = "") {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe " + extra + " -np " +
         std::to_string(np) + " ";
}

// The checks, for any world size n >= 1 (those that need a peer are skipped for n = 1).
void check_every_operation(Communicator& c);  // communicator_test.cc
void check_nonblocking(Communicator& c);      // nonblocking_test.cc
void check_meshes(Communicator& world);       // mesh_test.cc: every dp × cp shape of the world
void check_variable_counts(Communicator& c);  // variable_count_test.cc: reduce_scatter_v, all_gather_v

}  // namespace zaya::dist::test_support
