// CUDA collectives: c10d's ProcessGroupNCCL over a TCPStore. Under mpirun nothing needs to be
// set: rank 0 opens the store on a free port and shares host:port with the others through
// MPI. Without MPI (torchrun style, Slurm) MASTER_ADDR / MASTER_PORT name the store.
#include <ATen/ATen.h>

#include "common/error.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"

#if defined(PTRAIN_CUDA) && defined(USE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>
#include <mpi.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <cstring>
#endif

namespace ptrain {

#if defined(PTRAIN_CUDA) && defined(USE_C10D_NCCL)
namespace {

struct StoreAddress {
  std::string host;
  uint16_t port = 0;
};

// Rank 0's address, agreed on by every rank.
c10::intrusive_ptr<c10d::Store> make_store(const DistEnv& env, double timeout_s) {
  c10d::TCPStoreOptions opts;
  opts.isServer = env.rank == 0;
  opts.numWorkers = env.world_size;
  opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (env.uses_mpi() && !(addr && port)) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    }
    char host[256] = {};
    uint16_t chosen = 0;
    c10::intrusive_ptr<c10d::TCPStore> server;
    if (env.rank == 0) {
      ::gethostname(host, sizeof host - 1);
      opts.port = 0;  // the server picks a free port
      opts.waitWorkers = false;
      server = c10::make_intrusive<c10d::TCPStore>(host, opts);
      chosen = server->getPort();
    }
    MPI_Bcast(host, sizeof host, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(&chosen, 1, MPI_UINT16_T, 0, MPI_COMM_WORLD);
    if (server) return server;
    opts.port = chosen;
    return c10::make_intrusive<c10d::TCPStore>(host, opts);
  }
  if (!addr || !port)
    throw UsageError("NCCL at world size " + std::to_string(env.world_size) +
                     " needs MASTER_ADDR and MASTER_PORT (or mpirun)");
  opts.port = static_cast<uint16_t>(std::stoi(port));
  return c10::make_intrusive<c10d::TCPStore>(addr, opts);
}

struct Work final : PendingCollective {
  Work(c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> keep)
      : work(std::move(work)), keep(std::move(keep)) {}
  ~Work() override {  // the buffers outlive the collective
    try {
      wait();
    } catch (...) {  // only while another error unwinds; that one is reported
    }
  }
  void wait() override {
    if (!work) return;
    work->wait();
    work.reset();
  }
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> keep;
};

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(const DistEnv& env, const c10::Device& device, double timeout_s) {
    rank_ = env.rank;
    world_size_ = env.world_size;
    c10::cuda::set_device(device.index());
    auto store = c10::make_intrusive<c10d::PrefixStore>("ptrain", make_store(env, timeout_s));
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank_, world_size_, opts);
    pg_->setBoundDeviceId(device);
    device_ = device;
  }
  ~NcclCollectives() override {
    if (pg_) pg_->shutdown();
  }
  std::string name() const override { return "nccl"; }

  // ProcessGroupNCCL runs collectives on its own stream, ordered after the current stream's
  // work by an event; Work::wait() makes the current stream wait for the collective's event.
  std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& out, const at::Tensor& in) override {
    at::Tensor o = out, i = in.contiguous();
    auto work = pg_->_allgather_base(o, i);
    stats.all_gather_bytes += out.nbytes();
    ++stats.calls;
    return std::make_unique<Work>(std::move(work), std::vector<at::Tensor>{o, i});
  }
  // NCCL gathers in place when the input is the rank's slot of the output (as FSDP2 does).
  std::unique_ptr<PendingCollective> all_gather_in_place_async(const at::Tensor& out) override {
    TORCH_CHECK(out.is_contiguous() && out.numel() % world_size_ == 0, "all_gather in place: sizes");
    const int64_t n = out.numel() / world_size_;
    at::Tensor o = out, i = out.narrow(0, rank_ * n, n);
    auto work = pg_->_allgather_base(o, i);
    stats.all_gather_bytes += out.nbytes();
    ++stats.calls;
    return std::make_unique<Work>(std::move(work), std::vector<at::Tensor>{o, i});
  }
  std::unique_ptr<PendingCollective> reduce_scatter_mean_async(const at::Tensor& out, const at::Tensor& in) override {
    at::Tensor o = out, i = in.contiguous();
    c10d::ReduceScatterOptions opts;
    // At one rank the mean is the buffer itself. NCCL runs a one-rank SUM as a copy but a
    // one-rank AVG through its scaling kernel, which before NCCL 2.29.7 leaves the last
    // count % blocks elements unwritten (NVIDIA/nccl#1950; torch 2.11.0 ships NCCL 2.28.9):
    // gradients silently short of their tail. SUM there; AVG (one pass, no division kernel)
    // from two ranks on.
    opts.reduceOp = world_size_ == 1 ? c10d::ReduceOp::SUM : c10d::ReduceOp::AVG;
    auto work = pg_->_reduce_scatter_base(o, i, opts);
    stats.reduce_scatter_bytes += in.nbytes();
    ++stats.calls;
    return std::make_unique<Work>(std::move(work), std::vector<at::Tensor>{o, i});
  }
  // NCCL reduces device memory only: a host tensor (a step's loss, token counts, the stop flag)
  // goes through the rank's device and back.
  void all_reduce_sum(const at::Tensor& t) override {
    const bool host = t.is_cpu();
    std::vector<at::Tensor> ts{host ? t.to(device_) : t};
    pg_->allreduce(ts)->wait();
    if (host) t.copy_(ts[0]);
    stats.all_reduce_bytes += t.nbytes();
    ++stats.calls;
  }
  void barrier() override { pg_->barrier()->wait(); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  c10::Device device_{c10::kCUDA};
};

}  // namespace

std::unique_ptr<Collectives> make_nccl_collectives(const DistEnv& env, const c10::Device& device, double timeout_s) {
  return std::make_unique<NcclCollectives>(env, device, timeout_s);
}
#else
std::unique_ptr<Collectives> make_nccl_collectives(const DistEnv&, const c10::Device&, double) {
  throw UsageError(
      "this ptrain was built without CUDA/NCCL (no nvcc at build time); use parallel.backend = \"mpi\" on CPU");
}
#endif

}  // namespace ptrain
