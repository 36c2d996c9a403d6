// A rank's place: its device, and the collectives at one rank — every element of a
// reduce-scatter mean and an all-gather arrives, for counts that divide by nothing a library
// splits its work by.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <vector>

#include "common/error.h"
#include "test_util.h"
#include "train/setup.h"

using namespace ptrain;

namespace {

// Counts: tiny, odd, just past powers of two, a large prime, a unit-like 69 x 256, and 4 Mi + 29.
// The last two are what NCCL's one-rank AVG kernel before 2.29.7 leaves short (it splits n over
// min(32, bytes / 16 KiB) blocks of floor(n / blocks) elements rounded up to 16 bytes: 4 float32
// elements unwritten of 17,664, 29 of 4,194,333).
const std::vector<int64_t> kCounts{1, 7, 33, 4099, 17664, 65543, 1000003, (int64_t{1} << 22) + 29};

// At one rank the mean over ranks of `in` is `in`, and the gathered buffer is `in`: compared
// bit for bit, into outputs pre-filled with a value no input holds, so an element never
// written shows.
void expect_every_element_moves(Collectives& comm, const c10::Device& device) {
  ASSERT_EQ(comm.world_size(), 1);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (int64_t n : kCounts) {
      at::manual_seed(n);
      const auto opts = at::TensorOptions().dtype(dtype).device(device);
      at::Tensor in = at::randn({n}).to(opts);
      at::Tensor mean = at::full({n}, 1000.0, opts);
      comm.reduce_scatter_mean_async(mean, in)->wait();
      at::Tensor gathered = at::full({n}, 1000.0, opts);
      comm.all_gather(gathered, in);
      EXPECT_TRUE(at::equal(mean.cpu(), in.cpu())) << "reduce-scatter mean, " << dtype << ", " << n << " elements";
      EXPECT_TRUE(at::equal(gathered.cpu(), in.cpu())) << "all-gather, " << dtype << ", " << n << " elements";
      at::Tensor in_place = in.clone();  // the rank's slot is the whole buffer: nothing may change
      comm.all_gather_in_place_async(in_place)->wait();
      EXPECT_TRUE(at::equal(in_place.cpu(), in.cpu())) << "all-gather in place, " << dtype << ", " << n << " elements";
    }
  // A host value (a step's loss, a token count) goes through the device and back.
  at::Tensor host = at::tensor({2.5, -7.0}, at::kDouble);
  comm.all_reduce_sum(host);
  EXPECT_TRUE(at::equal(host, at::tensor({2.5, -7.0}, at::kDouble)));
  EXPECT_EQ(sum_over_ranks(comm, 41, device), 41);
}

}  // namespace

TEST(Collectives, OneProcessMovesEveryElement) {
  expect_every_element_moves(*test::local_comm(), c10::Device(c10::kCPU));
}

// NCCL at one rank is what a single GPU with parallel.backend = "nccl" runs. Before NCCL
// 2.29.7 its one-rank AVG kernel left the tail of the buffer unwritten (NVIDIA/nccl#1950),
// which a mean over ranks must not reach.
TEST(Collectives, CudaNcclAtOneRankMovesEveryElement) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU on this machine: NCCL runs on the GPU machine";
  // One rank, its own store on a free port (the server is its only client).
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "0", 1);
  const DistEnv env;
  const c10::Device device(c10::kCUDA, 0);
  auto comm = make_collectives(env, Backend::nccl, device, 60.0);
  EXPECT_EQ(comm->name(), "nccl");
  expect_every_element_moves(*comm, device);
}

// Each rank trains on the GPU of its local rank: a local rank the node has no GPU for (more
// ranks per node than GPUs) is refused naming both, not left to an "invalid device ordinal".
TEST(Collectives, CudaLocalRankWithoutItsOwnGpuIsRefused) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: device resolution runs on the GPU machine";
  Config c;
  c.training.device = DeviceChoice::cuda;
  const int gpus = static_cast<int>(torch::cuda::device_count());
  DistEnv env;
  env.world_size = gpus + 1;
  env.rank = env.local_rank = gpus;
  try {
    resolve_device(c, env);
    ADD_FAILURE() << "local rank " << gpus << " of a node with " << gpus << " GPU(s) was given a device";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("local rank " + std::to_string(gpus)), std::string::npos) << e.what();
  }
  env.rank = env.local_rank = gpus - 1;
  EXPECT_EQ(resolve_device(c, env), c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(gpus - 1)));
}
