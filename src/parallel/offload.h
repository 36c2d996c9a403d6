// Activation offloading (memory.activation_offloading, with full activation checkpointing):
// the input each checkpointed block keeps for its backward is copied to host memory in forward
// — pinned, on a side stream, overlapping the next blocks' compute — and copied back ahead of
// the block's backward (block i-1's while block i's backward runs).
//
// Bounded both ways: at most kInFlight device tensors wait on an unfinished copy to the host
// (forward blocks on the oldest beyond that), backward holds the block it differentiates and
// the one prefetched, and the host holds one forward's block inputs — each released as its
// backward fetches it, all of them at the next forward (a forward whose backward never ran).
// On the CPU the copies are synchronous; the mechanism and its accounting are the same.
#pragma once
#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace ptrain {

class ActivationOffloader {
 public:
  static constexpr int64_t kInFlight = 2;

  explicit ActivationOffloader(const c10::Device& device);
  ~ActivationOffloader();
  ActivationOffloader(const ActivationOffloader&) = delete;
  ActivationOffloader& operator=(const ActivationOffloader&) = delete;

  // A new forward pass: completes and forgets whatever the previous one left behind.
  void begin_forward();
  // Starts copying x to the host; returns its ticket (0, 1, ... in the order of the forward).
  int64_t offload(const at::Tensor& x);
  // Starts copying ticket's tensor back to the device; no-op when it is unknown or already coming.
  void prefetch(int64_t ticket);
  // Ticket's tensor on the device once its copy is complete; its host copy is released.
  at::Tensor fetch(int64_t ticket);

  int64_t host_bytes() const;  // host copies held now
  int64_t peak_host_bytes() const;
  int64_t peak_device_in_flight() const;  // most device tensors held at once for unfinished copies

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptrain
