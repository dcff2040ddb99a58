// A randomized adversarial stress test of the host backend: seeded sequences of calls a
// careless or hostile user makes — many functions (aliasing outputs, views, transposes,
// pass-through, in-place mutation of copied, static and pool-managed inputs, empty outputs,
// scalars), leases borrowed, moved into calls, dropped and reset at random, random steps,
// injected throws and out-of-memory, random options and teardown orders — checked after every
// call against an eager model: every value the test holds (leases and its own buffers) has the
// value a plain run gives, or a lease reports the documented Errc (output_overwritten after a new
// step and a call, unless copy_out_on_new_step; pool_shut_down after shutdown()); every call
// gives a value or an Errc it may give there; debug_checks is always on, so a pool whose memory
// and leases disagree fails the call with invariant_violation, which is never accepted.
// A [threads] variant drops handles on a second thread while the main thread calls the pool
// (stress/graveyard.hpp); the reproducers of the bugs it found are test_stress_reproducers.cpp.
// Sizes and seeds: tests/stress/config.hpp (environment variables); scripts/stress.sh runs it long.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <expected>
#include <initializer_list>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

import cgt;
import cgt.host;

#include "stress/config.hpp"
#include "stress/model.hpp"
#include "stress/functions.hpp"
#include "stress/graveyard.hpp"
#include "stress/records.hpp"

namespace stress {
namespace {

using cgt::Errc;
using cgt::host::Buffer;

class Sequence {
 public:
  Sequence(const Config& config, std::uint64_t seed, Figures& figures, bool threaded)
      : config_(config), moves_(config.moves), rng_(seed), figures_(figures), graveyard_(threaded) {}

  void run() {
    setup();
    for (std::size_t s = 0; s < config_.steps; ++s) {
      action_ = s;
      act();
      ++figures_.actions;
    }
    teardown();
  }

  std::string recent_log() const {
    std::string out;
    const std::size_t from = config_.verbose ? 0 : (log_.size() > 30 ? log_.size() - 30 : 0);
    for (std::size_t i = from; i < log_.size(); ++i) out += "    " + log_[i] + "\n";
    return out;
  }
  std::string options_text() const { return options_text_; }

 private:
  // ---- randomness -------------------------------------------------------------------------
  std::uint64_t pick(std::uint64_t bound) {
    return bound == 0 ? 0 : std::uniform_int_distribution<std::uint64_t>(0, bound - 1)(rng_);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  double random_value() { return f32(static_cast<double>(pick(1000)) / 64.0 - 4); }

  void log(std::string line) { log_.push_back("[" + std::to_string(action_) + "] " + std::move(line)); }
  [[noreturn]] void broken(const std::string& what) { throw Broken{what}; }
  void expect(bool ok, const std::string& what) {
    if (!ok) broken(what);
  }
  Buffer make_buffer(cgt::host::ElementType type, std::initializer_list<std::int64_t> sizes) {
    return make_buffer(type, std::span<const std::int64_t>(sizes.begin(), sizes.size()));
  }
  Buffer make_buffer(cgt::host::ElementType type, std::span<const std::int64_t> sizes) {
    auto made = Buffer::make(type, sizes);
    if (!made) broken("Buffer::make failed: " + made.error().describe());
    return std::move(*made);
  }

  // ---- setup ------------------------------------------------------------------------------
  void setup() {
    cgt::host::PoolOptions options;
    options.poison_dead_memory = chance(0.7);
    cgt::Options& tree = options.tree;
    tree.debug_checks = true;
    tree.skip_warmup = chance(0.3);
    tree.rerecord_limit = std::array<std::uint32_t, 3>{0, 1, 128}[pick(3)];
    tree.on_static_input_moved = chance(0.3) ? cgt::OnStaticInputMoved::error : cgt::OnStaticInputMoved::rerecord;
    tree.or_error = chance(0.15);
    tree.copy_out_on_new_step = moves_.copy_out && chance(0.4);
    tree.shape_key_limit = chance(0.2) ? static_cast<std::uint32_t>(1 + pick(3)) : 0;
    tree.shape_key_warn_limit = static_cast<std::uint32_t>(pick(4));
    throwing_sink_ = moves_.throwing_log_sink && chance(0.3);
    tree.log_sink = [this, throwing = throwing_sink_](const cgt::Event&) {
      ++events_;
      if (throwing) throw std::runtime_error("log sink failed");
    };
    if (moves_.arena_limit && chance(0.4)) {
      options.arena.segment_bytes = std::size_t{1} << (12 + pick(3));
      options.arena.max_bytes = options.arena.segment_bytes * (1 + pick(4));
      limited_arena_ = true;
    }
    if (chance(0.3)) {
      // A budget of a few segments: recordings past it run eagerly or evict the coldest graphs.
      const std::size_t segment = options.arena.segment_bytes;
      tree.memory_budget_bytes = segment * (1 + pick(3));
      tree.over_budget = chance(0.5) ? cgt::OverBudget::evict_coldest : cgt::OverBudget::run_eagerly;
    }
    or_error_ = tree.or_error;
    static_error_ = tree.on_static_input_moved == cgt::OnStaticInputMoved::error;
    copy_out_ = tree.copy_out_on_new_step;
    std::ostringstream text;
    text << "skip_warmup=" << tree.skip_warmup << " rerecord_limit=" << tree.rerecord_limit
         << " static_moved_error=" << static_error_ << " or_error=" << or_error_ << " copy_out=" << copy_out_
         << " shape_key_limit=" << tree.shape_key_limit << " poison=" << options.poison_dead_memory
         << " arena_max=" << options.arena.max_bytes << " segment=" << options.arena.segment_bytes
         << " throwing_sink=" << throwing_sink_ << " budget=" << tree.memory_budget_bytes
         << " evict=" << (tree.over_budget == cgt::OverBudget::evict_coldest);
    options_text_ = text.str();

    if (moves_.inconsistent_options && chance(0.2)) {
      cgt::host::PoolOptions bad;
      bad.tree.skip_warmup = bad.tree.force_warmup = true;
      auto refused = cgt::host::make_pool(std::move(bad));
      expect(!refused && refused.error().code == Errc::invalid_argument,
             "make_pool with skip_warmup and force_warmup: expected invalid_argument, got " +
                 (refused ? std::string("a pool") : std::string(cgt::to_string(refused.error().code))));
    }

    auto pool = cgt::host::make_pool(std::move(options));
    expect(pool.has_value(), "make_pool failed: " + (pool ? std::string() : pool.error().describe()));
    pool_.emplace(std::move(*pool));
    // A third of the programs mark a step first: from then on forwards begin none by themselves.
    // A third never mark one: their steps are the ones forwards begin. The rest let forwards
    // begin steps until their first mark_step_begin().
    const auto steps = pick(3);
    if (steps == 0) new_step();
    never_marks_steps_ = steps == 1;
    auto device = pool_->device();
    expect(device.has_value(), "device() of a new pool failed");
    arena_ = &device->get().arena();

    for (const FnDef& def : catalog()) {
      if (def.keeps_pool_buffer && !moves_.cached_pool_buffer) continue;
      if (!chance(0.8)) continue;
      add(def);
    }
    if (fns_.empty()) add(catalog().front());
    static constexpr std::int64_t lengths[] = {0, 1, 4, 16, 64};
    lengths_ = {lengths[pick(5)], lengths[pick(5)]};
    // A program: the same calls every step, as a training or decoding loop makes them, so that
    // the tree's recordings replay; the rest of the actions perturb it.
    if (chance(0.3)) return add_training_program();
    const std::size_t length = 2 + pick(5);
    for (std::size_t i = 0; i < length; ++i) script_.push_back({pick(fns_.size()), lengths_[pick(2)]});
  }

  /// A training loop, as autograd functions and a training step run on a GPU: the layers'
  /// forwards in order, their backwards in reverse (each a function of the backward mode, reading
  /// the outputs the forwards left, often moved in as saved values are), then an update that
  /// writes a static weight in place (an optimizer's step). The rest of the walk perturbs it:
  /// steps marked between a forward and its backward, outputs dropped before the backward,
  /// throwing forwards, handles dropped in any order.
  void add_training_program() {
    const std::vector<FnDef> defs = catalog();
    std::vector<std::size_t> layers;
    for (std::size_t d = 0; d < defs.size(); ++d) {
      const FnDef& def = defs[d];
      const bool vectors_only = std::all_of(def.inputs.begin(), def.inputs.end(), [](In in) { return in == In::vec; });
      if (vectors_only && !def.keeps_pool_buffer && def.buckets.sizes.empty() && def.graph_sizes.empty()) {
        layers.push_back(d);
      }
    }
    if (layers.empty()) return;
    const std::int64_t length = lengths_[0];
    std::vector<std::size_t> backwards;
    for (std::size_t l = 0, count = 1 + pick(3); l < count; ++l) {
      const FnDef& def = defs[layers[pick(layers.size())]];
      add(def, cgt::FunctionMode::forward);
      script_.push_back({fns_.size() - 1, length});
      add(def, cgt::FunctionMode::backward);
      backwards.push_back(fns_.size() - 1);
    }
    for (auto b = backwards.rbegin(); b != backwards.rend(); ++b) script_.push_back({*b, length});
    for (const FnDef& def : defs) {
      if (def.name != "static_axpy_and_bump") continue;
      add(def, cgt::FunctionMode::inference);
      script_.push_back({fns_.size() - 1, length});
    }
    log("a training program: " + std::to_string(backwards.size()) + " layers");
    ++figures_.training_programs;
  }

  struct Template {
    std::size_t fn = 0;
    std::int64_t length = 0;
  };

  struct Fn {
    FnDef def;
    std::shared_ptr<Control> control;
    std::optional<cgt::host::Function> handle;
    std::string name;
    bool dropped = false;
    bool called = false;  // a call succeeded: its signature (count, types, ranks) is fixed
    cgt::FunctionMode mode = cgt::FunctionMode::inference;
    std::shared_ptr<Runs> runs = std::make_shared<Runs>();  // the body's and the work's runs (check_runs)
  };

  void add(const FnDef& def, std::optional<cgt::FunctionMode> mode = std::nullopt) {
    Fn fn{def, std::make_shared<Control>(), std::nullopt, def.name + "#" + std::to_string(fns_.size()), false, false};
    // Any function may be a forward or a backward: the modes change when steps begin only before
    // the program marks one (the walk marks one first), and which backward is pending.
    fn.mode = mode ? *mode : static_cast<cgt::FunctionMode>(pick(3));
    // A function that writes its input without saying so: the pool must see the writes itself.
    const bool undeclared = moves_.undeclared_writes && !def.mutated.empty() && chance(0.4);
    auto added = pool_->add_function(counted(def.make(fn.control), fn.runs),
                                     {.name = fn.name,
                                      .static_inputs = def.statics,
                                      .mutated_inputs = undeclared ? std::vector<std::size_t>{} : def.mutated,
                                      .graph_sizes = def.graph_sizes,
                                      .buckets = def.buckets,
                                      .mode = fn.mode,
                                      .warm_up_each_shape = !chance(0.3),
                                      .control_flow_on_host = def.control_flow_on_host});
    if (shut_down_) {
      expect(!added && added.error().code == Errc::pool_shut_down,
             "add_function after shutdown(): expected pool_shut_down");
      return;
    }
    expect(added.has_value(), "add_function failed: " + (added ? std::string() : added.error().describe()));
    fn.handle.emplace(std::move(*added));
    fns_.push_back(std::move(fn));
  }

  // ---- values -----------------------------------------------------------------------------
  std::int64_t random_length() {
    static constexpr std::int64_t lengths[] = {0, 1, 4, 16, 64};
    if (limited_arena_ && chance(0.05)) return std::int64_t{256} << pick(4);  // may not fit the arena
    if (chance(0.1)) return lengths[pick(std::size(lengths))];
    return lengths_[pick(lengths_.size())];  // mostly the sequence's own two: shapes repeat, graphs replay
  }

  /// A new caller-owned value of `sizes`, in a random layout.
  Owned& make_owned(std::vector<std::int64_t> sizes, bool may_overlap, bool contiguous = false) {
    const std::int64_t n = sizes.size() == 1 ? sizes[0] : sizes[0] * sizes[1];
    Owned owned;
    const auto layout = contiguous ? 7 : pick(8);
    std::string how = "contiguous";
    if (sizes.size() == 1 && layout == 1) {  // a slice at an offset
      Buffer backing = make_buffer(cgt::host::ElementType::f32, {n + 3});
      owned.buffer = backing.slice(3, n + 3);
      how = "offset slice";
    } else if (sizes.size() == 1 && layout == 2) {  // every other element
      Buffer backing = make_buffer(cgt::host::ElementType::f32, {2 * n + 1});
      const std::int64_t strides[] = {2};
      owned.buffer = backing.restrided(1, sizes, strides);
      how = "stride 2";
    } else if (sizes.size() == 1 && layout == 3 && may_overlap && moves_.overlapping_inputs && n > 1) {
      Buffer backing = make_buffer(cgt::host::ElementType::f32, {1});
      owned.buffer = backing.expand(sizes);
      owned.injective = false;
      how = "expanded (stride 0)";
    } else if (sizes.size() == 1 && layout == 4 && moves_.negative_stride_inputs && n > 1) {
      Buffer backing = make_buffer(cgt::host::ElementType::f32, {n});
      const std::int64_t strides[] = {-1};
      owned.buffer = backing.restrided(n - 1, sizes, strides);
      how = "reversed (stride -1)";
    } else if (sizes.size() == 2 && layout < 3) {  // a transposed view of a (c, r) buffer
      Buffer backing = make_buffer(cgt::host::ElementType::f32, {sizes[1], sizes[0]});
      owned.buffer = transpose_view(backing);
      how = "transposed";
    } else {
      owned.buffer = make_buffer(cgt::host::ElementType::f32, sizes);
    }
    owned.object = std::make_shared<Object>();
    owned.offsets = offsets_of(owned.buffer);
    std::vector<double> data(static_cast<std::size_t>(n));
    for (double& v : data) v = random_value();
    if (!owned.injective) std::fill(data.begin(), data.end(), data.empty() ? 0 : data[0]);
    for (std::size_t i = 0; i < data.size(); ++i) owned.buffer.set(i, data[i]);
    scatter(*owned.object, owned.offsets, data);
    log("new value " + std::to_string(owned_.size()) + " " + how + " n=" + std::to_string(n));
    owned_.push_back(std::move(owned));
    return owned_.back();
  }

  std::size_t owned_index_of(const Owned* owned) const {
    for (std::size_t o = 0; o < owned_.size(); ++o) {
      if (&owned_[o] == owned) return o;
    }
    return owned_.size();
  }

  /// The static weight of length n (made on first use).
  Owned& weight(std::int64_t n) {
    auto it = weights_.find(n);
    if (it == weights_.end() || chance(0.03)) {  // sometimes a new one: the static input moved
      Owned& w = make_owned({n}, false, !moves_.strided_static_inputs);
      weights_[n] = owned_.size() - 1;
      log("weight n=" + std::to_string(n) + " is now value " + std::to_string(owned_.size() - 1));
      return w;
    }
    return owned_[it->second];
  }

  // ---- one action -------------------------------------------------------------------------
  void act() {
    const auto action = pick(1000);
    if (action < 400) return script_step();
    if (action < 560) return call();
    if (action < 680) return drop_held();
    if (action < 710) return reset_held();
    if (action < 760) return take_held();
    if (action < 880) return new_step();
    if (action < 900) return bundle_drop();
    if (action < 920 && moves_.wrong_calls) return wrong_call();
    if (action < 930) return drop_function();
    if (action < 935) return readd_function();
    if (action < 931 && moves_.shutdown_midway) return shutdown();
    if (action < 942) return drop_pool_handle();
    if (action < 950 && moves_.stale_value_passed) return pass_stale_value();
    if (action < 955 && moves_.moved_from_handles) return moved_from_call();
    if (action < 962) return sleep_pool();
    if (action < 975) return discard_owned();
  }

  /// The next call of the program; at its end, most leases of the step die and a new step begins.
  void script_step() {
    if (script_at_ == script_.size()) {
      script_at_ = 0;
      std::vector<std::size_t> gone;
      for (std::size_t h = 0; h < held_.size(); ++h) {
        if (!chance(0.2)) gone.push_back(h);
      }
      log("end of the program's loop");
      forget(gone);
      if (chance(0.8)) new_step();
      return;
    }
    const Template t = script_[script_at_++];
    Fn& fn = fns_[t.fn];
    if (fn.dropped || !fn.handle) return call();
    call(&fn, t.length);
  }

  Fn* random_function() {
    std::vector<Fn*> live;
    for (Fn& fn : fns_) {
      if (!fn.dropped) live.push_back(&fn);
    }
    return live.empty() ? nullptr : live[pick(live.size())];
  }

  // Which held leases a call has seen stale (a new step began after they were made).
  bool is_stale(const Held& h) const { return h.reclaimable && h.step < step_; }

  struct Input {
    ObjectPtr object;
    std::vector<std::int64_t> offsets;
    std::byte* storage = nullptr;
    bool maybe_stale = false;
    std::optional<std::size_t> held;  // index into held_
    bool moved = false;
    bool as_lease = false;  // the lease itself was passed (moved or borrowed), not a view of its value
    std::string what;
  };

  /// An input of `sizes` for a call: a held lease (borrowed, moved, or a view of its value), or
  /// a value of the test's own. `mutable_only`: it may be written.
  Input choose_input(const Fn& fn, std::size_t i, const std::vector<std::int64_t>& sizes,
                     std::vector<cgt::host::Arg>& args, std::vector<std::size_t>& used, std::deque<Buffer>& views,
                     bool is_static) {
    Input input;
    const bool mutated = std::find(fn.def.mutated.begin(), fn.def.mutated.end(), i) != fn.def.mutated.end();
    if (is_static) {
      Owned& w = weight(sizes[0]);
      input.object = w.object;
      input.offsets = w.offsets;
      input.storage = w.buffer.storage();
      input.what = "weight";
      args.emplace_back(w.buffer);
      return input;
    }
    const bool leases_ok = !(fn.def.name == "sized_head_and_shift" && !moves_.graph_sizes_view);
    std::vector<std::size_t> candidates;
    for (std::size_t h = 0; h < held_.size() && leases_ok; ++h) {
      if (held_[h].sizes != sizes || std::find(used.begin(), used.end(), h) != used.end()) continue;
      if (mutated && !held_[h].injective) continue;
      if (held_[h].bundle && (is_stale(held_[h]) || !held_[h].get())) continue;
      if (is_stale(held_[h]) && !chance(0.15)) continue;  // mostly fresh ones
      candidates.push_back(h);
    }
    if (!candidates.empty() && chance(0.6)) {
      const std::size_t h = candidates[pick(candidates.size())];
      Held& held = held_[h];
      used.push_back(h);
      input.object = held.object;
      input.offsets = held.offsets;
      input.held = h;
      input.maybe_stale = is_stale(held) || (shut_down_ && held.reclaimable);
      auto value = held.get();
      if (value) input.storage = value->get().storage();
      // The value of a lease a new step reclaims is an escaped value.
      const bool value_ok = value && (!is_stale(held) || moves_.stale_value_passed);
      const auto how = pick(10);
      if (!held.bundle && how < 3) {
        input.moved = true;
        input.as_lease = true;
        input.what = "lease " + std::to_string(h) + " moved in";
        args.emplace_back(std::move(held.lease));
      } else if (how < 5 && value_ok && sizes.size() == 2 && sizes[0] == sizes[1] && moves_.restrided_inputs &&
                 !mutated) {
        // Its transpose: the same sizes and data address, other strides.
        views.push_back(transpose_view(value->get()));
        input.offsets = offsets_of(views.back());
        input.what = "transpose of lease " + std::to_string(h);
        args.emplace_back(views.back());
      } else if ((how < 7 && value_ok) || held.bundle) {
        views.push_back(value->get());
        input.what = "value of lease " + std::to_string(h);
        args.emplace_back(views.back());
      } else {
        input.as_lease = true;
        input.what = "lease " + std::to_string(h) + " borrowed";
        args.emplace_back(held.lease);
      }
      return input;
    }
    Owned* owned = nullptr;
    std::vector<std::size_t> mine;
    for (std::size_t o = 0; o < owned_.size(); ++o) {
      if (owned_[o].buffer.sizes().size() == sizes.size() &&
          std::equal(sizes.begin(), sizes.end(), owned_[o].buffer.sizes().begin()) &&
          (owned_[o].injective || !mutated)) {
        mine.push_back(o);
      }
    }
    if (!mine.empty() && chance(0.85)) {
      owned = &owned_[mine[pick(mine.size())]];
    } else {
      owned = &make_owned(sizes, !mutated);
    }
    input.object = owned->object;
    input.offsets = owned->offsets;
    input.storage = owned->buffer.storage();
    input.what = "value " + std::to_string(owned_index_of(owned));
    args.emplace_back(owned->buffer);
    return input;
  }

  // A call runs its function's work once: exactly once when it succeeds (a replay's graph, or the
  // one run of a warm-up, a recording or an eager call, whatever was given up on the way), at most
  // once when it fails. Its body runs none of the times it replays, and at most twice otherwise
  // (a recording given up before its graph ran, then an eager run or a warm-up).
  void check_runs(const std::string& text, const Fn& fn, const Runs& before,
                  const cgt::Result<cgt::host::Outputs>& result) {
    const std::uint64_t kernels = fn.runs->kernels - before.kernels;
    const std::uint64_t bodies = fn.runs->bodies - before.bodies;
    ++figures_.checks;
    if (!result) {
      expect(kernels <= 1,
             "the failed call " + text + " ran its function's work " + std::to_string(kernels) + " times");
      expect(bodies <= 2, "the failed call " + text + " ran its function's body " + std::to_string(bodies) + " times");
      return;
    }
    const std::string kind(cgt::to_string(result->kind()));
    expect(kernels == 1, "the call " + text + " (" + kind + ") ran its function's work " + std::to_string(kernels) +
                             " times, not once");
    if (result->kind() == cgt::CallKind::replay) {
      expect(bodies == 0, "the replay " + text + " ran its function's body");
    } else {
      expect(bodies >= 1 && bodies <= 2,
             "the call " + text + " (" + kind + ") ran its function's body " + std::to_string(bodies) + " times");
    }
  }

  void call(Fn* fn = nullptr, std::optional<std::int64_t> length = std::nullopt) {
    if (fn == nullptr) fn = random_function();
    if (fn == nullptr || !fn->handle) return;
    const bool begins_step = before_pool_call(*fn);
    const FnDef& def = fn->def;
    std::vector<cgt::host::Arg> args;
    std::vector<Input> inputs;
    std::vector<Value> model_inputs;
    std::vector<std::int64_t> scalars(def.inputs.size(), 0);
    std::vector<std::size_t> used;
    std::deque<Buffer> views;
    const std::int64_t n = length ? *length : random_length();
    const std::vector<std::int64_t> mat{static_cast<std::int64_t>(1 + pick(3)), static_cast<std::int64_t>(1 + pick(3))};
    std::string text = fn->name + "(";
    for (std::size_t i = 0; i < def.inputs.size(); ++i) {
      if (def.inputs[i] == In::scalar) {
        scalars[i] = static_cast<std::int64_t>(1 + pick(3));
        args.emplace_back(scalars[i]);
        inputs.push_back({});
        model_inputs.push_back({});
        text += std::to_string(scalars[i]) + ", ";
        continue;
      }
      const bool is_static = std::find(def.statics.begin(), def.statics.end(), i) != def.statics.end();
      std::vector<std::int64_t> sizes = def.inputs[i] == In::mat ? mat : std::vector<std::int64_t>{n};
      inputs.push_back(choose_input(*fn, i, sizes, args, used, views, is_static));
      model_inputs.push_back({sizes, gather(*inputs.back().object, inputs.back().offsets)});
      text += inputs.back().what + ", ";
    }
    text += ")";

    // What may go wrong, and what must.
    std::set<Errc> allowed;
    bool any_stale = false;
    for (const Input& input : inputs) any_stale = any_stale || input.maybe_stale;
    if (any_stale) allowed.insert({Errc::output_overwritten, Errc::pool_shut_down});
    if (limited_arena_) allowed.insert(Errc::out_of_memory);
    if (or_error_) allowed.insert(Errc::graph_unavailable);
    if (static_error_ && !def.statics.empty()) allowed.insert(Errc::static_input_moved);
    if (shut_down_) allowed = {Errc::pool_shut_down};
    if (def.keeps_pool_buffer) allowed.insert({Errc::invalid_argument, Errc::function_failed, Errc::backend_error});
    if (throwing_sink_) allowed.insert(Errc::function_failed);
    fn->control->threw = false;
    std::optional<std::size_t> victim;
    if (def.throws && chance(0.35)) {
      const bool non_std = moves_.throw_non_std && chance(0.5);
      if (moves_.throw_std || non_std) {
        fn->control->throw_next = non_std ? Control::Throw::non_std : Control::Throw::std_error;
        allowed.insert(Errc::function_failed);
        text += non_std ? " [throws int]" : " [throws]";
        if (moves_.drop_lease_then_throw && !held_.empty() && chance(0.5)) {
          const std::size_t h = pick(held_.size());
          if (std::find(used.begin(), used.end(), h) == used.end()) {
            victim = h;
            fn->control->before_throw = [this, h] {
              held_[h].lease.reset();
              held_[h].bundle.reset();
            };
            text += " [drops lease " + std::to_string(h) + " first]";
          }
        }
      }
    }
    log(text);

    const Expected expected = def.model(model_inputs, scalars);
    const Runs runs_before = *fn->runs;
    const auto before_calls = pool_stats_calls();
    const std::uint64_t padded_before = pool_ ? pool_->stats().padded_calls : 0;
    const std::uint64_t evictions_before = pool_ ? pool_->stats().evictions : 0;
    const std::uint64_t over_budget_before = pool_ ? pool_->stats().count(cgt::Reason::over_budget) : 0;
    cgt::Result<cgt::host::Outputs> result = std::unexpected(cgt::Error{});
    try {
      graveyard_.in_call = true;
      result = (*fn->handle)(std::span<const cgt::host::Arg>(args));
      graveyard_.in_call = false;
    } catch (...) {
      graveyard_.in_call = false;
      fn->control->throw_next = Control::Throw::none;
      fn->control->before_throw = nullptr;
      broken("an exception escaped the call " + text);
    }
    fn->control->throw_next = Control::Throw::none;
    fn->control->before_throw = nullptr;
    ++figures_.calls;
    (void)before_calls;

    if (def.keeps_pool_buffer) user_wrote_kept_block(*fn);
    check_runs(text, *fn, runs_before, result);
    std::vector<std::size_t> gone;  // held entries to forget
    if (victim && fn->control->threw) gone.push_back(*victim);
    if (!result) {
      const Errc code = result.error().code;
      ++figures_.errors[std::string(cgt::to_string(code))];
      log("  -> " + result.error().describe());
      expect(allowed.contains(code),
             "call " + text + " failed with an error it may not give here: " + result.error().describe());
      if (begins_step) step_not_begun();
      for (const Input& input : inputs) {
        if (!input.moved) continue;
        if (moves_.moved_lease_into_failing_call) {
          expect(held_[*input.held].lease.is_valid() || input.maybe_stale,
                 "a lease moved into a call that failed (" + std::string(cgt::to_string(code)) +
                     ") was consumed: on failure nothing the caller holds may change");
        } else {
          gone.push_back(*input.held);
        }
      }
      args.clear();  // drops what the call did not consume
      forget(gone);
      rekey();
      verify_all("after the failed call " + text);
      return;
    }
    ++figures_.ok_calls;
    fn->called = true;
    if (fn->mode != cgt::FunctionMode::inference) pending_backward_ = fn->mode == cgt::FunctionMode::forward;
    expect(!pool_ || pool_->has_pending_backward() == pending_backward_,
           "has_pending_backward() is not " + std::string(pending_backward_ ? "true" : "false") +
               " after a call of a " + std::string(cgt::to_string(fn->mode)) + " function");
    ++figures_.kinds[std::string(cgt::to_string(result->kind()))];
    if (pool_) {
      // Only a bucketed function's calls are padded, and one that replays or records at a size
      // between its buckets always is.
      const std::uint64_t padded = pool_->stats().padded_calls - padded_before;
      figures_.padded_calls += padded;
      figures_.evictions += pool_->stats().evictions - evictions_before;
      figures_.over_budget += pool_->stats().count(cgt::Reason::over_budget) - over_budget_before;
      const auto& sizes = def.buckets.sizes;
      const std::int64_t n = model_inputs.empty() || model_inputs[0].sizes.empty() ? 0 : model_inputs[0].sizes[0];
      const bool between =
          !sizes.empty() && n > 0 && n < sizes.back() && std::find(sizes.begin(), sizes.end(), n) == sizes.end();
      expect(padded <= (between ? 1U : 0U), "call " + text + " was padded: its size is not between two buckets");
      const bool graphed = result->kind() == cgt::CallKind::replay || result->kind() == cgt::CallKind::recording;
      expect(!between || !graphed || padded == 1,
             "call " + text + " between two buckets " + std::string(cgt::to_string(result->kind())) + " unpadded");
    }
    last_call_step_ = step_;
    log("  -> " + std::string(cgt::to_string(result->kind())) + " node " + std::to_string(result->node()));
    expect(!shut_down_, "a call after shutdown() succeeded");
    for (const Input& input : inputs) {
      if (input.moved) gone.push_back(*input.held);
    }
    // In-place writes, in the model.
    for (const auto& [i, after] : expected.mutated) scatter(*inputs[i].object, inputs[i].offsets, after.data);

    auto outputs = std::make_shared<cgt::host::Outputs>(std::move(*result));
    expect(outputs->size() == expected.outputs.size(), "wrong number of outputs");
    std::vector<ObjectPtr> temps(4);
    std::vector<std::byte*> temp_storage(4, nullptr);
    const bool keep_bundle = chance(0.2);
    std::vector<Held> fresh;
    for (std::size_t o = 0; o < expected.outputs.size(); ++o) {
      auto got = outputs->get(o);
      expect(got.has_value(), "output " + std::to_string(o) +
                                  " of a successful call: " + (got ? std::string() : got.error().describe()));
      const Buffer& value = got->get();
      const std::vector<double> actual = read(value);
      expect(value.sizes().size() == expected.outputs[o].sizes.size() &&
                 std::equal(value.sizes().begin(), value.sizes().end(), expected.outputs[o].sizes.begin()),
             "output " + std::to_string(o) + " of " + text + " has other sizes than eager");
      expect(def.keeps_pool_buffer || same(actual, expected.outputs[o].data),
             "output " + std::to_string(o) + " of " + text + " is " + show(actual) + ", eager gives " +
                 show(expected.outputs[o].data));
      // Which memory it is: a view of an input when it shares the input's storage or the call was
      // eager (else the input was copied into a slot), else new memory, shared by one temp's outputs.
      Held held;
      held.offsets = offsets_of(value);
      held.sizes = expected.outputs[o].sizes;
      held.step = step_;
      held.from = fn->name;
      held.reclaimable = arena_->contains(reinterpret_cast<std::uintptr_t>(value.storage()));
      held.injective = std::set<std::int64_t>(held.offsets.begin(), held.offsets.end()).size() == held.offsets.size();
      held.escaped = value;
      if (moves_.empty_outputs_untracked && value.numel() == 0) {
        // Like PyTorch, an empty output is not pool memory: holding it changes no liveness pattern.
        expect(!held.reclaimable,
               "output " + std::to_string(o) + " of " + text + " is empty but tracked as a pool block");
      }
      const Out out = def.outs[o];
      // An eager call copies no input into a slot: its view of an input is the input's memory,
      // even where that memory moved during the call (a lease copied out by the step it began).
      const bool eager = outputs->kind() == cgt::CallKind::eager;
      if (out.input >= 0 && (eager || inputs[static_cast<std::size_t>(out.input)].storage == value.storage())) {
        held.object = inputs[static_cast<std::size_t>(out.input)].object;
      } else {
        const std::size_t t = out.temp >= 0 ? static_cast<std::size_t>(out.temp) : 3;
        if (temps[t] && temp_storage[t] == value.storage()) {
          held.object = temps[t];
        } else {
          held.object = temps[t] = std::make_shared<Object>();
          temp_storage[t] = value.storage();
        }
      }
      if (def.keeps_pool_buffer && held.object == temps[0]) {
        for (std::size_t h = 0; h < held_.size(); ++h) {
          auto other = held_[h].get();
          // A view of an input's memory (the kept block may be what the call was given) aliases
          // whatever lease holds that input: the engine hands it out as an alias, which is right.
          const bool is_input = std::any_of(inputs.begin(), inputs.end(), [&](const Input& in) {
            return in.held == h || in.storage == value.storage();
          });
          // Outside the pool (an eager call's heap buffer, kept by the function) two leases on one
          // buffer are the function's own doing; the pool only promises its own memory.
          expect(is_input || !held.reclaimable || !other || value.numel() == 0 ||
                     other->get().storage() != value.storage(),
                 "output " + std::to_string(o) + " of " + text + " is the memory of lease " + std::to_string(h) +
                     ", which the test still holds: a lease was handed out on memory another lease holds");
        }
      }
      // (kept_buffer's values are what it wrote over memory it may no longer own: taken as they are.)
      scatter(*held.object, held.offsets, def.keeps_pool_buffer ? actual : expected.outputs[o].data);
      if (keep_bundle) {
        held.bundle = outputs;
        held.index = o;
      } else {
        auto lease = outputs->release(o);
        expect(lease.has_value(), "release(" + std::to_string(o) + ") failed");
        held.lease = std::move(*lease);
      }
      fresh.push_back(std::move(held));
    }
    args.clear();
    forget(gone);
    for (Held& h : fresh) {
      if (chance(0.8)) {
        held_.push_back(std::move(h));
      } else if (!h.bundle) {
        graveyard_.bury(std::move(h.lease));
      }
    }
    if (keep_bundle) graveyard_.bury(std::move(outputs));
    rekey();
    verify_all("after the call " + text);
  }

  /// kept_buffer writes the block it kept from an earlier call, whoever owns it now: a user's
  /// bug the pool cannot stop (the write happens before the function returns). What the test
  /// holds there now has what was written; the pool's part is to never hand out a lease on it.
  void user_wrote_kept_block(const Fn& fn) {
    std::byte* kept = fn.control->kept_storage;
    if (kept == nullptr) return;
    for (Held& held : held_) {
      auto value = held.get();
      if (value && value->get().storage() == kept) scatter(*held.object, held.offsets, read(value->get()));
    }
    for (Owned& owned : owned_) {
      if (owned.buffer.storage() == kept) scatter(*owned.object, owned.offsets, read(owned.buffer));
    }
  }

  void forget(std::vector<std::size_t> gone) {
    std::sort(gone.rbegin(), gone.rend());
    gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
    for (std::size_t h : gone) {
      graveyard_.bury(std::move(held_[h].lease));
      if (held_[h].bundle) graveyard_.bury(std::move(held_[h].bundle));
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(h));
    }
  }

  std::uint64_t pool_stats_calls() const { return pool_ ? pool_->stats().calls : 0; }

  /// After a copy-out, leases that shared pool memory may each have a copy of their own: give
  /// the model an object per storage.
  void rekey() {
    std::map<std::pair<Object*, std::byte*>, ObjectPtr> seen;
    std::map<Object*, std::byte*> first;
    auto place = [&](ObjectPtr& object, std::byte* storage) {
      auto [it, inserted] = first.emplace(object.get(), storage);
      if (inserted || it->second == storage) return;
      auto& copy = seen[{object.get(), storage}];
      if (!copy) copy = std::make_shared<Object>(*object);
      object = copy;
    };
    for (Owned& owned : owned_) place(owned.object, owned.buffer.storage());
    for (Held& held : held_) {
      auto value = held.get();
      if (value) place(held.object, value->get().storage());
    }
  }

  /// Every value the test holds has its model's value, or (leases) the Errc it may give.
  void verify_all(const std::string& when) {
    for (std::size_t o = 0; o < owned_.size(); ++o) {
      const auto actual = read(owned_[o].buffer);
      const auto model = gather(*owned_[o].object, owned_[o].offsets);
      expect(same(actual, model), "value " + std::to_string(o) + " (the test's own memory) changed " + when +
                                      ": it is " + show(actual) + ", eager gives " + show(model));
      ++figures_.checks;
    }
    for (std::size_t h = 0; h < held_.size(); ++h) {
      Held& held = held_[h];
      auto got = held.get();
      const std::string name = "lease " + std::to_string(h) + " (output of " + held.from + " in step " +
                               std::to_string(held.step) + ", now step " + std::to_string(step_) + ")";
      ++figures_.checks;
      if (!got) {
        const Errc code = got.error().code;
        if (shut_down_ && code == Errc::pool_shut_down) continue;
        // Reclaimed only by a call that succeeded: a failing call changes nothing the caller holds.
        const bool reclaimed = held.reclaimable && held.step < last_call_step_ && !copy_out_;
        expect(code == Errc::output_overwritten && reclaimed,
               name + " fails " + when + " with " + got.error().describe() +
                   (reclaimed ? "" : ", though no call of a new step succeeded since (or copy_out_on_new_step is on)"));
        continue;
      }
      if (shut_down_ && held.reclaimable) broken(name + " still gives a value after shutdown()");
      if (held.reclaimable && held.step < last_call_step_ && !copy_out_) {
        broken(name + " still gives a value " + when + ", though a new step began and a call ran");
      }
      const auto actual = read(got->get());
      const auto model = gather(*held.object, held.offsets);
      expect(same(actual, model),
             name + " changed " + when + ": it is " + show(actual) + ", eager gives " + show(model));
      if (copy_out_ && held.step < last_call_step_) {
        // Copied out of the pool by the new step: ordinary memory from now on.
        held.reclaimable = arena_->contains(reinterpret_cast<std::uintptr_t>(got->get().storage()));
        if (!held.reclaimable) held.step = step_;
      }
    }
  }

  // ---- other actions ------------------------------------------------------------------------
  void drop_held() {
    if (held_.empty()) return;
    const std::size_t h = pick(held_.size());
    log("drop lease " + std::to_string(h));
    forget({h});
  }

  void reset_held() {
    if (held_.empty()) return;
    const std::size_t h = pick(held_.size());
    if (held_[h].bundle) return;
    log("reset lease " + std::to_string(h));
    held_[h].lease.reset();
    auto got = held_[h].lease.get();
    expect(!got && got.error().code == Errc::invalid_argument, "get() on a reset lease: expected invalid_argument");
    expect(!held_[h].lease.is_valid(), "a reset lease is valid");
    forget({h});
  }

  void take_held() {
    if (held_.empty()) return;
    const std::size_t h = pick(held_.size());
    Held& held = held_[h];
    auto got = held.get();
    if (!got) return;
    auto taken = held.bundle ? held.bundle->take(held.index) : held.lease.take();
    expect(taken.has_value(), "take() of a valid lease failed");
    log("take lease " + std::to_string(h) + " into value " + std::to_string(owned_.size()));
    Owned owned;
    owned.buffer = std::move(*taken);
    owned.object = std::make_shared<Object>();
    owned.offsets = offsets_of(owned.buffer);
    scatter(*owned.object, owned.offsets, gather(*held.object, held.offsets));
    expect(!arena_->contains(reinterpret_cast<std::uintptr_t>(owned.buffer.storage())) || !pool_,
           "take() gave pool memory");
    owned_.push_back(std::move(owned));
    verify_all("after take()");
  }

  void new_step() {
    if (!pool_ || never_marks_steps_) return;
    log("mark_step_begin");
    pool_->mark_step_begin();
    program_marks_steps_ = true;
    ++step_;
  }

  /// A call of `fn` is about to reach its pool: a forward begins a step there when the program
  /// never marked one and no backward is pending (returns whether it does). (The pool does so only
  /// while a path exists; without one no lease is reclaimable, so the model need not know.) A
  /// call refused for its arguments begins none: see `step_not_begun`.
  bool before_pool_call(const Fn& fn) {
    if (fn.mode != cgt::FunctionMode::forward || shut_down_ || program_marks_steps_ || pending_backward_) return false;
    log("(the forward " + fn.name + " begins a step)");
    ++figures_.forward_steps;
    ++step_;
    return true;
  }

  /// A forward's call that began a step failed: the pool takes the step back, and the last
  /// step's outputs stay as they were (a call that fails changes nothing the caller holds).
  void step_not_begun() {
    log("  (failed: its step is not begun, the step is still " + std::to_string(step_ - 1) + ")");
    --figures_.forward_steps;
    --step_;
  }

  void bundle_drop() {
    // Drop every held lease of one step at once, like a program between steps.
    if (held_.empty()) return;
    const std::uint64_t step = held_[pick(held_.size())].step;
    std::vector<std::size_t> gone;
    for (std::size_t h = 0; h < held_.size(); ++h) {
      if (held_[h].step == step) gone.push_back(h);
    }
    log("drop the leases of step " + std::to_string(step));
    forget(gone);
  }

  void wrong_call() {
    Fn* fn = random_function();
    if (fn == nullptr || !fn->called) return;
    const FnDef& def = fn->def;
    const auto kind = pick(3);
    std::vector<cgt::host::Arg> args;
    Buffer scratch = make_buffer(cgt::host::ElementType::f32, {4});
    Buffer as_int = make_buffer(cgt::host::ElementType::i32, {4});
    Buffer rank3 = make_buffer(cgt::host::ElementType::f32, {1, 1, 1});
    std::string text;
    Errc want = Errc::wrong_input_count;
    if (kind == 0) {
      for (std::size_t i = 0; i < def.inputs.size() + 1; ++i) args.emplace_back(scratch);
      text = "with one input too many";
    } else if (kind == 1) {
      for (std::size_t i = 0; i < def.inputs.size(); ++i) {
        if (def.inputs[i] == In::scalar) {
          args.emplace_back(scratch);
        } else {
          args.emplace_back(i == 0 ? as_int : scratch);
        }
      }
      want = Errc::wrong_input_type;
      text = "with an i32 input";
    } else {
      for (std::size_t i = 0; i < def.inputs.size(); ++i) {
        if (def.inputs[i] == In::scalar) {
          args.emplace_back(std::int64_t{1});
        } else {
          args.emplace_back(rank3);
        }
      }
      want = Errc::wrong_shape;
      text = "with rank-3 inputs";
    }
    log(fn->name + " " + text);
    // No step begins: the pool checks a forward's arguments before it begins one.
    auto result = (*fn->handle)(std::span<const cgt::host::Arg>(args));
    ++figures_.calls;
    expect(!result, "the call " + text + " succeeded");
    const Errc code = result.error().code;
    ++figures_.errors[std::string(cgt::to_string(code))];
    expect(shut_down_ ? code == Errc::pool_shut_down : code == want,
           "the call " + text + " gave " + result.error().describe());
    verify_all("after a wrong call");
  }

  void drop_function() {
    Fn* fn = random_function();
    if (fn == nullptr) return;
    log("drop function " + fn->name);
    graveyard_.bury(std::move(*fn->handle));
    fn->handle.reset();
    fn->dropped = true;
  }

  void readd_function() {
    if (!pool_) return;
    const auto defs = catalog();
    const FnDef& def = defs[pick(defs.size())];
    if (def.keeps_pool_buffer && !moves_.cached_pool_buffer) return;
    log("add function " + def.name);
    add(def);
  }

  void shutdown() {
    if (!pool_ || shut_down_) return;
    log("shutdown()");
    auto done = pool_->shutdown();
    expect(done.has_value(), "shutdown() failed: " + (done ? std::string() : done.error().describe()));
    expect(pool_->is_shut_down(), "is_shut_down() is false after shutdown()");
    shut_down_ = true;
    verify_all("after shutdown()");
  }

  // Sleep gives the pool's memory back (host pages read zeros after): it must refuse while a held
  // lease reads pool memory, which every later check of the held values would catch.
  void sleep_pool() {
    if (!pool_) return;
    log("sleep()");
    auto slept = pool_->sleep();
    if (shut_down_) {
      expect(!slept && slept.error().code == cgt::Errc::pool_shut_down,
             "sleep() after shutdown(): expected pool_shut_down");
      return;
    }
    if (!slept) {
      expect(slept.error().code == cgt::Errc::invalid_argument,
             "sleep() failed with " + slept.error().describe() + " (only held leases may refuse it)");
      expect(!pool_->asleep(), "asleep() after a refused sleep()");
      ++figures_.sleeps_refused;
      verify_all("after a refused sleep()");
      return;
    }
    expect(pool_->asleep(), "asleep() is false after sleep()");
    ++figures_.sleeps;
    if (chance(0.5)) {
      log("wake()");
      auto woken = pool_->wake();
      expect(woken.has_value(), "wake() failed: " + (woken ? std::string() : woken.error().describe()));
      expect(!pool_->asleep(), "asleep() after wake()");
    }
    verify_all("after sleep()");
  }

  void drop_pool_handle() {
    if (!pool_ || chance(0.5)) return;
    log("drop the Pool handle (functions and leases keep it alive)");
    graveyard_.bury(std::move(*pool_));
    pool_.reset();
  }

  void pass_stale_value() {
    // A value escaped from a lease that a new step reclaimed, passed back in: docs/errors.md says
    // it fails with output_overwritten.
    if (shut_down_ || copy_out_) return;
    Fn* fn = nullptr;
    for (Fn& candidate : fns_) {
      if (!candidate.dropped && candidate.def.name == "affine") fn = &candidate;
    }
    if (fn == nullptr) return;
    for (std::size_t h = 0; h < held_.size(); ++h) {
      Held& held = held_[h];
      if (held.sizes.size() != 1 || !held.reclaimable) continue;
      auto got = held.get();
      if (got || got.error().code != Errc::output_overwritten) continue;
      // Memory a later output reuses is that output's now: passing it is passing that output.
      bool reused = false;
      for (const Held& other : held_) {
        auto value = other.get();
        reused = reused || (value && value->get().storage() == held.escaped.storage());
      }
      if (reused) continue;
      log(fn->name + "(escaped value of reclaimed lease " + std::to_string(h) + ")");
      const bool begins_step = before_pool_call(*fn);
      auto result = (*fn->handle)({held.escaped});
      ++figures_.calls;
      if (!result && begins_step) step_not_begun();
      expect(!result && result.error().code == Errc::output_overwritten,
             "an escaped value of a reclaimed lease (output of " + held.from + " in step " + std::to_string(held.step) +
                 ", " + std::to_string(held.escaped.numel()) + " elements at offset " +
                 std::to_string(held.escaped.offset()) + ") passed into a call: expected output_overwritten, got " +
                 (result ? std::string("a value") : result.error().describe()));
      ++figures_.errors[std::string(cgt::to_string(result.error().code))];
      verify_all("after passing an escaped value");
      return;
    }
  }

  void moved_from_call() {
    Fn* fn = random_function();
    if (fn == nullptr) return;
    log("call a moved-from Function handle");
    cgt::host::Function moved = std::move(*fn->handle);
    Buffer x = make_buffer(cgt::host::ElementType::f32, {4});
    auto result = (*fn->handle)({x});
    expect(!result, "a call on a moved-from Function succeeded");
    *fn->handle = std::move(moved);
  }

  void discard_owned() {
    if (owned_.size() < 24) return;
    // Forget the oldest value that is not a weight (the test's buffers die with their last view).
    for (std::size_t o = 0; o < owned_.size(); ++o) {
      bool is_weight = false;
      for (const auto& [n, w] : weights_) is_weight = is_weight || w == o;
      if (is_weight) continue;
      owned_.erase(owned_.begin() + static_cast<std::ptrdiff_t>(o));
      for (auto& [n, w] : weights_) {
        if (w > o) --w;
      }
      return;
    }
  }

  // ---- teardown in a random order -------------------------------------------------------------
  void teardown() {
    std::vector<int> order{0, 1, 2, 3};
    std::shuffle(order.begin(), order.end(), rng_);
    std::string text = "teardown:";
    for (int part : order)
      text += std::array<const char*, 4>{" pool", " functions", " leases", " shutdown"}[static_cast<std::size_t>(part)];
    log(text);
    for (int part : order) {
      switch (part) {
        case 0:
          if (pool_) graveyard_.bury(std::move(*pool_));
          pool_.reset();
          break;
        case 1:
          for (Fn& fn : fns_) {
            if (fn.handle) graveyard_.bury(std::move(*fn.handle));
            fn.handle.reset();
          }
          break;
        case 2:
          while (!held_.empty()) forget({pick(held_.size())});
          break;
        case 3:
          if (pool_ && !shut_down_) {
            auto done = pool_->shutdown();
            expect(done.has_value(), "shutdown() at teardown failed");
            shut_down_ = true;
            verify_all("after shutdown() at teardown");
          }
          break;
      }
    }
    graveyard_.close();
    figures_.dropped_elsewhere += graveyard_.buried();
    figures_.dropped_during_call += graveyard_.buried_during_call();
  }

  const Config& config_;
  Moves moves_;
  std::mt19937_64 rng_;
  Figures& figures_;
  std::optional<cgt::host::Pool> pool_;
  const cgt::host::Arena* arena_ = nullptr;  // the pool's; alive while a function or the pool is
  std::deque<Owned> owned_;
  std::map<std::int64_t, std::size_t> weights_;
  std::vector<Fn> fns_;
  std::vector<Held> held_;
  std::vector<std::int64_t> lengths_;
  std::vector<Template> script_;
  std::size_t script_at_ = 0;
  std::uint64_t step_ = 0;
  std::uint64_t last_call_step_ = 0;  // step of the last successful call
  bool pending_backward_ = false;     // a forward ran and no backward since (the pool says the same)
  bool program_marks_steps_ = false;  // mark_step_begin() was called: forwards begin no step
  bool never_marks_steps_ = false;    // the program leaves steps to its forwards
  std::size_t action_ = 0;
  std::uint64_t events_ = 0;
  bool limited_arena_ = false, or_error_ = false, static_error_ = false, copy_out_ = false;
  bool shut_down_ = false, throwing_sink_ = false;
  std::vector<std::string> log_;
  std::string options_text_;
  // Last member: destroyed first, so that its thread has dropped every handle before the rest goes.
  Graveyard graveyard_;
};

/// Runs the configured seeds; returns the figures (failures listed with seed, sequence, log).
Figures run_seeds(const Config& config, bool threaded) {
  Figures figures;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t k = 0;; ++k) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (config.seconds > 0 ? elapsed >= config.seconds : k >= config.seeds) break;
    const std::uint64_t seed = config.first_seed + k;
    ++figures.seeds;
    for (std::size_t q = 0; q < config.sequences; ++q) {
      const std::uint64_t sequence_seed = seed * 1000003 + q;
      ++figures.sequences;
      std::unique_ptr<Sequence> sequence;
      try {
        sequence = std::make_unique<Sequence>(config, sequence_seed, figures, threaded);
        sequence->run();
      } catch (const Broken& broken) {
        ++figures.failures;
        std::string report = "seed " + std::to_string(seed) + " sequence " + std::to_string(q) +
                             (threaded ? " [threads]" : "") + ": " + broken.what +
                             "\n  options: " + (sequence ? sequence->options_text() : "") + "\n  last actions:\n" +
                             (sequence ? sequence->recent_log() : "");
        figures.failure_reports.push_back(report);
        std::cerr << "STRESS FAILURE " << report << "\n";
      }
    }
  }
  return figures;
}

void report(const char* mode, const Config& config, const Figures& figures) {
  std::cout << "stress[" << mode << "]: seeds " << figures.seeds << " (from " << config.first_seed << "), sequences "
            << figures.sequences << ", actions " << figures.actions << ", calls " << figures.calls << " ("
            << figures.ok_calls << " succeeded), checks " << figures.checks << ", failures " << figures.failures
            << "\n  call kinds:";
  for (const auto& [kind, count] : figures.kinds) std::cout << " " << kind << "=" << count;
  std::cout << "\n  calls of forwards that began a step: " << figures.forward_steps;
  std::cout << "\n  training programs (forwards, backwards in reverse, an update): " << figures.training_programs;
  std::cout << "\n  calls padded up to a bucket: " << figures.padded_calls;
  std::cout << "\n  graphs evicted for a budget: " << figures.evictions
            << ", calls run eagerly over budget: " << figures.over_budget;
  std::cout << "\n  sleeps: " << figures.sleeps << " (" << figures.sleeps_refused << " refused: leases held)";
  if (figures.dropped_elsewhere > 0) {
    std::cout << "\n  handles dropped on the other thread: " << figures.dropped_elsewhere << " ("
              << figures.dropped_during_call << " while the main thread was in a call)";
  }
  std::cout << "\n  errors:";
  for (const auto& [code, count] : figures.errors) std::cout << " " << code << "=" << count;
  std::cout << "\n  " << describe_moves(config.moves) << "\n";
}

}  // namespace
}  // namespace stress

TEST_CASE("stress: random hostile sequences keep every held value or give an Errc", "[stress][host]") {
  const stress::Config config = stress::config_from_env({});
  const stress::Figures figures = stress::run_seeds(config, false);
  stress::report("single thread", config, figures);
  for (const std::string& failure : figures.failure_reports) UNSCOPED_INFO(failure);
  CHECK(figures.failures == 0);
  CHECK(figures.ok_calls > 0);
}

// Handles dropped on a second thread while the main thread calls the pool: run under TSan by
// scripts/test.sh and scripts/stress.sh; select it with "[threads]".
TEST_CASE("stress: handles dropped on another thread while the pool is called", "[threads][stress][host]") {
  stress::Config defaults;
  defaults.seeds = 2;
  const stress::Config config = stress::config_from_env(defaults);
  const stress::Figures figures = stress::run_seeds(config, true);
  stress::report("threads", config, figures);
  for (const std::string& failure : figures.failure_reports) UNSCOPED_INFO(failure);
  CHECK(figures.failures == 0);
  CHECK(figures.ok_calls > 0);
}
