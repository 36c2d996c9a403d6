// What the trainer, checkpoints and memory accounting need from an optimizer over flat
// shards (one target per FSDP unit): AdamW (optim/adamw.h) and AdamW8bit (optim/adamw8bit.h).
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ptrain {

struct OptimTarget {
  std::string name;            // unit name, used for checkpoint keys
  at::Tensor param;            // 1-D leaf; its .grad() is read
  int64_t decay_numel = 0;     // decayed prefix
  uint64_t global_offset = 0;  // index of param[0] in a model-wide element numbering (SR bits)
};

// One optimizer state tensor of one target. State vectors are laid out unit-wide and every
// rank holds the part that covers its shard: `index(e)` maps an element offset e of the unit
// (a multiple of kUnitAlign) to the position in the unit-wide state vector where the state of
// element e starts. Elementwise state has index(e) = e; per-256-block absmax has e / 256.
// Checkpoints store each rank's part and reshard through `index`.
struct OptimState {
  std::string key;  // "<unit>.<state>"
  size_t target = 0;
  at::Tensor tensor;  // 1-D; its first index(end) - index(begin) entries cover this rank's owned elements
  std::function<int64_t(int64_t)> index;
};

// Elements of the updated shards over some steps: how many had a non-zero update computed
// (the first moment or the weight-decay term non-zero), and how many of those kept their stored
// value bit for bit (the parameter, and its Kahan compensation where there is one): updates
// lost to rounding.
struct UpdateCounts {
  int64_t computed = 0;
  int64_t lost = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  void step(double lr);  // begin_step() + update() of every target that has a .grad()
  // Optimizer-in-backward: begin_step() once per step, then update() each target as soon as
  // its gradient exists (target index, gradient); the gradient need not be stored in .grad().
  void begin_step() { ++steps_; }
  void update(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  virtual std::vector<OptimState> state() const = 0;
  int64_t state_bytes() const;  // summed over state()

  // Lost-update counting (training.count_lost_updates): each update compares the stored values
  // before and after, at the cost of a copy of the updated shards; counted on their device.
  void count_lost_updates(bool on) { counting_ = on; }
  UpdateCounts take_update_counts();  // this rank's elements since the last call

 protected:
  explicit Optimizer(std::vector<OptimTarget> targets) : targets_(std::move(targets)) {}
  virtual void apply(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) = 0;
  // Target i's first moment after the step (values comparable with 0), and its Kahan
  // compensation if it has one.
  virtual at::Tensor first_moment(size_t i) const = 0;
  virtual at::Tensor compensation(size_t) const { return {}; }
  std::vector<OptimTarget> targets_;
  int64_t steps_ = 0;
  double weight_decay_ = 0;  // the decayed prefix of each target has a non-zero update where p != 0

 private:
  bool counting_ = false;
  at::Tensor counts_;  // int64 [computed, lost] on the targets' device
};

}  // namespace ptrain
