// The main of tessera_dist_tests: one MPI rank of a GoogleTest run that mpirun starts N times (ctest runs it with
// 2 and 4 ranks). Every rank runs every test in the same order, so the collectives inside them match; rank 0
// prints the usual report and the other ranks print only what fails on them, prefixed with their rank. The job
// fails when any rank fails.
#include <gtest/gtest.h>

#include <cstdio>

#include "dist_test_util.h"

namespace {

// Failures of a rank other than 0, each line prefixed with the rank.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.message());
    std::fflush(stderr);
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (!tessera::MpiWorld::launched_by_mpi()) {
    std::fprintf(stderr, "tessera_dist_tests: run me under mpirun (ctest does: mpirun -np 2|4 ...)\n");
    return 2;
  }
  tessera::MpiWorld world;
  tessera::test::world_slot() = &world;
  if (world.rank() != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world.rank()));
  }
  const int rc = RUN_ALL_TESTS();
  tessera::test::world_slot() = nullptr;
  return rc;
}
