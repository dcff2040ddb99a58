// The arena: best-fit blocks over segments, with checkpoint and restore of the block map.
module;
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

module cgt.core;

namespace cgt {

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
}

std::size_t Arena::round_up(std::size_t bytes) const noexcept {
  const std::size_t alignment = options_.alignment;
  return std::max<std::size_t>((bytes + alignment - 1) / alignment * alignment, alignment);
}

Result<std::size_t> Arena::add_segment(std::size_t min_bytes) {
  const std::size_t size = std::max(round_up(options_.segment_bytes), min_bytes);
  // Written so that it cannot overflow: reserved_bytes_ <= max_bytes always holds.
  if (options_.max_bytes != 0 && (size > options_.max_bytes || reserved_bytes_ > options_.max_bytes - size)) {
    return fail(Errc::out_of_memory, "the arena needs " + std::to_string(size) + " more bytes but holds " +
                                         std::to_string(reserved_bytes_) + " of at most " +
                                         std::to_string(options_.max_bytes) + " (ArenaOptions::max_bytes)");
  }
  Segment segment;
  void* memory = options_.source.obtain ? options_.source.obtain(size, options_.alignment)
                                        : ::operator new[](size, std::align_val_t{options_.alignment}, std::nothrow);
  if (memory == nullptr) {
    return fail(Errc::out_of_memory, "the system refused a segment of " + std::to_string(size) + " bytes");
  }
  segment.memory = std::unique_ptr<std::byte, SegmentRelease>(
      static_cast<std::byte*>(memory), SegmentRelease{&options_.source, size, options_.alignment});
  segment.size = size;
  segment.blocks.emplace(0, BlockState{size, false});
  const auto base = reinterpret_cast<std::uintptr_t>(memory);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  lowest_ = std::min(lowest_, base);
  highest_ = std::max(highest_, base + size);
  segments_.push_back(std::move(segment));
  reserved_bytes_ += size;
  const std::size_t index = segments_.size() - 1;
  free_.emplace(size, index, 0);
  return index;
}

Result<std::byte*> Arena::allocate(std::size_t bytes) {
  if (bytes > std::numeric_limits<std::size_t>::max() - options_.alignment) {
    return fail(Errc::out_of_memory,
                "a request of " + std::to_string(bytes) + " bytes is larger than any arena can hold");
  }
  const std::size_t size = round_up(bytes);
  auto best = free_.lower_bound(FreeKey{size, 0, 0});
  if (best == free_.end()) {
    auto added = add_segment(size);
    if (!added) return std::unexpected(std::move(added.error()));
    best = free_.lower_bound(FreeKey{size, 0, 0});
  }
  const auto [block_size, segment_index, offset] = *best;
  free_.erase(best);
  Segment& segment = segments_[segment_index];
  BlockState& block = segment.blocks.at(offset);
  if (block_size > size) {
    // Split: the remainder stays free.
    segment.blocks.emplace(offset + size, BlockState{block_size - size, false});
    free_.emplace(block_size - size, segment_index, offset + size);
  }
  block = BlockState{size, true};
  allocated_bytes_ += size;
  peak_bytes_ = std::max(peak_bytes_, allocated_bytes_);
  ++live_blocks_;
  return segment.memory.get() + offset;
}

std::pair<std::size_t, std::map<std::size_t, ArenaCheckpoint::BlockState>::iterator> Arena::find(
    std::uintptr_t address) {
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    const auto base = reinterpret_cast<std::uintptr_t>(segments_[i].memory.get());  // NOLINT
    if (address >= base && address < base + segments_[i].size) return {i, segments_[i].blocks.find(address - base)};
  }
  return {segments_.size(), {}};
}

Result<void> Arena::free(std::uintptr_t address) {
  auto [segment_index, block] = find(address);
  if (segment_index == segments_.size() || block == segments_[segment_index].blocks.end() || !block->second.allocated) {
    return fail(Errc::invalid_argument, "Arena::free: no allocated block of the arena starts at this address");
  }
  auto& blocks = segments_[segment_index].blocks;
  allocated_bytes_ -= block->second.size;
  --live_blocks_;
  block->second.allocated = false;
  // Merge with free neighbours.
  if (auto next = std::next(block); next != blocks.end() && !next->second.allocated) {
    free_.erase(FreeKey{next->second.size, segment_index, next->first});
    block->second.size += next->second.size;
    blocks.erase(next);
  }
  if (block != blocks.begin()) {
    if (auto previous = std::prev(block); !previous->second.allocated) {
      free_.erase(FreeKey{previous->second.size, segment_index, previous->first});
      previous->second.size += block->second.size;
      blocks.erase(block);
      block = previous;
    }
  }
  free_.emplace(block->second.size, segment_index, block->first);
  return {};
}

ArenaCheckpoint Arena::checkpoint() const {
  ArenaCheckpoint checkpoint;
  checkpoint.segments_.reserve(segments_.size());
  for (const Segment& segment : segments_) checkpoint.segments_.push_back(segment.blocks);
  checkpoint.allocated_bytes_ = allocated_bytes_;
  checkpoint.live_blocks_ = live_blocks_;
  return checkpoint;
}

void Arena::restore(const ArenaCheckpoint& checkpoint) {
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    if (i < checkpoint.segments_.size()) {
      segments_[i].blocks = checkpoint.segments_[i];
    } else {
      segments_[i].blocks.clear();
      segments_[i].blocks.emplace(0, BlockState{segments_[i].size, false});
    }
  }
  allocated_bytes_ = checkpoint.allocated_bytes_;
  live_blocks_ = checkpoint.live_blocks_;
  rebuild_free_index();
}

void Arena::rebuild_free_index() {
  free_.clear();
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    for (const auto& [offset, block] : segments_[i].blocks) {
      if (!block.allocated) free_.emplace(block.size, i, offset);
    }
  }
}

bool Arena::in_a_segment(std::uintptr_t address) const noexcept {
  return std::ranges::any_of(segments_, [address](const Segment& segment) {
    const auto base = reinterpret_cast<std::uintptr_t>(segment.memory.get());  // NOLINT
    return address >= base && address < base + segment.size;
  });
}

bool Arena::is_allocated(std::uintptr_t address) const noexcept {
  for (const Segment& segment : segments_) {
    const auto base = reinterpret_cast<std::uintptr_t>(segment.memory.get());  // NOLINT
    if (address < base || address >= base + segment.size) continue;
    auto block = segment.blocks.find(address - base);
    return block != segment.blocks.end() && block->second.allocated;
  }
  return false;
}

std::vector<Block> Arena::live_blocks() const {
  std::vector<Block> live;
  for (const Segment& segment : segments_) {
    const auto base = reinterpret_cast<std::uintptr_t>(segment.memory.get());  // NOLINT
    for (const auto& [offset, block] : segment.blocks) {
      if (block.allocated) live.push_back({base + offset, block.size});
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
  for (const Segment& segment : segments_) count += segment.blocks.size();
  return count;
}

}  // namespace cgt
