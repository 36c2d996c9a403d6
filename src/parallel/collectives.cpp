#include "parallel/collectives.h"

#include <ATen/ATen.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "parallel/dist.h"

namespace ptrain {

namespace {

// A collective that completed when it was issued.
struct Done final : PendingCollective {
  void wait() override {}
};

#define PTRAIN_MPI_CHECK(call)                                                                               \
  do {                                                                                                       \
    const int rc_ = (call);                                                                                  \
    if (rc_ != MPI_SUCCESS) {                                                                                \
      char msg_[MPI_MAX_ERROR_STRING];                                                                       \
      int len_ = 0;                                                                                          \
      MPI_Error_string(rc_, msg_, &len_);                                                                    \
      throw RuntimeError(std::string(#call) + " failed at " __FILE__ ":" + std::to_string(__LINE__) + ": " + \
                         std::string(msg_, len_));                                                           \
    }                                                                                                        \
  } while (0)

void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  PTRAIN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kLong:
      return MPI_INT64_T;
    case at::kInt:
      return MPI_INT32_T;
    default:
      throw RuntimeError(std::string("MPI reduction of ") + c10::toString(t) + " is not supported");
  }
}

// Identity collectives for a single process: the same FSDP code path at world size 1.
// Nothing crosses a wire, so no bytes are counted.
class SelfCollectives final : public Collectives {
 public:
  std::string name() const override { return "self"; }
  std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& out, const at::Tensor& in) override {
    out.copy_(in);
    return std::make_unique<Done>();
  }
  std::unique_ptr<PendingCollective> all_gather_in_place_async(const at::Tensor&) override {
    return std::make_unique<Done>();  // the only slot is filled
  }
  std::unique_ptr<PendingCollective> reduce_scatter_mean_async(const at::Tensor& out, const at::Tensor& in) override {
    out.copy_(in);
    return std::make_unique<Done>();
  }
  void all_reduce_sum(const at::Tensor&) override {}
  void barrier() override {}
};

// CPU collectives over MPI. Calls are non-blocking and polled against a deadline, so a peer
// that hangs makes this rank abort the job after timeout_s instead of waiting forever (a peer
// that dies is reported by mpirun, which then stops every rank).
class MpiCollectives final : public Collectives {
 public:
  MpiCollectives(const DistEnv& env, double timeout_s) : timeout_s_(timeout_s) {
    ensure_mpi();
    PTRAIN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    PTRAIN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
    if (rank_ != env.rank || world_size_ != env.world_size)
      throw RuntimeError("MPI reports rank " + std::to_string(rank_) + "/" + std::to_string(world_size_) +
                         " but the launcher environment says " + std::to_string(env.rank) + "/" +
                         std::to_string(env.world_size));
  }
  std::string name() const override { return "mpi"; }

  std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& out, const at::Tensor& in) override {
    check_cpu(out, in, "all_gather");
    TORCH_CHECK(out.numel() == in.numel() * world_size_ && out.scalar_type() == in.scalar_type(), "all_gather sizes");
    auto p = std::make_unique<Request>(this, "all_gather");
    p->keep = {in.contiguous(), out};
    PTRAIN_MPI_CHECK(MPI_Iallgather(p->keep[0].data_ptr(), static_cast<int>(p->keep[0].nbytes()), MPI_BYTE,
                                    out.data_ptr(), static_cast<int>(p->keep[0].nbytes()), MPI_BYTE, MPI_COMM_WORLD,
                                    &p->req));
    stats.all_gather_bytes += out.nbytes();
    ++stats.calls;
    return p;
  }

  std::unique_ptr<PendingCollective> all_gather_in_place_async(const at::Tensor& out) override {
    check_cpu(out, out, "all_gather");
    TORCH_CHECK(out.is_contiguous() && out.numel() % world_size_ == 0, "all_gather in place: sizes");
    auto p = std::make_unique<Request>(this, "all_gather");
    p->keep = {out};
    const int part = static_cast<int>(out.nbytes() / world_size_);
    PTRAIN_MPI_CHECK(
        MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out.data_ptr(), part, MPI_BYTE, MPI_COMM_WORLD, &p->req));
    stats.all_gather_bytes += out.nbytes();
    ++stats.calls;
    return p;
  }

  // MPI has no bfloat16 sum: bf16 gradients travel and are summed as float32.
  std::unique_ptr<PendingCollective> reduce_scatter_mean_async(const at::Tensor& out, const at::Tensor& in) override {
    check_cpu(out, in, "reduce_scatter");
    TORCH_CHECK(in.numel() == out.numel() * world_size_ && out.scalar_type() == in.scalar_type(),
                "reduce_scatter sizes");
    const bool widen = in.scalar_type() == at::kBFloat16 || in.scalar_type() == at::kHalf;
    at::Tensor src = widen ? in.to(at::kFloat).contiguous() : in.contiguous();
    at::Tensor dst = widen ? at::empty(out.sizes(), out.options().dtype(at::kFloat)) : out;
    auto p = std::make_unique<Request>(this, "reduce_scatter");
    p->keep = {src, dst, out};
    const int ws = world_size_;
    p->finish = [dst, out, widen, ws] {
      dst.div_(ws);
      if (widen) out.copy_(dst);
    };
    PTRAIN_MPI_CHECK(MPI_Ireduce_scatter_block(src.data_ptr(), dst.data_ptr(), static_cast<int>(dst.numel()),
                                               mpi_type(dst.scalar_type()), MPI_SUM, MPI_COMM_WORLD, &p->req));
    stats.reduce_scatter_bytes += src.nbytes();
    ++stats.calls;
    return p;
  }

  void all_reduce_sum(const at::Tensor& t) override {
    check_cpu(t, t, "all_reduce");
    TORCH_CHECK(t.is_contiguous(), "all_reduce needs a contiguous tensor");
    MPI_Request req;
    PTRAIN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t.scalar_type()),
                                    MPI_SUM, MPI_COMM_WORLD, &req));
    wait(req, "all_reduce");
    stats.all_reduce_bytes += t.nbytes();
    ++stats.calls;
  }

  void barrier() override {
    MPI_Request req;
    PTRAIN_MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
    wait(req, "barrier");
  }

 private:
  static void check_cpu(const at::Tensor& a, const at::Tensor& b, const char* op) {
    TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "MPI ", op,
                " needs CPU tensors (use the nccl backend on GPUs)");
  }

  // An MPI request in flight with the buffers it reads and writes.
  struct Request final : PendingCollective {
    Request(MpiCollectives* owner, const char* op) : owner(owner), op(op) {}
    ~Request() override {  // never free buffers MPI may still touch
      try {
        wait();
      } catch (...) {  // only while another error unwinds; that one is reported
      }
    }
    void wait() override {
      if (req == MPI_REQUEST_NULL) return;
      owner->wait(req, op);
      req = MPI_REQUEST_NULL;
      if (finish) finish();
    }
    MpiCollectives* owner;
    const char* op;
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<at::Tensor> keep;
    std::function<void()> finish;
  };

  void wait(MPI_Request& req, const char* op) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    int done = 0;
    for (int spins = 0;; ++spins) {
      PTRAIN_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        log::error("rank ", rank_, ": ", op, " did not complete within parallel.timeout_s = ", timeout_s_,
                   " s: another rank is stuck or dead. Aborting the job.");
        mpi_abort(1);
      }
      // Yield the core: ranks are often oversubscribed on CPU.
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  double timeout_s_;
};

}  // namespace

int64_t sum_over_ranks(Collectives& comm, int64_t value, const c10::Device& device) {
  at::Tensor n = at::full({1}, static_cast<double>(value), at::TensorOptions().dtype(at::kDouble).device(device));
  comm.all_reduce_sum(n);
  return static_cast<int64_t>(n.item<double>());
}

int ranks_where(Collectives& comm, bool flag, const c10::Device& device) {
  return static_cast<int>(sum_over_ranks(comm, flag ? 1 : 0, device));
}

void mpi_abort(int code) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::unique_ptr<Collectives> make_nccl_collectives(const DistEnv& env, const c10::Device& device, double timeout_s);

std::unique_ptr<Collectives> make_collectives(const DistEnv& env, Backend backend, const c10::Device& device,
                                              double timeout_s) {
  if (backend == Backend::gloo)
    throw UsageError(
        "parallel.backend = \"gloo\" is not available (the torch wheel ships no gloo headers); use \"auto\"");
  const bool cuda = device.is_cuda();
  if (backend == Backend::nccl || (backend == Backend::automatic && cuda && env.world_size > 1)) {
    if (!cuda) throw UsageError("parallel.backend = \"nccl\" needs training on CUDA");
    return make_nccl_collectives(env, device, timeout_s);
  }
  if (env.world_size == 1 && !env.uses_mpi() && backend != Backend::mpi) return std::make_unique<SelfCollectives>();
  if (cuda) throw UsageError("CUDA tensors need the nccl backend at world size > 1; set parallel.backend = \"auto\"");
  if (!env.uses_mpi())
    throw UsageError("CPU training with " + std::to_string(env.world_size) + " ranks needs MPI: launch with mpirun (" +
                     env.launcher + " variables found)");
  return std::make_unique<MpiCollectives>(env, timeout_s);
}

}  // namespace ptrain
