// The collectives FSDP needs, behind one small interface (as c10d's Backend): CPU tensors go
// through MPI (OpenMPI), CUDA tensors through c10d's ProcessGroupNCCL; world size 1 without a
// launcher uses the identity implementation. Every call counts its payload bytes.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/options.h"

namespace ptrain {

struct DistEnv;

// Payload bytes per collective kind since the last reset: the size of the full (gathered /
// pre-reduction) buffer, the usual "collective size" (a ring moves (ws-1)/ws of it per rank).
// A single process without a launcher communicates nothing and counts 0.
struct CommStats {
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  int64_t all_reduce_bytes = 0;
  int64_t calls = 0;
  void reset() { *this = CommStats{}; }
};

// A collective in flight. wait() completes it: on the CPU the result is in place when it
// returns; with NCCL the current CUDA stream waits on the collective's stream (an event), so
// the host never blocks and later kernels see the result. Holds its buffers until then.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual std::string name() const = 0;
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // out has world_size * in.numel() elements of in's dtype; rank r's `in` lands at
  // out[r*n, (r+1)*n).
  virtual std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& out, const at::Tensor& in) = 0;
  // The same in place: this rank's part already sits at out[rank*n, (rank+1)*n) (n =
  // out.numel() / world_size, written there by the caller — FSDP casts its shard straight into
  // that slot, so no cast copy exists to be copied again); the collective fills the other slots.
  virtual std::unique_ptr<PendingCollective> all_gather_in_place_async(const at::Tensor& out) = 0;
  // in has world_size * out.numel() elements; out = mean over ranks of their in[rank*n, ...).
  virtual std::unique_ptr<PendingCollective> reduce_scatter_mean_async(const at::Tensor& out, const at::Tensor& in) = 0;
  void all_gather(const at::Tensor& out, const at::Tensor& in) { all_gather_async(out, in)->wait(); }
  virtual void all_reduce_sum(const at::Tensor& t) = 0;
  virtual void barrier() = 0;

  CommStats stats;

 protected:
  int rank_ = 0;
  int world_size_ = 1;
};

// The sum over ranks of each rank's `value` (|value| < 2^53), reduced on `device`, the
// collectives' device; also a barrier. Every rank must call it.
int64_t sum_over_ranks(Collectives& comm, int64_t value, const c10::Device& device);
// How many ranks pass `flag` = true.
int ranks_where(Collectives& comm, bool flag, const c10::Device& device);

// Picks the implementation for `device` and parallel.backend (auto | nccl | mpi; gloo is refused
// by the config's validation, and here).
std::unique_ptr<Collectives> make_collectives(const DistEnv& env, Backend backend, const c10::Device& device,
                                              double timeout_s);

// MPI lifetime: initialised on first use, finalised at exit. Aborting takes every rank down.
void mpi_abort(int code);

}  // namespace ptrain
