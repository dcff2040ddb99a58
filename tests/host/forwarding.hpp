// Fake devices for the engine: a device that forwards to a host device, and a recording in
// progress (cgt::backend::Capture) that forwards every primitive to another one. A test derives
// from them and overrides what it changes (a replay that fails, a capture that breaks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

import cgt.core;
import cgt.host;

namespace host_test {

/// A device that forwards the members every device must have to a host device of its own; the
/// others keep `backend::Device`'s defaults (no life stamps, no buckets).
class ForwardingDevice : public cgt::backend::Device {
 public:
  cgt::Result<cgt::backend::RunResult> run(cgt::backend::Invoker& fn, std::span<const cgt::backend::ArgSlot> args,
                                           cgt::backend::RunMode mode) override {
    return inner().run(fn, args, mode);
  }
  cgt::Result<std::unique_ptr<cgt::backend::Capture>> begin_recording(cgt::backend::Invoker& fn,
                                                                      std::span<const cgt::backend::ArgSlot> args,
                                                                      const cgt::backend::RecordPlan& plan) override {
    return inner().begin_recording(fn, args, plan);
  }
  cgt::Result<std::unique_ptr<cgt::backend::Checkpoint>> checkpoint() override { return inner().checkpoint(); }
  cgt::Result<void> restore(const cgt::backend::Checkpoint& checkpoint,
                            std::span<cgt::backend::StorageHandle* const> live,
                            std::span<const std::uintptr_t> dead) override {
    return inner().restore(checkpoint, live, dead);
  }
  void release(cgt::backend::StorageHandle& storage, cgt::backend::Release why, std::string_view function) override {
    inner().release(storage, why, function);
  }
  std::int32_t device_index() const noexcept override { return 0; }
  void adopt(cgt::backend::StorageHandle& storage) override { inner().adopt(storage); }
  cgt::Result<std::shared_ptr<void>> rescue(const cgt::backend::StorageHandle& storage) override {
    return inner().rescue(storage);
  }
  std::shared_ptr<const void> rebase(const void* value, const cgt::backend::StorageHandle& from,
                                     const std::shared_ptr<void>& rescued) override {
    return inner().rebase(value, from, rescued);
  }
  std::vector<cgt::Block> live_blocks() const override { return inner().live_blocks(); }
  cgt::MemoryInfo memory() const override { return inner().memory(); }
  void shutdown() override { inner().shutdown(); }

 protected:
  // The engine's side of a host device, which programs never reach: the fake calls it as the engine
  // does. The device is a host pool's, whose engine stays idle.
  cgt::backend::Device& inner() noexcept { return cgt::backend::device_of(host_); }
  const cgt::backend::Device& inner() const noexcept { return cgt::backend::device_of(host_); }

 private:
  mutable cgt::host::Pool host_ = *cgt::host::make_pool({.poison_dead_memory = true});
};

/// A recorded graph that forwards to `inner`; a test overrides what it changes (a check that refuses).
class ForwardingRecording : public cgt::backend::Recording {
 public:
  explicit ForwardingRecording(std::unique_ptr<cgt::backend::Recording> inner) : inner_(std::move(inner)) {}
  bool checks_arguments() const noexcept override { return inner_->checks_arguments(); }
  cgt::Result<void> check(std::span<const cgt::backend::ArgSlot> args) const override { return inner_->check(args); }
  cgt::Result<void> replay(std::span<const cgt::backend::ArgSlot> args) override { return inner_->replay(args); }
  void bind_outputs(std::span<cgt::backend::StorageHandle* const> storages) override { inner_->bind_outputs(storages); }
  const void* output(std::size_t i) const override { return inner_->output(i); }

 private:
  std::unique_ptr<cgt::backend::Recording> inner_;
};

/// A recording in progress that forwards every primitive to `inner`. All of them: one left to its
/// default (no writes known, no executable) would change what the capture pipeline decides.
class ForwardingCapture : public cgt::backend::Capture {
 public:
  explicit ForwardingCapture(std::unique_ptr<cgt::backend::Capture> inner) : inner_(std::move(inner)) {}

  cgt::Result<void> make_slots() override { return inner_->make_slots(); }
  cgt::backend::CaptureOutcome capture() override { return inner_->capture(); }
  cgt::backend::WritesKnown writes_known() const noexcept override { return inner_->writes_known(); }
  std::vector<std::uint32_t> written_inputs() const override { return inner_->written_inputs(); }
  cgt::Result<void> settle_outputs() override { return inner_->settle_outputs(); }
  cgt::Result<cgt::backend::NodeRewrites> rewrite_nodes() override { return inner_->rewrite_nodes(); }
  bool allows_update_in_place() const noexcept override { return inner_->allows_update_in_place(); }
  cgt::Result<bool> load_into(cgt::backend::Recording& earlier) override { return inner_->load_into(earlier); }
  cgt::Result<void> instantiate() override { return inner_->instantiate(); }
  cgt::Result<void> run_first() override { return inner_->run_first(); }
  cgt::Result<void> write_back(std::span<const std::uint32_t> inputs) override { return inner_->write_back(inputs); }
  cgt::Result<cgt::backend::Recorded> finish() override { return inner_->finish(); }
  cgt::GraphCounts* counts() noexcept override { return inner_->counts(); }

 private:
  std::unique_ptr<cgt::backend::Capture> inner_;
};

}  // namespace host_test
