#include "parallel/offload.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <utility>

#ifdef PTRAIN_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ptrain {

struct ActivationOffloader::Impl {
  // One copy between the device and the host: the device tensor is held until the copy is done.
  struct Transfer {
    at::Tensor device;
#ifdef PTRAIN_CUDA
    std::optional<at::cuda::CUDAEvent> done;
#endif
    bool finished() {
#ifdef PTRAIN_CUDA
      return !done || done->query();
#else
      return true;
#endif
    }
    void wait() {
#ifdef PTRAIN_CUDA
      if (done) done->synchronize();
#endif
    }
  };

  explicit Impl(const c10::Device& d) : device(d) {}
  c10::Device device;
  std::map<int64_t, at::Tensor> host;                 // ticket -> host copy
  std::deque<std::pair<int64_t, Transfer>> outgoing;  // copies to the host not known to be done
  std::map<int64_t, Transfer> incoming;               // copies back to the device, not yet fetched
  int64_t next = 0;
  int64_t host_bytes = 0, peak_host = 0, peak_in_flight = 0;
#ifdef PTRAIN_CUDA
  std::optional<c10::cuda::CUDAStream> side;
#endif

  void count_in_flight() {
    peak_in_flight = std::max<int64_t>(peak_in_flight, static_cast<int64_t>(outgoing.size() + incoming.size()));
  }
  // Drops the device sources of finished copies to the host, then waits for the oldest until at
  // most `keep` remain.
  void drain_outgoing(size_t keep) {
    while (!outgoing.empty() && outgoing.front().second.finished()) outgoing.pop_front();
    while (outgoing.size() > keep) {
      outgoing.front().second.wait();
      outgoing.pop_front();
    }
  }
  // The stream the copies run on, which first waits for the work already queued on the
  // current one (the tensor being copied, or the buffer just allocated).
#ifdef PTRAIN_CUDA
  c10::cuda::CUDAStream ready_side_stream() {
    if (!side) side = c10::cuda::getStreamFromPool(false, device.index());
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device.index()));
    ready.block(*side);
    return *side;
  }
#endif
};

ActivationOffloader::ActivationOffloader(const c10::Device& device) : impl_(std::make_unique<Impl>(device)) {}

ActivationOffloader::~ActivationOffloader() {
  if (impl_) impl_->drain_outgoing(0);  // never free a buffer a copy still reads
  if (impl_)
    for (auto& [ticket, t] : impl_->incoming) t.wait();
}

void ActivationOffloader::begin_forward() {
  Impl& m = *impl_;
  m.drain_outgoing(0);
  for (auto& [ticket, t] : m.incoming) t.wait();
  m.incoming.clear();
  m.host.clear();
  m.host_bytes = 0;
  m.next = 0;
}

int64_t ActivationOffloader::offload(const at::Tensor& x) {
  Impl& m = *impl_;
  const int64_t ticket = m.next++;
  at::Tensor host;
  if (x.is_cuda()) {
#ifdef PTRAIN_CUDA
    host = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(true));
    c10::cuda::CUDAStream side = m.ready_side_stream();
    Impl::Transfer t;
    t.device = x;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      host.copy_(x, /*non_blocking=*/true);
      t.done.emplace();
      t.done->record(side);
    }
    m.outgoing.emplace_back(ticket, std::move(t));
    m.count_in_flight();
    m.drain_outgoing(static_cast<size_t>(kInFlight));
#endif
  } else {
    host = x.detach().clone(at::MemoryFormat::Contiguous);  // its own buffer, as a host copy is
  }
  m.host_bytes += static_cast<int64_t>(host.nbytes());
  m.peak_host = std::max(m.peak_host, m.host_bytes);
  m.host.emplace(ticket, std::move(host));
  return ticket;
}

void ActivationOffloader::prefetch(int64_t ticket) {
  Impl& m = *impl_;
  auto h = m.host.find(ticket);
  if (h == m.host.end() || m.incoming.count(ticket)) return;
  Impl::Transfer t;
  if (m.device.is_cuda()) {
#ifdef PTRAIN_CUDA
    // Queued on the side stream after this ticket's copy to the host, so it reads finished bytes.
    t.device = at::empty(h->second.sizes(), h->second.options().device(m.device).pinned_memory(false));
    c10::cuda::CUDAStream side = m.ready_side_stream();
    c10::cuda::CUDAStreamGuard guard(side);
    t.device.copy_(h->second, /*non_blocking=*/true);
    t.done.emplace();
    t.done->record(side);
#endif
  } else {
    t.device = h->second.clone();
  }
  m.incoming.emplace(ticket, std::move(t));
  m.count_in_flight();
}

at::Tensor ActivationOffloader::fetch(int64_t ticket) {
  Impl& m = *impl_;
  prefetch(ticket);
  auto it = m.incoming.find(ticket);
  if (it == m.incoming.end())
    throw std::logic_error("activation offloading: ticket " + std::to_string(ticket) + " was never offloaded");
  Impl::Transfer t = std::move(it->second);
  m.incoming.erase(it);
#ifdef PTRAIN_CUDA
  // The compute stream waits for the copy on the GPU; the host buffer goes back to the pinned
  // caching allocator, which keeps it until the copy that reads it has finished.
  if (t.done) t.done->block(c10::cuda::getCurrentCUDAStream(m.device.index()));
#endif
  auto h = m.host.find(ticket);
  m.host_bytes -= static_cast<int64_t>(h->second.nbytes());
  m.host.erase(h);
  m.drain_outgoing(static_cast<size_t>(kInFlight));
  return t.device;
}

int64_t ActivationOffloader::host_bytes() const { return impl_->host_bytes; }
int64_t ActivationOffloader::peak_host_bytes() const { return impl_->peak_host; }
int64_t ActivationOffloader::peak_device_in_flight() const { return impl_->peak_in_flight; }

}  // namespace ptrain
