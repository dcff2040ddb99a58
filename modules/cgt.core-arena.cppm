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
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

export module cgt.core:arena;
import cgt.vocabulary;

export namespace cgt {

/// Where an arena's segments come from. Empty functions: host memory (aligned operator new).
struct SegmentSource {
  /// A segment of `bytes`, aligned to `alignment`; null when the system refuses.
  std::function<std::byte*(std::size_t bytes, std::size_t alignment)> obtain;
  /// Gives a segment back (whether or not `unback` emptied it).
  std::function<void(std::byte* segment, std::size_t bytes, std::size_t alignment)> give_back;
  /// Gives a segment's physical memory back to the system while its addresses stay reserved
  /// (`Arena::sleep`); its contents are lost. Returns the bytes given back; empty: the source
  /// cannot (with `obtain` set). Empty with host memory: the pages wholly inside the segment go
  /// back (madvise), and come back zeroed when touched.
  std::function<std::size_t(std::byte* segment, std::size_t bytes)> unback;
  /// Backs a segment `unback` emptied again, at the same addresses (`Arena::wake`); false when the
  /// system refuses (out of memory). Empty with host memory: nothing to do.
  std::function<bool(std::byte* segment, std::size_t bytes)> reback;
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
  /// The segments in which a block was allocated at that moment (restoring the checkpoint needs
  /// them: `Arena::hold` them for as long as it is kept).
  [[nodiscard]] std::vector<std::size_t> allocated_segments() const;

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

/// What one run asked of an arena, in order (`Arena::start_trace` .. `stop_trace`): the sizes it
/// allocated and which of them it freed, and the segments its blocks fell in. A recording of the
/// same work asks the same again, so the trace of a warm-up predicts what the recording will add
/// to the arena (`Arena::growth_for`), and the trace of a recording says which segments its graph
/// uses for as long as it lives (its temporaries, not allocated between replays, are there).
class ArenaTrace {
 public:
  /// Allocations and frees it holds.
  [[nodiscard]] std::size_t requests() const noexcept { return steps_.size(); }
  /// The segments (by index) its allocations fell in, ascending.
  [[nodiscard]] const std::vector<std::size_t>& segments() const noexcept { return segments_; }
  /// The most bytes its own allocations held at once (rounded as the arena rounds them).
  [[nodiscard]] std::size_t peak_bytes() const noexcept { return peak_bytes_; }

 private:
  friend class Arena;
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  struct Step {
    std::size_t bytes = 0;       ///< an allocation of this many bytes (rounded), when `frees == none`
    std::size_t frees = none;    ///< else: frees the trace's allocation at this step
    std::size_t segment = none;  ///< or, with `frees == none` and `bytes == 0`: frees a block
    std::size_t offset = 0;      ///<   allocated before the trace began, here
  };
  std::vector<Step> steps_;
  std::vector<std::size_t> segments_;
  std::size_t peak_bytes_ = 0;
};

/// Keeps segments of an arena from being given back (`Arena::release_unused`) while it lives: a
/// recorded graph holds the segments its trace touched, a kept checkpoint those it allocates in.
/// Move-only; may outlive its arena.
class SegmentHold {
 public:
  SegmentHold() noexcept = default;
  SegmentHold(SegmentHold&& other) noexcept = default;
  SegmentHold& operator=(SegmentHold&& other) noexcept;
  SegmentHold(const SegmentHold&) = delete;
  SegmentHold& operator=(const SegmentHold&) = delete;
  ~SegmentHold();
  [[nodiscard]] const std::vector<std::size_t>& segments() const noexcept { return segments_; }

 private:
  friend class Arena;
  SegmentHold(std::shared_ptr<std::vector<std::uint32_t>> counts, std::vector<std::size_t> segments) noexcept;
  void drop() noexcept;
  std::shared_ptr<std::vector<std::uint32_t>> counts_;  ///< the arena's holds per segment
  std::vector<std::size_t> segments_;
};

}  // namespace cgt

namespace cgt {

/// An arena's trace in progress (`Arena::start_trace`): the trace, and which step allocated each
/// block still allocated. Not exported.
struct ArenaTracing {
  ArenaTrace trace;
  std::map<std::uintptr_t, std::size_t> step_of;  ///< address -> the step that allocated it
  std::size_t held_bytes = 0;                     ///< bytes the trace's own blocks hold now
};

}  // namespace cgt

export namespace cgt {

/// Best-fit allocation over segments: a free block is split to fit a request, freed neighbours
/// merge. Segments are kept until the arena is destroyed, or until `release_unused` gives back one
/// that is wholly free and held by nothing, so addresses stay valid for the graphs that use them.
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
  /// free (segments made since are wholly free). REQUIRES: the segments it allocates in were not
  /// given back since (hold them: `hold(checkpoint.allocated_segments())`).
  void restore(const ArenaCheckpoint& checkpoint);

  /// Starts noting every allocation and free (one trace at a time: a second start restarts it).
  void start_trace();
  /// The trace since `start_trace` (empty without one); noting stops.
  [[nodiscard]] ArenaTrace stop_trace();
  /// The bytes of new segments the arena would obtain if, from its state now, it allocated
  /// `first` (sizes in bytes, never freed) and then did what `trace` did: 0 when it all fits in
  /// free blocks. Changes nothing. (Past `max_bytes` the allocation would fail instead.)
  [[nodiscard]] std::size_t growth_for(std::span<const std::size_t> first, const ArenaTrace& trace) const;
  /// What the same requests need from an arena with no segment: the least a recording can take,
  /// whatever else the arena gave back first. Changes nothing.
  [[nodiscard]] std::size_t footprint_of(std::span<const std::size_t> first, const ArenaTrace& trace) const;
  /// Keeps `segments` (indices) from `release_unused` while the returned hold lives.
  [[nodiscard]] SegmentHold hold(std::vector<std::size_t> segments);
  /// Gives back every segment that has no allocated block and no hold; returns their bytes. Their
  /// addresses may come back in a later segment.
  std::size_t release_unused();

  /// Gives back the physical memory of every segment while their addresses stay reserved, so that
  /// graphs recorded over them run again after `wake` (their contents are lost: nothing may be
  /// allocated). Returns the bytes given back. Fails with `invalid_argument` while a block is
  /// allocated, and with `invalid_argument` where the source cannot (`SegmentSource::unback`), having
  /// woken what it put to sleep. A second `sleep` does nothing.
  [[nodiscard]] Result<std::size_t> sleep();
  /// Backs every segment again at its addresses. Fails with `out_of_memory` where the system
  /// refuses, having put back to sleep what it woke. Does nothing when awake.
  [[nodiscard]] Result<void> wake();
  [[nodiscard]] bool asleep() const noexcept { return asleep_; }
  /// Bytes `sleep` gave back (0 while awake).
  [[nodiscard]] std::size_t asleep_bytes() const noexcept { return asleep_bytes_; }

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
  /// Segments held from the system now.
  [[nodiscard]] std::size_t segment_count() const noexcept;
  /// Bytes of segments given back by `release_unused` so far.
  [[nodiscard]] std::size_t released_bytes() const noexcept { return released_bytes_; }

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
  using Blocks = std::map<std::size_t, BlockState>;  // offset -> block
  // Free blocks ordered by size, for best fit: (size, segment, offset).
  using FreeKey = std::tuple<std::size_t, std::size_t, std::size_t>;
  /// The book-keeping alone, without memory: the arena's own, and the copy `growth_for` plays a
  /// trace on. One best fit for both.
  struct Books {
    std::vector<std::size_t> sizes;  ///< per segment; 0: given back
    std::vector<Blocks> blocks;      ///< per segment
    std::set<FreeKey> free;
    /// Best fit for `size` (rounded): (segment, offset), or none when no free block is that large.
    [[nodiscard]] std::optional<std::pair<std::size_t, std::size_t>> take(std::size_t size);
    /// Frees the allocated block at (`segment`, `offset`), merging it with free neighbours; its size.
    std::size_t give(std::size_t segment, std::size_t offset);
    /// A wholly free segment of `size` bytes; its index.
    std::size_t add(std::size_t size);
    void rebuild_free_index();
  };

  [[nodiscard]] std::size_t round_up(std::size_t bytes) const noexcept;
  /// `growth_for` played on `books` (a copy).
  [[nodiscard]] std::size_t play(Books books, std::span<const std::size_t> first, const ArenaTrace& trace) const;
  [[nodiscard]] std::size_t unback(std::size_t segment);
  [[nodiscard]] bool reback(std::size_t segment);
  [[nodiscard]] std::size_t segment_size_for(std::size_t bytes) const noexcept;
  [[nodiscard]] Result<std::size_t> add_segment(std::size_t min_bytes);
  /// The (segment, offset) of `address`, if it is in a segment.
  [[nodiscard]] std::optional<std::pair<std::size_t, std::size_t>> locate(std::uintptr_t address) const noexcept;
  [[nodiscard]] std::uintptr_t base_of(std::size_t segment) const noexcept;
  [[nodiscard]] bool in_a_segment(std::uintptr_t address) const noexcept;
  static void note_allocation(ArenaTracing& tracing, std::uintptr_t address, std::size_t segment, std::size_t size);
  static void note_free(ArenaTracing& tracing, std::uintptr_t address, std::size_t segment, std::size_t offset,
                        std::size_t size);

  ArenaOptions options_;
  Books books_;
  std::vector<std::unique_ptr<std::byte, SegmentRelease>> memory_;  ///< per segment; null: given back
  std::shared_ptr<std::vector<std::uint32_t>> holds_ = std::make_shared<std::vector<std::uint32_t>>();
  std::optional<ArenaTracing> tracing_;
  std::size_t reserved_bytes_ = 0;
  std::size_t allocated_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t live_blocks_ = 0;
  std::size_t released_bytes_ = 0;
  /// The alignment segments are obtained with: the blocks', or a page's for host memory (so that
  /// `sleep` can give whole pages back).
  std::size_t segment_alignment_ = 0;
  bool asleep_ = false;
  std::size_t asleep_bytes_ = 0;
  std::uintptr_t lowest_ = UINTPTR_MAX;  ///< the lowest address of any segment
  std::uintptr_t highest_ = 0;           ///< one past the highest byte of any segment
};

}  // namespace cgt
