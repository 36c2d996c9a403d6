// Precompiled header for ptrain_core and the targets that reuse it. Only here may the heavy
// LibTorch umbrella headers appear; ordinary headers include <ATen/Tensor.h> and friends.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
