// cgt.core:arena — a best-fit allocator over segments whose book-keeping can be checkpointed and
// restored: the memory pool of the host backend (host segments) and of the cuda backend (segments
// from cudaMalloc). Usable on its own.
module;
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

export module cgt.core:arena;
import cgt.vocabulary;

export namespace cgt {

/// Where an arena's segments come from. Empty functions: host memory (aligned operator new).
struct SegmentSource {
  /// A segment of `bytes`, aligned to `alignment`; null when the system refuses.
  std::function<std::byte*(std::size_t bytes, std::size_t alignment)> obtain;
  /// Gives a segment back.
  std::function<void(std::byte* segment, std::size_t bytes, std::size_t alignment)> give_back;
};

struct ArenaOptions {
  /// Size of each segment obtained from the system (larger requests get a segment of their own).
  std::size_t segment_bytes = std::size_t{1} << 20;
  /// Most bytes the arena may obtain in all; 0 means no limit. Past it, allocation fails.
  std::size_t max_bytes = 0;
  /// Every block starts at, and is sized to, a multiple of this (a power of two).
  std::size_t alignment = 256;
  /// Where segments come from (default: host memory).
  SegmentSource source;
};

/// The arena's book-keeping at one moment: which blocks of which segments were allocated.
class ArenaCheckpoint {
 public:
  [[nodiscard]] std::size_t segment_count() const noexcept { return segments_.size(); }

 private:
  friend class Arena;
  struct BlockState {
    std::size_t size = 0;
    bool allocated = false;
  };
  std::vector<std::map<std::size_t, BlockState>> segments_;  // per segment: offset -> block
  std::size_t allocated_bytes_ = 0;
  std::size_t live_blocks_ = 0;
};

/// Best-fit allocation over segments: a free block is split to fit a request, freed neighbours
/// merge. Segments are kept until the arena is destroyed, so addresses stay valid for graphs.
class Arena {
 public:
  explicit Arena(ArenaOptions options = {});
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  /// A block of at least `bytes` (rounded up to the alignment). Fails with `out_of_memory` past
  /// `max_bytes`.
  [[nodiscard]] Result<std::byte*> allocate(std::size_t bytes);
  /// Frees the block starting at `address`. Fails with `invalid_argument` if no allocated block
  /// starts there.
  [[nodiscard]] Result<void> free(std::uintptr_t address);

  [[nodiscard]] ArenaCheckpoint checkpoint() const;
  /// Puts the book-keeping back to `checkpoint`: blocks allocated then are allocated, all others
  /// free (segments made since are wholly free).
  void restore(const ArenaCheckpoint& checkpoint);

  /// Is `address` inside one of the arena's segments? (A pool asks for each input of every call:
  /// an address outside the span of all segments, a caller's buffer, is answered inline.)
  [[nodiscard]] inline bool contains(std::uintptr_t address) const noexcept {
    return address >= lowest_ && address < highest_ && in_a_segment(address);
  }
  [[nodiscard]] bool is_allocated(std::uintptr_t address) const noexcept;
  [[nodiscard]] std::vector<Block> live_blocks() const;
  [[nodiscard]] MemoryInfo memory() const noexcept;
  /// Blocks (free and allocated) of all segments; for tests of splitting and merging.
  [[nodiscard]] std::size_t block_count() const noexcept;

 private:
  using BlockState = ArenaCheckpoint::BlockState;
  // Gives a segment back to its source when the arena goes.
  struct SegmentRelease {
    SegmentRelease() noexcept : source(nullptr), bytes(0), alignment(0) {}
    SegmentRelease(const SegmentSource* from, std::size_t size, std::size_t align) noexcept
        : source(from), bytes(size), alignment(align) {}
    const SegmentSource* source;
    std::size_t bytes;
    std::size_t alignment;
    void operator()(std::byte* memory) const noexcept;
  };
  struct Segment {
    std::unique_ptr<std::byte, SegmentRelease> memory;
    std::size_t size = 0;
    std::map<std::size_t, BlockState> blocks;  // offset -> block
  };
  // Free blocks ordered by size, for best fit: (size, segment, offset).
  using FreeKey = std::tuple<std::size_t, std::size_t, std::size_t>;

  [[nodiscard]] std::size_t round_up(std::size_t bytes) const noexcept;
  [[nodiscard]] Result<std::size_t> add_segment(std::size_t min_bytes);
  [[nodiscard]] std::pair<std::size_t, std::map<std::size_t, BlockState>::iterator> find(std::uintptr_t address);
  void rebuild_free_index();
  [[nodiscard]] bool in_a_segment(std::uintptr_t address) const noexcept;

  ArenaOptions options_;
  std::vector<Segment> segments_;
  std::set<FreeKey> free_;
  std::size_t reserved_bytes_ = 0;
  std::size_t allocated_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t live_blocks_ = 0;
  std::uintptr_t lowest_ = UINTPTR_MAX;  ///< the lowest address of any segment
  std::uintptr_t highest_ = 0;           ///< one past the highest byte of any segment
};

}  // namespace cgt
