// The arena: best-fit blocks over segments, with checkpoint and restore of the block map, traces of
// what a run asked (to predict a recording's growth), and segments given back when nothing holds them.
module;
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/mman.h>

module cgt.core;

namespace cgt {
namespace {

constexpr std::size_t kHostPageBytes = 4096;

// Gives host pages back to the system; they read as zeros when touched again.
bool give_pages_back(std::byte* memory, std::size_t bytes) noexcept {
  return ::madvise(memory, bytes, MADV_DONTNEED) == 0;
}

}  // namespace

// --- the book-keeping ---------------------------------------------------------------------------

std::optional<std::pair<std::size_t, std::size_t>> Arena::Books::take(std::size_t size) {
  auto best = free.lower_bound(FreeKey{size, 0, 0});
  if (best == free.end()) return std::nullopt;
  const auto [block_size, segment, offset] = *best;
  free.erase(best);
  Blocks& map = blocks[segment];
  if (block_size > size) {
    // Split: the remainder stays free.
    map.emplace(offset + size, BlockState{block_size - size, false});
    free.emplace(block_size - size, segment, offset + size);
  }
  map.at(offset) = BlockState{size, true};
  return std::make_pair(segment, offset);
}

std::size_t Arena::Books::give(std::size_t segment, std::size_t offset) {
  Blocks& map = blocks[segment];
  auto block = map.find(offset);
  const std::size_t size = block->second.size;
  block->second.allocated = false;
  // Merge with free neighbours.
  if (auto next = std::next(block); next != map.end() && !next->second.allocated) {
    free.erase(FreeKey{next->second.size, segment, next->first});
    block->second.size += next->second.size;
    map.erase(next);
  }
  if (block != map.begin()) {
    if (auto previous = std::prev(block); !previous->second.allocated) {
      free.erase(FreeKey{previous->second.size, segment, previous->first});
      previous->second.size += block->second.size;
      map.erase(block);
      block = previous;
    }
  }
  free.emplace(block->second.size, segment, block->first);
  return size;
}

std::size_t Arena::Books::add(std::size_t size) {
  sizes.push_back(size);
  blocks.push_back(Blocks{{0, BlockState{size, false}}});
  const std::size_t index = sizes.size() - 1;
  free.emplace(size, index, 0);
  return index;
}

void Arena::Books::rebuild_free_index() {
  free.clear();
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    for (const auto& [offset, block] : blocks[i]) {
      if (!block.allocated) free.emplace(block.size, i, offset);
    }
  }
}

// --- holds --------------------------------------------------------------------------------------

SegmentHold::SegmentHold(std::shared_ptr<std::vector<std::uint32_t>> counts, std::vector<std::size_t> segments) noexcept
    : counts_(std::move(counts)), segments_(std::move(segments)) {}

SegmentHold& SegmentHold::operator=(SegmentHold&& other) noexcept {
  if (this != &other) {
    drop();
    counts_ = std::move(other.counts_);
    segments_ = std::move(other.segments_);
  }
  return *this;
}

SegmentHold::~SegmentHold() {
  drop();
}

void SegmentHold::drop() noexcept {
  if (counts_) {
    for (const std::size_t segment : segments_) --(*counts_)[segment];
  }
  counts_.reset();
  segments_.clear();
}

std::vector<std::size_t> ArenaCheckpoint::allocated_segments() const {
  std::vector<std::size_t> held;
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    if (std::ranges::any_of(segments_[i], [](const auto& entry) { return entry.second.allocated; })) held.push_back(i);
  }
  return held;
}

// --- the arena ----------------------------------------------------------------------------------

void Arena::SegmentRelease::operator()(std::byte* memory) const noexcept {
  if (source != nullptr && source->give_back) {
    source->give_back(memory, bytes, alignment);
  } else {
    ::operator delete[](memory, std::align_val_t{alignment});
  }
}

Arena::Arena(ArenaOptions options) : options_(std::move(options)) {
  if (options_.alignment == 0 || (options_.alignment & (options_.alignment - 1)) != 0) options_.alignment = 256;
  if (options_.segment_bytes == 0) options_.segment_bytes = options_.alignment;
  segment_alignment_ =
      options_.source.obtain ? options_.alignment : std::max<std::size_t>(options_.alignment, kHostPageBytes);
}

std::size_t Arena::round_up(std::size_t bytes) const noexcept {
  const std::size_t alignment = options_.alignment;
  return std::max<std::size_t>((bytes + alignment - 1) / alignment * alignment, alignment);
}

std::size_t Arena::segment_size_for(std::size_t bytes) const noexcept {
  return std::max(round_up(options_.segment_bytes), bytes);
}
std::uintptr_t Arena::base_of(std::size_t segment) const noexcept {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): an address, compared, never dereferenced
  return reinterpret_cast<std::uintptr_t>(memory_[segment].get());
}

Result<std::size_t> Arena::add_segment(std::size_t min_bytes) {
  const std::size_t size = segment_size_for(min_bytes);
  // Written so that it cannot overflow: reserved_bytes_ <= max_bytes always holds.
  if (options_.max_bytes != 0 && (size > options_.max_bytes || reserved_bytes_ > options_.max_bytes - size)) {
    return fail(Errc::out_of_memory, "the arena needs " + std::to_string(size) + " more bytes but holds " +
                                         std::to_string(reserved_bytes_) + " of at most " +
                                         std::to_string(options_.max_bytes) + " (ArenaOptions::max_bytes)");
  }
  if (asleep_) {
    return fail(Errc::out_of_memory, "the arena is asleep (Arena::sleep): wake it before allocating");
  }
  void* memory = options_.source.obtain ? options_.source.obtain(size, segment_alignment_)
                                        : ::operator new[](size, std::align_val_t{segment_alignment_}, std::nothrow);
  if (memory == nullptr) {
    return fail(Errc::out_of_memory, "the system refused a segment of " + std::to_string(size) + " bytes");
  }
  memory_.emplace_back(static_cast<std::byte*>(memory), SegmentRelease{&options_.source, size, segment_alignment_});
  holds_->push_back(0);
  const auto base = reinterpret_cast<std::uintptr_t>(memory);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  lowest_ = std::min(lowest_, base);
  highest_ = std::max(highest_, base + size);
  reserved_bytes_ += size;
  return books_.add(size);
}

Result<std::byte*> Arena::allocate(std::size_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max() - options_.alignment) {
    return fail(Errc::out_of_memory,
                "a request of " + std::to_string(bytes) + " bytes is larger than any arena can hold");
  }
  const std::size_t size = round_up(bytes);
  auto taken = books_.take(size);
  if (!taken) {
    auto added = add_segment(size);
    if (!added) return std::unexpected(std::move(added.error()));
    taken = books_.take(size);
    if (!taken) return fail(Errc::invariant_violation, "Arena::allocate: a new segment did not fit its request");
  }
  const auto [segment, offset] = *taken;
  allocated_bytes_ += size;
  peak_bytes_ = std::max(peak_bytes_, allocated_bytes_);
  ++live_blocks_;
  std::byte* address = memory_[segment].get() + offset;
  if (tracing_) note_allocation(*tracing_, reinterpret_cast<std::uintptr_t>(address), segment, size);  // NOLINT
  return address;
}

std::optional<std::pair<std::size_t, std::size_t>> Arena::locate(std::uintptr_t address) const noexcept {
  for (std::size_t i = 0; i < memory_.size(); ++i) {
    if (!memory_[i]) continue;
    const std::uintptr_t base = base_of(i);
    if (address >= base && address < base + books_.sizes[i]) return std::make_pair(i, address - base);
  }
  return std::nullopt;
}

Result<void> Arena::free(std::uintptr_t address) {
  const auto place = locate(address);
  if (place) {
    const auto& blocks = books_.blocks[place->first];
    if (auto block = blocks.find(place->second); block != blocks.end() && block->second.allocated) {
      const std::size_t size = books_.give(place->first, place->second);
      allocated_bytes_ -= size;
      --live_blocks_;
      if (tracing_) note_free(*tracing_, address, place->first, place->second, size);
      return {};
    }
  }
  return fail(Errc::invalid_argument, "Arena::free: no allocated block of the arena starts at this address");
}

ArenaCheckpoint Arena::checkpoint() const {
  ArenaCheckpoint checkpoint;
  checkpoint.segments_ = books_.blocks;
  checkpoint.allocated_bytes_ = allocated_bytes_;
  checkpoint.live_blocks_ = live_blocks_;
  return checkpoint;
}

void Arena::restore(const ArenaCheckpoint& checkpoint) {
  for (std::size_t i = 0; i < books_.blocks.size(); ++i) {
    if (!memory_[i]) continue;  // given back: held by nothing, so no kept checkpoint allocates in it
    if (i < checkpoint.segments_.size()) {
      books_.blocks[i] = checkpoint.segments_[i];
    } else {
      books_.blocks[i] = Blocks{{0, BlockState{books_.sizes[i], false}}};
    }
  }
  allocated_bytes_ = checkpoint.allocated_bytes_;
  live_blocks_ = checkpoint.live_blocks_;
  books_.rebuild_free_index();
}

// --- traces and prediction ----------------------------------------------------------------------

void Arena::start_trace() {
  tracing_.emplace();
}

ArenaTrace Arena::stop_trace() {
  if (!tracing_) return {};
  ArenaTrace trace = std::move(tracing_->trace);  // NOLINT(bugprone-unchecked-optional-access): checked above
  tracing_.reset();
  std::ranges::sort(trace.segments_);
  const auto repeated = std::ranges::unique(trace.segments_);
  trace.segments_.erase(repeated.begin(), repeated.end());
  return trace;
}

void Arena::note_allocation(ArenaTracing& tracing, std::uintptr_t address, std::size_t segment, std::size_t size) {
  ArenaTrace& trace = tracing.trace;
  tracing.step_of[address] = trace.steps_.size();
  trace.steps_.push_back({.bytes = size});
  trace.segments_.push_back(segment);
  tracing.held_bytes += size;
  trace.peak_bytes_ = std::max(trace.peak_bytes_, tracing.held_bytes);
}

void Arena::note_free(ArenaTracing& tracing, std::uintptr_t address, std::size_t segment, std::size_t offset,
                      std::size_t size) {
  ArenaTrace& trace = tracing.trace;
  if (auto step = tracing.step_of.find(address); step != tracing.step_of.end()) {
    trace.steps_.push_back({.frees = step->second});
    tracing.step_of.erase(step);
    tracing.held_bytes -= size;
  } else {
    trace.steps_.push_back({.segment = segment, .offset = offset});
  }
}

std::size_t Arena::growth_for(std::span<const std::size_t> first, const ArenaTrace& trace) const {
  return play(books_, first, trace);
}

std::size_t Arena::footprint_of(std::span<const std::size_t> first, const ArenaTrace& trace) const {
  return play(Books{}, first, trace);
}

std::size_t Arena::play(Books books, std::span<const std::size_t> first, const ArenaTrace& trace) const {
  std::size_t growth = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t size = round_up(bytes);
    auto taken = books.take(size);
    if (!taken) {
      const std::size_t added = segment_size_for(size);
      growth += added;
      books.add(added);
      taken = books.take(size);  // a wholly free segment of at least `size`: it fits
    }
    return taken.value_or(std::pair<std::size_t, std::size_t>{});
  };
  for (const std::size_t bytes : first) (void)take(bytes);
  std::vector<std::pair<std::size_t, std::size_t>> placed(trace.steps_.size());
  for (std::size_t i = 0; i < trace.steps_.size(); ++i) {
    const ArenaTrace::Step& step = trace.steps_[i];
    if (step.frees != ArenaTrace::none) {
      books.give(placed[step.frees].first, placed[step.frees].second);
    } else if (step.bytes != 0) {
      placed[i] = take(step.bytes);
    } else if (step.segment < books.blocks.size()) {
      // A block allocated before the trace: freed again only if it is allocated now.
      const Blocks& blocks = books.blocks[step.segment];
      if (auto block = blocks.find(step.offset); block != blocks.end() && block->second.allocated) {
        books.give(step.segment, step.offset);
      }
    }
  }
  return growth;
}

// --- holds and giving back ----------------------------------------------------------------------

SegmentHold Arena::hold(std::vector<std::size_t> segments) {
  for (const std::size_t segment : segments) ++(*holds_)[segment];
  return {holds_, std::move(segments)};
}

std::size_t Arena::release_unused() {
  std::size_t released = 0;
  bool any = false;
  for (std::size_t i = 0; i < memory_.size(); ++i) {
    const Blocks& blocks = books_.blocks[i];
    const bool wholly_free = blocks.size() == 1 && !blocks.begin()->second.allocated;
    if (!memory_[i] || (*holds_)[i] != 0 || !wholly_free) continue;
    memory_[i].reset();  // gives the segment back to its source
    released += books_.sizes[i];
    books_.blocks[i].clear();
    any = true;
  }
  if (!any) return 0;
  reserved_bytes_ -= released;
  released_bytes_ += released;
  books_.rebuild_free_index();
  lowest_ = UINTPTR_MAX;
  highest_ = 0;
  for (std::size_t i = 0; i < memory_.size(); ++i) {
    if (!memory_[i]) continue;
    lowest_ = std::min(lowest_, base_of(i));
    highest_ = std::max(highest_, base_of(i) + books_.sizes[i]);
  }
  return released;
}

// --- sleep and wake -----------------------------------------------------------------------------

std::size_t Arena::unback(std::size_t segment) {
  std::byte* memory = memory_[segment].get();
  const std::size_t bytes = books_.sizes[segment];
  if (options_.source.obtain) return options_.source.unback(memory, bytes);
  // Host memory: the pages wholly inside the segment (it is page-aligned: segment_alignment_).
  const std::size_t pages = bytes / kHostPageBytes * kHostPageBytes;
  if (pages == 0) return 0;
  return give_pages_back(memory, pages) ? pages : 0;
}

bool Arena::reback(std::size_t segment) {
  if (!options_.source.obtain || !options_.source.reback) return true;  // host pages come back when touched
  return options_.source.reback(memory_[segment].get(), books_.sizes[segment]);
}

Result<std::size_t> Arena::sleep() {
  if (asleep_) return std::size_t{0};
  if (live_blocks_ != 0) {
    return fail(Errc::invalid_argument, "the arena cannot sleep while " + std::to_string(live_blocks_) +
                                            " blocks are allocated (" + std::to_string(allocated_bytes_) +
                                            " bytes): their contents would be lost");
  }
  if (options_.source.obtain && (!options_.source.unback || !options_.source.reback)) {
    return fail(Errc::invalid_argument,
                "the arena's segment source cannot give memory back while keeping its addresses (cgt.cuda: "
                "PoolOptions::sleepable)");
  }
  std::size_t released = 0;
  for (std::size_t i = 0; i < memory_.size(); ++i) {
    if (memory_[i]) released += unback(i);
  }
  asleep_ = true;
  asleep_bytes_ = released;
  return released;
}

Result<void> Arena::wake() {
  if (!asleep_) return {};
  for (std::size_t i = 0; i < memory_.size(); ++i) {
    if (!memory_[i] || reback(i)) continue;
    for (std::size_t j = 0; j < i; ++j) {
      if (memory_[j]) (void)unback(j);
    }
    return fail(Errc::out_of_memory, "the system refused the memory of a segment of " +
                                         std::to_string(books_.sizes[i]) + " bytes when waking the arena");
  }
  asleep_ = false;
  asleep_bytes_ = 0;
  return {};
}

// --- queries ------------------------------------------------------------------------------------

bool Arena::in_a_segment(std::uintptr_t address) const noexcept {
  return locate(address).has_value();
}

bool Arena::is_allocated(std::uintptr_t address) const noexcept {
  const auto place = locate(address);
  if (!place) return false;
  const Blocks& blocks = books_.blocks[place->first];
  auto block = blocks.find(place->second);
  return block != blocks.end() && block->second.allocated;
}

std::vector<Block> Arena::live_blocks() const {
  std::vector<Block> live;
  for (std::size_t i = 0; i < memory_.size(); ++i) {
    if (!memory_[i]) continue;
    for (const auto& [offset, block] : books_.blocks[i]) {
      if (block.allocated) live.push_back({base_of(i) + offset, block.size});
    }
  }
  return live;
}

MemoryInfo Arena::memory() const noexcept {
  return {.reserved_bytes = reserved_bytes_,
          .allocated_bytes = allocated_bytes_,
          .peak_allocated_bytes = peak_bytes_,
          .live_blocks = live_blocks_};
}

std::size_t Arena::block_count() const noexcept {
  std::size_t count = 0;
  for (const Blocks& blocks : books_.blocks) count += blocks.size();
  return count;
}

std::size_t Arena::segment_count() const noexcept {
  return static_cast<std::size_t>(std::ranges::count_if(memory_, [](const auto& memory) { return memory != nullptr; }));
}

}  // namespace cgt
