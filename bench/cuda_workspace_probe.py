"""What the CUDA caching allocator keeps for cuBLAS / cuBLASLt workspaces after the first
matmuls of a process: after each operation its outputs are dropped, so what stays allocated
beyond the inputs is workspace (never freed). Forward-thread operations first, then autograd's
backward, which runs in its own device thread with its own cuBLAS handle. The memory planner
(`ptrain check`) counts these bytes; this measures them.
    python3 bench/cuda_workspace_probe.py
"""
import json
import os

import torch
import torch.nn.functional as F


def main():
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    dev = torch.device("cuda", 0)
    a32, w32, b32 = torch.randn(256, 512, device=dev), torch.randn(384, 512, device=dev), torch.randn(384, device=dev)
    a16, w16, b16 = a32.bfloat16(), w32.bfloat16(), b32.bfloat16()
    torch.cuda.synchronize()
    inputs = torch.cuda.memory_allocated()

    def backward():
        x, w = a16.clone().requires_grad_(), w16.clone().requires_grad_()
        F.linear(x, w, b16).float().sum().backward()

    ops = [("fp32 mm", lambda: a32 @ w32.t()), ("bf16 mm", lambda: a16 @ w16.t()),
           ("bf16 linear with bias", lambda: F.linear(a16, w16, b16)),
           ("fp32 linear with bias", lambda: F.linear(a32, w32, b32)),
           ("bf16 linear forward + backward (autograd's thread)", backward)]
    held = []
    for name, op in ops:
        op()
        torch.cuda.synchronize()
        held.append({"after": name, "workspace_bytes": torch.cuda.memory_allocated() - inputs})
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "env": {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                                                             "TORCH_CUBLASLT_UNIFIED_WORKSPACE")},
                      "held": held}, indent=1))


if __name__ == "__main__":
    main()
