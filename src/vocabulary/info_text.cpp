// What a pool can tell about itself (:info), as text for logs.
module;
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

module cgt.vocabulary;

namespace cgt {
namespace {

void append(std::string& text, std::string_view name, std::uint64_t value) {
  if (!text.empty()) text += ", ";
  text += name;
  text += ' ';
  text += std::to_string(value);
}

}  // namespace

std::string to_string(const Stats& stats) {
  std::string text;
  append(text, "calls", stats.calls);
  append(text, "warm-ups", stats.warmups);
  append(text, "recordings", stats.recordings);
  append(text, "replays", stats.replays);
  append(text, "eager", stats.eager_calls);
  // The rest only when it happened: a line a program logs every few seconds stays short.
  const std::pair<std::string_view, std::uint64_t> others[] = {
      {"checkpoint restores", stats.checkpoint_restores},
      {"failed matches", stats.failed_matches},
      {"re-recordings", stats.rerecords},
      {"recordings not kept", stats.recordings_not_kept},
      {"steps reclaimed", stats.steps_reclaimed},
      {"steps begun by forwards", stats.steps_begun_by_forward},
      {"leases invalidated", stats.leases_invalidated},
      {"leases copied out", stats.leases_copied_out},
      {"padded calls", stats.padded_calls},
      {"fallback warnings", stats.fallback_warnings},
      {"evictions", stats.evictions},
      {"evicted bytes", stats.evicted_bytes},
      {"sleeps", stats.sleeps},
      {"wakes", stats.wakes},
      {"log sink failures", stats.log_sink_failures},
  };
  for (const auto& [name, value] : others) {
    if (value != 0) append(text, name, value);
  }
  for (std::size_t r = 0; r < stats.by_reason.size(); ++r) {
    if (stats.by_reason[r] == 0) continue;
    append(text, to_string(static_cast<Reason>(r)), stats.by_reason[r]);
  }
  return text;
}

std::string to_string(const MemoryInfo& memory) {
  return std::to_string(memory.reserved_bytes) + " bytes reserved, " + std::to_string(memory.allocated_bytes) +
         " allocated in " + std::to_string(memory.live_blocks) + " blocks, peak " +
         std::to_string(memory.peak_allocated_bytes);
}

}  // namespace cgt
