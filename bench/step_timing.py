"""The timing loop the bench's PyTorch references share (bench/fsdp2_reference.py,
bench/qlora_peft_reference.py): what ptrain's metrics.jsonl reports, measured the same way."""
import statistics
import time

import torch


def timed_steps(device, warmup, steps, make_batch, train_step):
    """Runs warmup + steps training steps — `make_batch()` outside the clock, `train_step(batch)`
    (returning the loss tensor) on it, the device synchronized on both sides — and returns the
    median step time over the timed steps (s), the peak memory over them (bytes; CUDA: the
    allocator's peak since the first timed step; CPU: the process's high-water mark, as ptrain
    reads it — ru_maxrss would carry a launcher's), its source, and the last loss."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    times, losses = [], []
    for step in range(warmup + steps):
        batch = make_batch()
        if step == warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        loss = train_step(batch)
        sync()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    if device.type == "cuda":
        peak, source = torch.cuda.max_memory_allocated(device), "cuda_allocator_peak_allocated"
    else:
        with open("/proc/self/status") as f:
            peak = int(next(line for line in f if line.startswith("VmHWM")).split()[1]) * 1024
        source = "process_peak_rss"
    return statistics.median(times), peak, source, losses[-1]
