// Benchmark: throughput of ptrain's CUDA kernels in GB/s of memory traffic (bytes each kernel
// must read and write once), side by side with the GPU's own device-to-device copy bandwidth
// measured the same way (the practical ceiling), and the ratio. CUDA events time 20 runs after
// 3 warm-ups.
//
//   build/ptrain_bench_kernels [ELEMENTS]        (default 256 Mi elements)
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "model/layout.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "optim/stochastic_round.h"
#include "quant/nf4.h"

using namespace ptrain;

namespace {
double time_ms(const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // the default flags disable timing
  auto stream = at::cuda::getCurrentCUDAStream();
  start.record(stream);
  const int runs = 20;
  for (int i = 0; i < runs; ++i) f();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop) / runs;
}

void report(const char* name, double bytes, double ms, double copy_gbs) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-34s %9.3f ms  %8.1f GB/s  %5.2f of copy bandwidth\n", name, ms, gbs, gbs / copy_gbs);
}
}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "no CUDA GPU visible: this benchmark runs on a GPU machine\n");
    return 2;
  }
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (256LL << 20);
  const int64_t aligned = (n + kUnitAlign - 1) / kUnitAlign * kUnitAlign;
  auto cuda = at::TensorOptions().device(at::kCUDA);
  std::printf("%lld elements on %s\n", static_cast<long long>(aligned), at::cuda::getCurrentDeviceProperties()->name);

  at::Tensor src = at::randn({aligned}, cuda), dst = at::empty_like(src);
  const double copy_ms = time_ms([&] { dst.copy_(src); });
  const double copy_gbs = 2.0 * static_cast<double>(src.nbytes()) / (copy_ms * 1e-3) / 1e9;
  report("device copy (float32)", 2.0 * src.nbytes(), copy_ms, copy_gbs);

  // Stochastic rounding: read float32, write bf16.
  report("stochastic_round_bf16", 6.0 * aligned, time_ms([&] { stochastic_round_bf16(src, 1, 0); }), copy_gbs);

  // AdamW8bit on float32 params: read p, g, 2 codes, write p, 2 codes (+ absmax, negligible).
  {
    UnitLayout u;
    u.name = "u";
    u.slots = {{"w", {aligned}, 0, aligned, true, 0.0}};
    u.group_begins = {0};
    u.numel = u.decay_numel = aligned;
    at::Tensor p = at::randn({aligned}, cuda), g = at::randn({aligned}, cuda) * 1e-3;
    AdamW8bit opt({{"u", p, aligned, 0}}, {Blocking::of(u, 0, aligned, 4096)},
                  {{0.9, 0.95, 1e-8, 0.1, false, 0}, 4096});
    report("adamw8bit step (fp32 params)", (4.0 + 4.0 + 2.0 + 4.0 + 2.0) * aligned, time_ms([&] {
             opt.begin_step();
             opt.update({{0, g}}, 1e-3);
           }),
           copy_gbs);
  }
  // Fused bf16 AdamW + SR: read p, g, m, v and write p, m, v, all bf16.
  {
    at::Tensor p = at::randn({aligned}, cuda).to(at::kBFloat16),
               g = (at::randn({aligned}, cuda) * 1e-3).to(at::kBFloat16);
    AdamW opt({{"u", p, aligned, 0}}, {0.9, 0.95, 1e-8, 0.1, true, 3});
    report("adamw bf16 + SR step", 14.0 * aligned, time_ms([&] {
             opt.begin_step();
             opt.update({{0, g}}, 1e-3);
           }),
           copy_gbs);
  }
  // NF4 dequantize to bf16: read 0.5 B (+ scales), write 2 B per weight.
  {
    nf4::Quantized q = nf4::quantize(at::randn({aligned / 4096, 4096}, cuda), true);
    report("nf4 dequantize -> bf16", 2.5 * aligned, time_ms([&] { nf4::dequantize(q, at::kBFloat16); }), copy_gbs);
  }
  return 0;
}
