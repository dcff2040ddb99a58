// Checkpoints of training state: the optimizers' state in an archive that torch::save and
// torch::load read, and parameters loaded back into the tensors that recorded graphs read.
//
// Everything a recorded step touches lives at the address it recorded, so loading never replaces a
// tensor: it copies into it. A load reads and checks the whole file first, then copies, so a file
// that does not fit changes nothing.
module;
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :optim_state;

namespace cgt::torch {

namespace {

// The archive's layout. Keys are only ever added: a reader asks for the keys it knows, so a file
// with more (a later version's) still loads, and `format` goes up only for a change an older
// reader would misread (the groups' keys are not one: a reader from before groups loads the same
// per-parameter state, numbered across the groups, and only checks less).
constexpr std::int64_t format = 1;
constexpr std::string_view format_key = "cgt.optimizer.format";
constexpr std::string_view kind_key = "cgt.optimizer.kind";
constexpr std::string_view params_key = "cgt.optimizer.params";
constexpr std::string_view state_key = "cgt.optimizer.state";
constexpr std::string_view lr_key = "cgt.optimizer.lr";
constexpr std::string_view scheduled_steps_key = "cgt.optimizer.scheduled_steps";
// The parameter groups: their count, and per group "group.<g>.params" (its parameter count),
// "group.<g>.weight_decay" and "group.<g>.lr_factor". A file without them was written before
// groups: one group of every parameter.
constexpr std::string_view groups_key = "cgt.optimizer.groups";

// Dynamic loss scaling's state, where the optimizer scales the loss (LossScale::checkpointed).
std::string scaler_key(std::string_view name) {
  return "cgt.scaler." + std::string(name);
}

std::string param_key(std::size_t i, std::string_view name) {
  return "param." + std::to_string(i) + "." + std::string(name);
}

std::string group_key(std::size_t g, std::string_view name) {
  return "group." + std::to_string(g) + "." + std::string(name);
}

// libtorch's message without the C++ backtrace c10::Error carries.
std::string reason(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

// The option that makes an optimizer keep a state list, for the message when a file's lists differ.
std::string_view option_of(std::string_view list) {
  if (list == "max_exp_avg_sq") return " (AdamOptions::amsgrad differs)";
  if (list == "momentum_buffer") return " (SGDOptions::momentum differs: 0 keeps no buffer)";
  return "";
}

// The lists' names, comma-separated (`lists`: Optimizer::State::PerParameter, which only its members name).
std::string join(const auto& lists) {
  std::string names;
  for (const auto& list : lists) names += (names.empty() ? "" : ",") + std::string(list.name);
  return names;
}

std::vector<std::string> split(const std::string& names) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin < names.size()) {
    const std::size_t end = std::min(names.find(',', begin), names.size());
    out.push_back(names.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

// "[64, 16] Float".
std::string describe(c10::IntArrayRef sizes, std::string_view dtype) {
  std::string out = "[";
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(sizes[d]);
  }
  return out.append("] ").append(dtype);
}

std::string describe(const at::Tensor& t) {
  return describe(t.sizes(), c10::toString(t.scalar_type()));
}

// One value of the archive, of the type T stands for; a key the file lacks or a value of another
// type is a file that does not fit (`invalid_argument`, naming the key).
template <class T>
Result<T> read(::torch::serialize::InputArchive& archive, std::string_view key) {
  c10::IValue value;
  try {
    if (!archive.try_read(std::string(key), value)) {
      return fail(Errc::invalid_argument, "the file has no '" + std::string(key) + "'");
    }
  } catch (const std::exception& e) {
    return fail(Errc::invalid_argument, "reading '" + std::string(key) + "': " + reason(e));
  }
  const auto wrong = [&key](const char* type) {
    return fail(Errc::invalid_argument, "'" + std::string(key) + "' is not " + type);
  };
  if constexpr (std::is_same_v<T, std::int64_t>) {
    if (!value.isInt()) return wrong("an integer");
    return value.toInt();
  } else if constexpr (std::is_same_v<T, double>) {
    if (!value.isDouble()) return wrong("a number");
    return value.toDouble();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.isString()) return wrong("a string");
    return value.toStringRef();
  } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    if (!value.isIntList()) return wrong("a list of integers");
    return value.toIntVector();
  } else {
    static_assert(std::is_same_v<T, at::Tensor>);
    if (!value.isTensor()) return wrong("a tensor");
    return value.toTensor();
  }
}

// Whether the archive has `key` (read to find out: InputArchive has no lookup without a read).
Result<bool> has_key(::torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue ignored;
  try {
    return archive.try_read(key, ignored);
  } catch (const std::exception& e) {
    return fail(Errc::invalid_argument, "reading '" + key + "': " + reason(e));
  }
}

// The file's groups against this optimizer's `groups` (Optimizer::State::Group, which only its
// members name): as many, each with as many parameters, the same weight decay and the same rate
// factor (both constants the program gives when it makes the optimizer: the weight decay one of
// the recorded graphs, the factor the one the file's rates were scaled by). A file without groups
// was written before them: one group of every parameter, which fits an optimizer of one group.
Result<void> check_groups(::torch::serialize::InputArchive& archive, const auto& groups) {
  auto present = has_key(archive, std::string(groups_key));
  if (!present) return std::unexpected(std::move(present.error()));
  if (!*present) {
    if (groups.size() == 1) return {};
    const std::string here = std::to_string(groups.size());
    return fail(Errc::invalid_argument,
                "the file was written before parameter groups (its parameters are one group) "
                "and this optimizer has " +
                    here + " groups");
  }
  auto count = read<std::int64_t>(archive, groups_key);
  if (!count) return std::unexpected(std::move(count.error()));
  if (*count != static_cast<std::int64_t>(groups.size())) {
    return fail(Errc::invalid_argument, "the file holds " + std::to_string(*count) +
                                            " parameter groups, this optimizer " + std::to_string(groups.size()));
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& group = groups[g];
    const std::string which = "group " + std::to_string(g);
    auto params = read<std::int64_t>(archive, group_key(g, "params"));
    if (!params) return std::unexpected(std::move(params.error()));
    if (*params != static_cast<std::int64_t>(group.end - group.begin)) {
      return fail(Errc::invalid_argument, which + " holds " + std::to_string(*params) + " parameters in the file, " +
                                              std::to_string(group.end - group.begin) + " here");
    }
    auto decay = read<double>(archive, group_key(g, "weight_decay"));
    if (!decay) return std::unexpected(std::move(decay.error()));
    if (*decay != group.weight_decay) {
      return fail(Errc::invalid_argument, which + "'s weight decay is " + number_text(*decay) + " in the file, " +
                                              number_text(group.weight_decay) +
                                              " here (a constant of the recorded graphs: make the optimizer with the "
                                              "file's)");
    }
    auto factor = read<double>(archive, group_key(g, "lr_factor"));
    if (!factor) return std::unexpected(std::move(factor.error()));
    if (*factor != group.lr_factor) {
      return fail(Errc::invalid_argument, which + "'s rate factor (its lr / the options' lr) is " +
                                              number_text(*factor) + " in the file, " + number_text(group.lr_factor) +
                                              " here");
    }
  }
  return {};
}

// A copy to make once the whole file is read and checked: `from` (host memory, the file's) into
// `to` (the tensor a recorded graph reads).
struct Copy {
  at::Tensor to;
  at::Tensor from;
};

// `from` must fit `to`, the tensor it is copied into.
Result<void> check_fits(const std::string& what, const at::Tensor& to, const at::Tensor& from) {
  if (from.sizes() == to.sizes() && from.scalar_type() == to.scalar_type()) return {};
  return fail(Errc::invalid_argument, what + ": the file's is " + describe(from) + ", this one's " + describe(to));
}

// The grad scaler's state (LossScale::checkpointed) from the file into `copies`, where this
// optimizer scales the loss (`scale`; null where it does not). A file has all of it (its optimizer
// scaled the loss) or none: none leaves the scale, its growth tracker and the skips as they are (a
// run that did not scale goes on scaling, from the options' scale: a fresh GradScaler beside a
// loaded optimizer); all of it into an optimizer that does not scale is refused (a float16 run's
// scale would be dropped); part of it is a file that does not fit.
Result<void> read_loss_scale(::torch::serialize::InputArchive& archive, const LossScale* scale,
                             std::vector<Copy>& copies) {
  std::string present;
  std::string missing;
  for (const std::string_view name : LossScale::checkpointed_names) {
    auto has = has_key(archive, scaler_key(name));
    if (!has) return std::unexpected(std::move(has.error()));
    std::string& list = *has ? present : missing;
    list += (list.empty() ? "'" : ", '") + scaler_key(name) + "'";
  }
  if (present.empty()) return {};
  if (!missing.empty()) {
    return fail(Errc::invalid_argument, "the file has the grad scaler's " + present + " but not " + missing);
  }
  if (scale == nullptr) {
    return fail(Errc::invalid_argument,
                "the file holds a grad scaler's state (" + present +
                    "): its optimizer scaled the loss, and this one does not; make it with LossScaleOptions "
                    "{.dynamic = true} to go on with that run");
  }
  for (const auto& [name, to] : scale->checkpointed()) {
    auto from = read<at::Tensor>(archive, scaler_key(name));
    if (!from) return std::unexpected(std::move(from.error()));
    if (auto fits = check_fits("the loss scale's " + std::string(name), *to, *from); !fits) return fits;
    copies.push_back({*to, std::move(*from)});
  }
  return {};
}

// Copies every `from` into its `to` in place, on the current stream. The file's tensors are in
// pageable host memory, which CUDA stages before `copy_` returns: they may go with the archive, and
// the copy waits for nothing on the device.
Result<void> copy_all(const std::vector<Copy>& copies, std::string_view function) {
  try {
    const c10::NoGradGuard no_grad;
    for (const Copy& copy : copies) copy.to.copy_(copy.from, /*non_blocking=*/true);
  } catch (const std::exception& e) {
    return fail(Errc::backend_error, std::string(function) + ": copying the file's values in place: " + reason(e));
  }
  return {};
}

// Loading or saving inside a pool function's recording would record the copies into its graph.
Result<void> refuse_while_capturing(const std::vector<at::Tensor>& tensors, std::string_view function) {
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.is_cuda() || !is_capturing(t.device())) continue;
    return fail(Errc::invalid_argument,
                std::string(function) +
                    " while the current stream captures a graph (inside a pool function): the copies would be "
                    "recorded, and every replay would make them again; call it between steps");
  }
  return {};
}

// Puts the function's name before a message.
template <class T>
Result<T> prefixed(std::string_view function, Result<T> result) {
  if (!result) result.error().message = std::string(function) + ": " + result.error().message;
  return result;
}

std::string no_state(std::string_view function) {
  return std::string(function) +
         ": the optimizer handle holds no state (made by default, or moved from): use the handle it was moved into, "
         "or make one with make_adam/make_sgd";
}

Result<void> open_file(::torch::serialize::InputArchive& archive, const std::string& path, std::string_view function) {
  try {
    archive.load_from(path, at::Device(at::kCPU));
  } catch (const std::exception& e) {
    return fail(Errc::invalid_argument, std::string(function) + ": cannot read '" + path + "': " + reason(e));
  }
  return {};
}

}  // namespace

std::string_view Adam::State::kind() const noexcept {
  return "adam";
}

std::vector<Optimizer::State::PerParameter> Adam::State::per_parameter_state() const {
  std::vector<PerParameter> lists{{.name = "exp_avg", .tensors = &exp_avgs_},
                                  {.name = "exp_avg_sq", .tensors = &exp_avg_sqs_}};
  if (options_.amsgrad) lists.push_back({.name = "max_exp_avg_sq", .tensors = &max_exp_avg_sqs_});
  return lists;
}

std::string_view SGD::State::kind() const noexcept {
  return "sgd";
}

std::vector<Optimizer::State::PerParameter> SGD::State::per_parameter_state() const {
  if (options_.momentum == 0) return {};
  return {{.name = "momentum_buffer", .tensors = &momentum_buffers_}};
}

Result<void> Optimizer::State::save(::torch::serialize::OutputArchive& archive) const {
  if (auto refused = refuse_while_capturing(params_, "Optimizer::save"); !refused) return refused;
  const std::vector<PerParameter> lists = per_parameter_state();
  try {
    archive.write(std::string(format_key), c10::IValue(format));
    archive.write(std::string(kind_key), c10::IValue(std::string(kind())));
    archive.write(std::string(params_key), c10::IValue(static_cast<std::int64_t>(params_.size())));
    archive.write(std::string(state_key), c10::IValue(join(lists)));
    archive.write(std::string(lr_key), c10::IValue(lr_.load()));
    archive.write(std::string(scheduled_steps_key), c10::IValue(scheduled_steps_.load()));
    archive.write(std::string(groups_key), c10::IValue(static_cast<std::int64_t>(groups_.size())));
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const Group& group = groups_[g];
      archive.write(group_key(g, "params"), c10::IValue(static_cast<std::int64_t>(group.end - group.begin)));
      archive.write(group_key(g, "weight_decay"), c10::IValue(group.weight_decay));
      archive.write(group_key(g, "lr_factor"), c10::IValue(group.lr_factor));
    }
    // The state is on the device (make_adam/make_sgd take CUDA parameters only): `to(kCPU)` is a
    // copy, ordered after the steps queued on the current stream, and the archive owns it.
    for (std::size_t i = 0; i < params_.size(); ++i) {
      archive.write(param_key(i, "shape"), c10::IValue(params_[i].sizes().vec()));
      archive.write(param_key(i, "dtype"), c10::IValue(std::string(c10::toString(params_[i].scalar_type()))));
      archive.write(param_key(i, "step"), steps_[i].to(at::kCPU));
      for (const PerParameter& list : lists) archive.write(param_key(i, list.name), (*list.tensors)[i].to(at::kCPU));
    }
    if (loss_scale_) {
      for (const auto& [name, tensor] : loss_scale_->checkpointed())
        archive.write(scaler_key(name), tensor->to(at::kCPU));
    }
  } catch (const std::exception& e) {
    return fail(Errc::backend_error, "Optimizer::save: copying the state to the host: " + reason(e));
  }
  return {};
}

Result<void> Optimizer::State::load(::torch::serialize::InputArchive& archive) {
  static constexpr std::string_view function = "Optimizer::load";
  if (auto refused = refuse_while_capturing(params_, function); !refused) return refused;
  auto file_kind = prefixed(function, read<std::string>(archive, kind_key));
  if (!file_kind) {
    file_kind.error().message += ": not a checkpoint of a cgt optimizer (Optimizer::save writes one)";
    return std::unexpected(std::move(file_kind.error()));
  }
  auto file_format = prefixed(function, read<std::int64_t>(archive, format_key));
  if (!file_format) return std::unexpected(std::move(file_format.error()));
  if (*file_format > format) {
    return fail(Errc::invalid_argument, std::string(function) + ": the file is of format " +
                                            std::to_string(*file_format) + ", newer than this cgt reads (" +
                                            std::to_string(format) + ")");
  }
  if (*file_kind != kind()) {
    return fail(Errc::invalid_argument, std::string(function) + ": the file holds the state of a '" + *file_kind +
                                            "' optimizer, this one is '" + std::string(kind()) + "'");
  }
  auto count = prefixed(function, read<std::int64_t>(archive, params_key));
  if (!count) return std::unexpected(std::move(count.error()));
  if (*count != static_cast<std::int64_t>(params_.size())) {
    return fail(Errc::invalid_argument, std::string(function) + ": the file holds " + std::to_string(*count) +
                                            " parameters, this optimizer " + std::to_string(params_.size()));
  }
  if (auto fits = prefixed(function, check_groups(archive, groups_)); !fits) return fits;
  const std::vector<PerParameter> lists = per_parameter_state();
  auto names = prefixed(function, read<std::string>(archive, state_key));
  if (!names) return std::unexpected(std::move(names.error()));
  if (*names != join(lists)) {
    const std::vector<std::string> theirs = split(*names);
    std::string differs;
    for (const std::string& name : theirs) {
      if (std::ranges::none_of(lists, [&name](const PerParameter& list) { return list.name == name; })) {
        differs =
            "the file keeps '" + name + "' per parameter and this optimizer does not" + std::string(option_of(name));
      }
    }
    for (const PerParameter& list : lists) {
      if (std::ranges::find(theirs, std::string(list.name)) == theirs.end()) {
        differs = "this optimizer keeps '" + std::string(list.name) + "' per parameter and the file does not" +
                  std::string(option_of(list.name));
      }
    }
    return fail(
        Errc::invalid_argument,
        std::string(function) + ": " + (differs.empty() ? "the file's state lists '" + *names + "' differ" : differs));
  }

  std::vector<Copy> copies;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    const std::string which = "parameter " + std::to_string(i);
    auto shape = prefixed(function, read<std::vector<std::int64_t>>(archive, param_key(i, "shape")));
    if (!shape) return std::unexpected(std::move(shape.error()));
    auto dtype = prefixed(function, read<std::string>(archive, param_key(i, "dtype")));
    if (!dtype) return std::unexpected(std::move(dtype.error()));
    if (*shape != p.sizes().vec() || *dtype != c10::toString(p.scalar_type())) {
      return fail(Errc::invalid_argument, std::string(function) + ": " + which + " is " + describe(*shape, *dtype) +
                                              " in the file, " + describe(p) + " here");
    }
    std::vector<std::pair<std::string_view, const at::Tensor*>> targets{{"step", &steps_[i]}};
    for (const PerParameter& list : lists) targets.emplace_back(list.name, &(*list.tensors)[i]);
    for (const auto& [name, to] : targets) {
      auto from = prefixed(function, read<at::Tensor>(archive, param_key(i, name)));
      if (!from) return std::unexpected(std::move(from.error()));
      if (auto fits = check_fits(std::string(function) + ": " + which + "'s " + std::string(name), *to, *from); !fits) {
        return fits;
      }
      copies.push_back({*to, std::move(*from)});
    }
  }
  auto lr = prefixed(function, read<double>(archive, lr_key));
  if (!lr) return std::unexpected(std::move(lr.error()));
  // Checked with the rest: `set_lr` after the copies would refuse it too late.
  if (auto taken = check_lr(*lr); !taken) {
    return fail(Errc::invalid_argument, std::string(function) + ": in the file: " + taken.error().message);
  }
  auto scheduled = prefixed(function, read<std::int64_t>(archive, scheduled_steps_key));
  if (!scheduled) return std::unexpected(std::move(scheduled.error()));
  if (*scheduled < 0 || *scheduled > max_scheduled_steps) {
    return fail(Errc::invalid_argument, std::string(function) + ": the file's scheduled steps are " +
                                            std::to_string(*scheduled) + "; a schedule counts from 0 to 2^62");
  }

  if (auto scaler = prefixed(function, read_loss_scale(archive, loss_scale_.get(), copies)); !scaler) return scaler;

  // Everything is checked: from here on only the device can fail.
  if (auto copied = copy_all(copies, function); !copied) return copied;
  if (auto set = prefixed(function, write_lr(*lr)); !set) return set;
  scheduled_steps_.store(*scheduled);
  return {};
}

// The members below hold the state while they copy it (OperationInUse): while another thread's
// graphed step runs they fail with concurrent_use, having read or written nothing.
Result<void> Optimizer::save(::torch::serialize::OutputArchive& archive) const {
  if (state_ == nullptr) return fail(Errc::invalid_argument, no_state("Optimizer::save"));
  const OperationInUse in_use(state_->in_use_);
  if (in_use.refused()) return fail(Errc::concurrent_use, used_by_another_thread("Optimizer::save"));
  return state_->save(archive);
}

Result<void> Optimizer::save(const std::string& path) const {
  if (state_ == nullptr) return fail(Errc::invalid_argument, no_state("Optimizer::save"));
  ::torch::serialize::OutputArchive archive;
  {
    const OperationInUse in_use(state_->in_use_);
    if (in_use.refused()) return fail(Errc::concurrent_use, used_by_another_thread("Optimizer::save"));
    if (auto saved = state_->save(archive); !saved) return saved;
  }
  try {
    archive.save_to(path);
  } catch (const std::exception& e) {
    return fail(Errc::invalid_argument, "Optimizer::save: cannot write '" + path + "': " + reason(e));
  }
  return {};
}

namespace {

// Why a load must wait: the gradients a training step has accumulated so far would be added to the
// checkpoint's next step.
Result<void> refuse_mid_step(const StepProgress& progress) {
  if (progress.owner() == 0) return {};
  return fail(Errc::invalid_argument,
              step_in_progress("Optimizer::load", progress.taken(), "the checkpoint's next step would get"));
}

}  // namespace

Result<void> Optimizer::load(::torch::serialize::InputArchive& archive) {
  if (state_ == nullptr) return fail(Errc::invalid_argument, no_state("Optimizer::load"));
  const OperationInUse in_use(state_->in_use_);
  if (in_use.refused()) return fail(Errc::concurrent_use, used_by_another_thread("Optimizer::load"));
  if (auto refused = refuse_mid_step(state_->progress_); !refused) return refused;
  return state_->load(archive);
}

Result<void> Optimizer::load(const std::string& path) {
  if (state_ == nullptr) return fail(Errc::invalid_argument, no_state("Optimizer::load"));
  ::torch::serialize::InputArchive archive;
  if (auto opened = open_file(archive, path, "Optimizer::load"); !opened) return opened;
  const OperationInUse in_use(state_->in_use_);
  if (in_use.refused()) return fail(Errc::concurrent_use, used_by_another_thread("Optimizer::load"));
  if (auto refused = refuse_mid_step(state_->progress_); !refused) return refused;
  return state_->load(archive);
}

namespace {

constexpr std::string_view load_in_place = "load_parameters_in_place";

// The file's tensor `key` for `to`, checked, added to `copies`.
Result<void> read_into(::torch::serialize::InputArchive& archive, const std::string& key, const std::string& name,
                       const at::Tensor& to, std::vector<Copy>& copies) {
  auto from = prefixed(load_in_place, read<at::Tensor>(archive, key));
  if (!from) {
    from.error().message += " (" + name + ")";
    return std::unexpected(std::move(from.error()));
  }
  if (auto fits = check_fits(std::string(load_in_place) + ": '" + name + "'", to, *from); !fits) return fits;
  copies.push_back({to, std::move(*from)});
  return {};
}

// What Module::load reads, in its order: the module's parameters, its buffers, then each child's
// from the nested archive of its name; `prefix` is the module's path ("fc1.").
Result<void> read_module(const ::torch::nn::Module& module, ::torch::serialize::InputArchive& archive,
                         const std::string& prefix, std::vector<Copy>& copies) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (!item.value().defined()) continue;
    if (auto ok = read_into(archive, item.key(), prefix + item.key(), item.value(), copies); !ok) return ok;
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    if (!item.value().defined()) continue;
    if (auto ok = read_into(archive, item.key(), prefix + item.key(), item.value(), copies); !ok) return ok;
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    ::torch::serialize::InputArchive nested;
    bool found = false;
    try {
      found = archive.try_read(child.key(), nested);
    } catch (const std::exception& e) {
      return fail(Errc::invalid_argument,
                  std::string(load_in_place) + ": reading '" + prefix + child.key() + "': " + reason(e));
    }
    if (!found) {
      return fail(Errc::invalid_argument,
                  std::string(load_in_place) + ": the file has no module '" + prefix + child.key() + "'");
    }
    if (auto ok = read_module(*child.value(), nested, prefix + child.key() + ".", copies); !ok) return ok;
  }
  return {};
}

Result<void> copy_checked(const std::vector<Copy>& copies) {
  std::vector<at::Tensor> targets;
  targets.reserve(copies.size());
  for (const Copy& copy : copies) targets.push_back(copy.to);
  if (auto refused = refuse_while_capturing(targets, load_in_place); !refused) return refused;
  return copy_all(copies, load_in_place);
}

}  // namespace

Result<void> load_parameters_in_place(const ::torch::nn::Module& module, const std::string& path) {
  ::torch::serialize::InputArchive archive;
  if (auto opened = open_file(archive, path, load_in_place); !opened) return opened;
  std::vector<Copy> copies;
  if (auto read = read_module(module, archive, "", copies); !read) return read;
  return copy_checked(copies);
}

Result<void> load_parameters_in_place(std::span<const at::Tensor> tensors, const std::string& path) {
  ::torch::serialize::InputArchive archive;
  if (auto opened = open_file(archive, path, load_in_place); !opened) return opened;
  std::size_t held = 0;
  try {
    held = archive.keys().size();
  } catch (const std::exception& e) {
    return fail(Errc::invalid_argument, std::string(load_in_place) + ": reading '" + path + "': " + reason(e));
  }
  if (held != tensors.size()) {
    return fail(Errc::invalid_argument, std::string(load_in_place) + ": '" + path + "' holds " + std::to_string(held) +
                                            " tensors, " + std::to_string(tensors.size()) + " were given");
  }
  std::vector<Copy> copies;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string key = std::to_string(i);
    if (auto ok = read_into(archive, key, "tensor " + key, tensors[i], copies); !ok) return ok;
  }
  return copy_checked(copies);
}

}  // namespace cgt::torch
