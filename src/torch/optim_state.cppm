// cgt.torch:optim_state — the optimizers' state (src/torch/optim.cpp: the update; src/torch/
// optim_checkpoint.cpp: its checkpoints), declared once for the units that work on it.
module;
#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

// Optimizer::State::save and load take these by reference; optim_checkpoint.cpp includes them.
namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

module cgt.torch:optim_state;
import cgt;
import cgt.core;
import :api;

namespace cgt::torch {

// Whether the current stream of `device` is capturing a graph (a pool function being recorded):
// state written then would be written by every replay.
[[nodiscard]] bool is_capturing(const at::Device& device);

// A learning rate the device's float32 rate tensor holds: finite, not below 0, within float32.
[[nodiscard]] bool is_rate(double lr) noexcept;

// `value` as the shortest text that reads back as it, for messages (std::to_string writes 1e-7
// as "0.000000").
[[nodiscard]] std::string number_text(double value);

// The most steps a schedule counts (Optimizer::scheduled_steps): 2^62, which no run reaches (a
// step a nanosecond for 146 years). The count stops there, so that it cannot overflow, and a start
// or a file's count above it is refused: every count saved loads again.
inline constexpr std::int64_t max_scheduled_steps = std::int64_t{1} << 62;

// Dynamic loss scaling (LossScaleOptions): PyTorch's GradScaler with every decision on the
// device, as its path for fused optimizers takes them. An optimizer's State owns one and calls it
// from `step`: `unscale` before the clip and the update, `update` after; a graph of the step
// replays the whole rule, skips included.
class LossScale {
 public:
  // The state on `device`. Fails with `invalid_argument` for an option out of range.
  [[nodiscard]] static Result<std::unique_ptr<LossScale>> make(const LossScaleOptions& options,
                                                               const at::Device& device);
  // Divides `grads` by the scale and sets the flag where one holds an infinity or NaN (GradScaler's
  // `unscale_`: one kernel per dtype).
  void unscale(const std::vector<at::Tensor>& grads);
  // After the update: the scale backed off (flag set) or grown (every `growth_interval` steps in a
  // row without), and a skipped step counted.
  void update();
  // The skip of an update that cannot take the flag itself (the multi-tensor formulas): `save`
  // copies what the update writes before it, `restore_where_found_inf` puts the copies back after
  // it where the flag is set (a select on the device, exact).
  [[nodiscard]] std::vector<at::Tensor> save(const std::vector<at::Tensor>& written) const;
  void restore_where_found_inf(const std::vector<at::Tensor>& written, const std::vector<at::Tensor>& saved) const;

  // The state a checkpoint keeps (Optimizer::save, as "cgt.scaler.<name>"), by name: the names
  // alone (what `load` looks for in a file whatever the optimizer), and the tensors.
  static constexpr std::array<std::string_view, 3> checkpointed_names{"scale", "growth_tracker", "skipped"};
  [[nodiscard]] std::vector<std::pair<std::string_view, const at::Tensor*>> checkpointed() const {
    return {{checkpointed_names[0], &scale_},
            {checkpointed_names[1], &growth_tracker_},
            {checkpointed_names[2], &skipped_}};
  }
  [[nodiscard]] const at::Tensor& scale() const noexcept { return scale_; }
  [[nodiscard]] const at::Tensor& found_inf() const noexcept { return found_inf_; }
  [[nodiscard]] const at::Tensor& skipped() const noexcept { return skipped_; }

 private:
  LossScaleOptions options_;
  // Written by `unscale` and `update` only, on the device; made by `make`, outside any pool.
  at::Tensor scale_;           // float32; the training step multiplies the loss by it
  at::Tensor growth_tracker_;  // int32: steps in a row without an infinity
  at::Tensor found_inf_;       // float32, 0 or 1: set by `unscale`, read by the update and `update`
  at::Tensor inv_scale_;       // float32: 1 / scale, computed in double as GradScaler does
  at::Tensor skipped_;         // int64: the steps skipped so far
};

// Who is using an optimizer's state, one thread at a time: a graphed step (TrainingStep,
// OptimizerStep) for its whole call, or one of the optimizer's members that change or copy the
// state (set_lr, set_schedule, step, zero_grad, attach_grads, save, load; TrainingStep's
// restart_step and destructor, which change the step in progress) for its own. A graphed
// step changes the state before its pool's own one-caller check and runs the program's loss
// function for as long as that takes: while one runs, another thread is turned away before it
// changes anything, and the step's own thread passes (its function zeroes and steps the
// optimizer; the loss function or a schedule may call the optimizer too). A member's hold is short
// and never waits for a step: another thread's step or member waits for it instead of failing.
class StateInUse {
 public:
  enum class Claim : std::uint8_t { step, operation };
  enum class Outcome : std::uint8_t {
    taken,    // the caller holds the state until it gives it back
    inside,   // this thread holds it already (a graphed step's function calls a member): go on
    refused,  // a graphed step runs on another thread, or this is a step inside one on this thread
  };
  [[nodiscard]] Outcome take(Claim claim) {
    const std::thread::id self = std::this_thread::get_id();
    std::unique_lock lock(mutex_);
    while (true) {
      if (!held_) {
        held_ = true;
        claim_ = claim;
        thread_ = self;
        return Outcome::taken;
      }
      if (thread_ == self) return claim == Claim::step ? Outcome::refused : Outcome::inside;
      if (claim_ == Claim::step) return Outcome::refused;
      given_back_.wait(lock);  // a member on another thread: short, and waiting for nothing of ours
    }
  }
  // REQUIRES: this thread took the state (`taken`).
  void give_back() {
    {
      const std::lock_guard lock(mutex_);
      held_ = false;
      thread_ = std::thread::id();
    }
    given_back_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable given_back_;  // notified by `give_back`
  // Under mutex_: set by `take`, cleared by `give_back`.
  bool held_ = false;
  Claim claim_ = Claim::operation;
  std::thread::id thread_;
};

// The step in progress of a training step with micro-batches one per call: which training step
// owns it and how many micro-batches it took. Kept with the gradients it describes (the
// optimizer's shared state, not the TrainingStep), so that what else reads or changes those
// gradients knows: another training step, a graphed update and `load` are refused while a step is
// in progress, and the program's `step()` and `zero_grad()` end it (they take or drop its
// gradients). Written under the state's hold (StateInUse): by TrainingStep's call, `restart_step`
// and destructor, and by the program's step and zero_grad (never by the calls inside a step's
// function: replays never run them, so the call keeps the count); read from any thread.
class StepProgress {
 public:
  // The training step that owns the step in progress (TrainingStep's id), or 0: none.
  [[nodiscard]] std::uint64_t owner() const noexcept { return owner_.load(); }
  // The micro-batches taken in the step in progress, whoever owns it.
  [[nodiscard]] std::int64_t taken() const noexcept { return taken_.load(); }
  // Those `step` has taken: 0 where it does not own the step in progress.
  [[nodiscard]] std::int64_t taken_by(std::uint64_t step) const noexcept { return owner() == step ? taken() : 0; }
  // `step` has taken `taken` micro-batches of its step.
  void take(std::uint64_t step, std::int64_t taken) noexcept {
    taken_.store(taken);  // before the owner: a reader that sees the owner sees this count or a later one
    owner_.store(step);
  }
  // No step is in progress: the next call of a training step begins one.
  void clear() noexcept {
    owner_.store(0);
    taken_.store(0);
  }

 private:
  std::atomic<std::uint64_t> owner_{0};
  std::atomic<std::int64_t> taken_{0};
};

// What every optimizer keeps: the parameters, their gradients and step counts, and the rules of
// `step`, `zero_grad` and `attach_grads`. Shared by the user's handle and the steps' pool
// functions (see cgt.torch-optim.inc); its lists are filled when make_adam/make_sgd make it and
// never change after, the tensors' contents change with every step and zero_grad of any handle.
class Optimizer::State {
 public:
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  virtual ~State() = default;

  // Checks the groups (their rates and weight decays against the options' `lr` and
  // `weight_decay`, and their parameters) and makes the parameters' gradients (zeros, or a copy
  // of an existing `.grad`), step counts and the groups' rates; fails with `invalid_argument`
  // naming the first unusable group or parameter.
  [[nodiscard]] Result<void> adopt(std::vector<ParamGroup> groups, bool static_grads, double lr, double weight_decay);
  // Writes `lr` to the device (see Optimizer::set_lr).
  [[nodiscard]] Result<void> set_lr(double lr);
  // Whether `lr` is a rate `set_lr` takes: one (`is_rate`), and one for every group times its
  // factor. Fails with `invalid_argument` naming the rate, or the group, that is not.
  [[nodiscard]] Result<void> check_lr(double lr) const;
  // `set_lr` of a rate `check_lr` took: fails only while capturing or when the device fails
  // (`load` writes the file's rate so, after it checked the rate with the rest of the file).
  [[nodiscard]] Result<void> write_lr(double lr);
  // Clips the gradients by their total norm from now on (see AdamOptions::max_grad_norm; 0: no
  // clipping). REQUIRES: `adopt` ran. Fails with `invalid_argument` for a bad norm or order.
  [[nodiscard]] Result<void> clip_by_norm(double max_norm, double norm_type);
  // Scales the loss from now on (see LossScaleOptions; nothing unless `dynamic`). REQUIRES:
  // `adopt` ran. Fails with `invalid_argument` for a bad option or parameters on several devices.
  [[nodiscard]] Result<void> scale_loss(const LossScaleOptions& options);
  // Whether the update clips (`max_grad_norm_` above 0, and parameters: over none there is
  // nothing to clip, and no norm tensor).
  [[nodiscard]] bool clips_gradients() const noexcept { return max_grad_norm_ > 0 && !params_.empty(); }
  void step();
  // `step()` over the parameters at `among` only (a training step's: those its backward reached,
  // as eager libtorch after zero_grad(set_to_none=true) steps only those with a gradient). The
  // gradients' unscaling and clipping, and the update, take those parameters alone.
  void step_only(const std::vector<std::size_t>& among);
  void step(std::span<const at::Tensor> grads);
  void zero_grad(bool set_to_none);
  // The static gradients' versions (empty without static gradients). AccumulateGrad adds into an
  // existing `.grad` in place, which moves its version: `reached_since` compares them after a
  // backward to tell the parameters it reached (a host decision, taken where the backward runs).
  [[nodiscard]] std::vector<std::int64_t> grad_versions() const;
  // Per parameter, whether a backward wrote its gradient since `versions` (grad_versions) were
  // read: the version moved, or `.grad` is another tensor (a backward with create_graph).
  [[nodiscard]] std::vector<bool> reached_since(const std::vector<std::int64_t>& versions) const;
  [[nodiscard]] Result<void> attach_grads();
  // The checkpoint (src/torch/optim_checkpoint.cpp; see Optimizer::save and load).
  [[nodiscard]] Result<void> save(::torch::serialize::OutputArchive& archive) const;
  [[nodiscard]] Result<void> load(::torch::serialize::InputArchive& archive);

  // A list of state tensors kept per parameter beside its step count, by the name of PyTorch's
  // `state_dict` ("exp_avg").
  struct PerParameter {
    std::string_view name;
    const std::vector<at::Tensor>* tensors = nullptr;
  };
  // The optimizer's kind ("adam", "sgd") and its lists, as a checkpoint names them.
  [[nodiscard]] virtual std::string_view kind() const noexcept = 0;
  [[nodiscard]] virtual std::vector<PerParameter> per_parameter_state() const = 0;

  // A parameter group (ParamGroup) as the state keeps it. Made by `adopt`; only the rate tensors'
  // contents change after (`write_lr`).
  struct Group {
    // Its parameters are params_[begin, end): the groups' parameters one group after another.
    std::size_t begin = 0;
    std::size_t end = 0;
    // A constant of the recorded graphs (the fused kernel takes it as a host double).
    double weight_decay = 0;
    // Its rate over the options' rate (`lr_`): the group's `lr / options.lr`, or exactly 1.
    double lr_factor = 1;
    // Its rate, where the update reads it: a float32 scalar on each device of its parameters (the
    // fused kernels read a float there), `lr_ * lr_factor`.
    std::vector<at::Tensor> lr_by_device;
  };

  // Recorded steps read every tensor here at its address: `load` copies into `steps_` and the
  // state lists, `write_lr` fills the groups' rates, never replacing one.
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grads_;
  std::vector<at::Tensor> steps_;
  std::vector<std::size_t> all_;  // 0, 1, ..., n-1
  bool static_grads_ = true;
  std::vector<Group> groups_;
  // Per parameter, its group's rate on its device (one of `groups_[g].lr_by_device`).
  std::vector<at::Tensor> lrs_;
  // The options' rate last written (by `adopt` and `write_lr`, under `in_use_`; read from any
  // thread); group g steps at `lr_ * groups_[g].lr_factor`.
  std::atomic<double> lr_{0};
  // Written by set_schedule under `in_use_`, read by a graphed step's call under it.
  LrSchedule schedule_;
  // Written by set_schedule, count_scheduled_step and load under `in_use_`; read from any thread.
  std::atomic<std::int64_t> scheduled_steps_{0};
  // Clipping by norm (0: none), and the norm before the last clip, on the first parameter's device.
  double max_grad_norm_ = 0;
  double grad_norm_type_ = 2;
  at::Tensor grad_norm_;
  // Dynamic loss scaling; null without. `step` unscales before the clip and updates the scale
  // after the update; the updates skip where its flag is set.
  std::unique_ptr<LossScale> loss_scale_;
  // Who is using the state (`StepInUse`, `OperationInUse`).
  StateInUse in_use_;
  // The step in progress of a training step with micro-batches one per call.
  StepProgress progress_;

 protected:
  // Scales `grads` by min(1, max_norm / (norm + 1e-6)) on the device, keeping the norm; nothing
  // without clipping.
  void clip(const std::vector<at::Tensor>& grads);
  // The update of the parameters at `index` (all of them, or those with a gradient), whose
  // gradients are `grads` (in `index` order): `update` once per group with any of them.
  void update_groups(const std::vector<std::size_t>& index, const std::vector<at::Tensor>& grads);
  // The update of the parameters at `index`, all of `group`, whose gradients are `grads`.
  virtual void update(const Group& group, const std::vector<std::size_t>& index, std::vector<at::Tensor> grads) = 0;
  // Picks `index` out of `all`.
  [[nodiscard]] static std::vector<at::Tensor> pick(const std::vector<at::Tensor>& all,
                                                    const std::vector<std::size_t>& index);
};

// One graphed step of an optimizer at a time (`TrainingStep`, `OptimizerStep`), on any thread: a
// call changes the optimizer's state (its gradients, its scheduled rate and step count, the
// micro-batches taken) before its pool's own one-caller check, so a second caller is turned away
// here, before it changes anything. Held for the call.
class StepInUse {
 public:
  // `in_use`: the optimizer state's `in_use_`.
  explicit StepInUse(StateInUse& in_use)
      : in_use_(in_use), taken_(in_use.take(StateInUse::Claim::step) == StateInUse::Outcome::taken) {}
  StepInUse(const StepInUse&) = delete;
  StepInUse& operator=(const StepInUse&) = delete;
  ~StepInUse() {
    if (taken_) in_use_.give_back();
  }
  // False: another graphed step of the optimizer is running (on another thread, or this call is
  // inside it); the call fails with `concurrent_use`.
  [[nodiscard]] bool taken() const noexcept { return taken_; }

 private:
  StateInUse& in_use_;
  bool taken_;
};

// A member of Optimizer that changes or copies the state holds it so for its duration; see
// StateInUse.
class OperationInUse {
 public:
  explicit OperationInUse(StateInUse& in_use) : in_use_(in_use), outcome_(in_use.take(StateInUse::Claim::operation)) {}
  OperationInUse(const OperationInUse&) = delete;
  OperationInUse& operator=(const OperationInUse&) = delete;
  ~OperationInUse() {
    if (outcome_ == StateInUse::Outcome::taken) in_use_.give_back();
  }
  // A graphed step of the optimizer runs on another thread: the member fails (`concurrent_use`, or
  // a c10::Error where it returns nothing) before it changes anything.
  [[nodiscard]] bool refused() const noexcept { return outcome_ == StateInUse::Outcome::refused; }
  // Called from inside this thread's graphed step: its function's own zero_grad and step, or the
  // program's loss function or schedule.
  [[nodiscard]] bool inside() const noexcept { return outcome_ == StateInUse::Outcome::inside; }

 private:
  StateInUse& in_use_;
  StateInUse::Outcome outcome_;
};

// The `concurrent_use` message of a step (`what`) turned away by `StepInUse`.
[[nodiscard]] inline std::string step_in_use(std::string_view what) {
  return std::string(what) +
         ": another graphed step of this optimizer is running (on another thread, or this call is inside it); "
         "one step of an optimizer at a time";
}

// The message of `what`, refused while a training step's step is in progress (`taken` micro-batches
// accumulated in the gradients), which it `would` change.
[[nodiscard]] inline std::string step_in_progress(std::string_view what, std::int64_t taken, std::string_view would) {
  return std::string(what) + ": a training step of this optimizer is in the middle of its step (" +
         std::to_string(taken) + " micro-batches taken, their gradients accumulated), which " + std::string(would) +
         "; finish that step, or call restart_step() on it";
}

// The message of a member (`what`) turned away by `OperationInUse`.
[[nodiscard]] inline std::string used_by_another_thread(std::string_view what) {
  return std::string(what) +
         ": another thread's graphed step of this optimizer (a TrainingStep or OptimizerStep call) is running; "
         "call it between steps (from that step's own function, on its thread, it works)";
}

class Adam::State final : public Optimizer::State {
 public:
  [[nodiscard]] std::string_view kind() const noexcept override;
  [[nodiscard]] std::vector<PerParameter> per_parameter_state() const override;
  AdamOptions options_;
  std::vector<at::Tensor> exp_avgs_;
  std::vector<at::Tensor> exp_avg_sqs_;
  std::vector<at::Tensor> max_exp_avg_sqs_;

 private:
  void update(const Group& group, const std::vector<std::size_t>& index, std::vector<at::Tensor> grads) override;
  // The multi-tensor formula, for parameter sets the fused kernel does not take.
  void update_multi_tensor(const Group& group, const std::vector<std::size_t>& index, std::vector<at::Tensor> grads);
};

class SGD::State final : public Optimizer::State {
 public:
  [[nodiscard]] std::string_view kind() const noexcept override;
  [[nodiscard]] std::vector<PerParameter> per_parameter_state() const override;
  SGDOptions options_;
  std::vector<at::Tensor> momentum_buffers_;

 private:
  void update(const Group& group, const std::vector<std::size_t>& index, std::vector<at::Tensor> grads) override;
};

}  // namespace cgt::torch
