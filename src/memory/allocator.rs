//! The framework allocator: a caching allocator modelled on PyTorch's CUDA caching allocator
//! (c10/cuda/CUDACachingAllocator.cpp). Requests are rounded to 512 bytes; requests up to
//! 1 MiB come from 2 MiB "small" segments, larger ones from 20 MiB segments (under 10 MiB) or
//! from segments rounded up to 2 MiB. Freed blocks stay cached in their pool, are split and
//! reused best-fit, and neighbours merge; only `empty_cache` gives whole free segments back.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::base::units::fmt_u;

/// PyTorch's `kMinBlockSize`: every request is rounded up to a multiple of this.
pub const MIN_BLOCK_BYTES: u64 = 512;
/// PyTorch's `kSmallSize`: requests up to this size use the small pool.
pub const SMALL_SIZE_BYTES: u64 = 1 << 20;
/// PyTorch's `kSmallBuffer`: segment size of the small pool.
pub const SMALL_SEGMENT_BYTES: u64 = 2 << 20;
/// PyTorch's `kMinLargeAlloc`: large requests under this share a `kLargeBuffer` segment.
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// PyTorch's `kLargeBuffer`.
pub const LARGE_SEGMENT_BYTES: u64 = 20 << 20;
/// PyTorch's `kRoundLarge`: larger segments are rounded up to this.
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;

/// A segment obtained from the device (the `cudaMalloc` of the real allocator).
pub trait SegmentSource {
    /// Maps `bytes` of device memory; `None` when the device is out of memory.
    fn map_segment(&mut self, bytes: u64) -> Option<SegmentHandle>;
    fn unmap_segment(&mut self, handle: SegmentHandle);
}

/// Opaque id the device gives a segment (its base pointer on CUDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SegmentHandle(pub u64);

/// A live allocation handed to a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub(crate) id: u32,
    pub segment: SegmentHandle,
    pub offset: u64,
    /// Rounded size actually taken from the pool (what `allocated` counts).
    pub bytes: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorStats {
    /// Bytes in blocks handed to live tensors (`allocated_bytes.all.current`).
    pub allocated: u64,
    pub allocated_peak: u64,
    /// Bytes in segments held from the device (`reserved_bytes.all.current`).
    pub reserved: u64,
    pub reserved_peak: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
}

/// What the allocator did, in order, with the stats right after it; the runtime turns these
/// into timeline events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
///
/// `addr` is an address in the allocator's own address space (see `CachingAllocator::next_top`),
/// not the device's pointer, so a dry run, a CPU run and a GPU run log the same numbers; it
/// lets a trace be exported as a PyTorch memory snapshot (segment base, block = base + offset).
pub enum AllocatorAction {
    SegmentMap { bytes: u64, addr: u64 },
    SegmentUnmap { bytes: u64, addr: u64 },
    Alloc { bytes: u64, addr: u64 },
    Free { bytes: u64, addr: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedAction {
    pub action: AllocatorAction,
    pub stats: AllocatorStats,
    /// The pool of the block or segment (0: the default pool; see `set_capture_pool`).
    pub pool: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "out of memory: tried to allocate {} (a new {} segment); the framework holds {} of which {} are allocated",
    fmt_u(*requested),
    fmt_u(*segment),
    fmt_u(*reserved),
    fmt_u(*allocated)
)]
pub struct OutOfMemory {
    pub requested: u64,
    pub segment: u64,
    pub allocated: u64,
    pub reserved: u64,
}

/// A block pool: the small or the large blocks of the default pool (`private` 0) or of a
/// private pool (PyTorch's `PrivatePool`, one per CUDA graph pool handle: what a capture
/// allocates comes from its private pool's own segments, and goes back there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pool {
    private: u16,
    small: bool,
}

impl Pool {
    fn index(self) -> usize {
        self.private as usize * 2 + usize::from(!self.small)
    }
}

#[derive(Clone, Debug)]
struct Block {
    segment: u32,
    offset: u64,
    size: u64,
    allocated: bool,
    prev: Option<u32>,
    next: Option<u32>,
    live: bool,
}

#[derive(Clone, Debug)]
struct Segment {
    handle: SegmentHandle,
    /// Base in the allocator's own address space (never reused; see `next_top`).
    base: u64,
    size: u64,
    pool: Pool,
    live: bool,
}

/// Free-block key: best fit by size, then by address (PyTorch's `BlockComparatorSize`), then
/// the block id (addresses are unique; the id only makes the key total).
type FreeKey = (u64, u64, u32);

#[derive(Debug, Default)]
pub struct CachingAllocator {
    blocks: Vec<Block>,
    free_block_ids: Vec<u32>,
    segments: Vec<Segment>,
    /// Free blocks per pool (`Pool::index`): the default pool's small, then large blocks first.
    free: Vec<BTreeSet<FreeKey>>,
    /// The private pool new blocks come from while a CUDA graph is being captured.
    capture_pool: Option<u16>,
    /// Private pools whose graphs are alive: `empty_cache` keeps their segments (PyTorch
    /// releases a private pool's memory only once every graph using it is gone).
    retained: BTreeSet<u16>,
    stats: AllocatorStats,
    actions: Vec<LoggedAction>,
    /// Where the next segment ends in the allocator's own address space: device-independent
    /// addresses for the event log and for best fit's tie-break. Segments are laid top-down,
    /// each address used once, because the CUDA driver hands them out that way: replaying
    /// vramscope's traces through PyTorch's allocator on the H200 (docs/gpu-runs.md run 31),
    /// each new segment landed below the previous one. PyTorch breaks best-fit ties by address,
    /// so among equal free blocks the newest segment's is taken first, here as there.
    next_top: u64,
    /// `max_split_size` (`PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:N`, or vLLM's
    /// `torch._C._accelerator_setAllocatorSettings` around its load and profile run); `None`
    /// is PyTorch's default, no limit. See [`CachingAllocator::set_max_split`].
    max_split: Option<u64>,
}

/// Where the allocator's own address space ends (a typical CUDA heap address, so exported
/// snapshots look familiar in PyTorch's viewer); segments are laid below it.
pub const ADDRESS_SPACE_TOP: u64 = 0x7fff_0000_0000;

/// Rounds a request the way PyTorch's `round_size` does (no power-of-two divisions).
pub fn round_size(bytes: u64) -> u64 {
    if bytes < MIN_BLOCK_BYTES {
        MIN_BLOCK_BYTES
    } else {
        bytes.div_ceil(MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
    }
}

/// Size of the segment mapped for a rounded request (PyTorch's `get_allocation_size`).
pub fn segment_size_for(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE_BYTES {
        SMALL_SEGMENT_BYTES
    } else if rounded < MIN_LARGE_ALLOC_BYTES {
        LARGE_SEGMENT_BYTES
    } else {
        rounded.div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
    }
}

impl CachingAllocator {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn stats(&self) -> AllocatorStats {
        self.stats
    }

    /// Takes the actions logged since the last call.
    pub fn drain_actions(&mut self) -> Vec<LoggedAction> {
        std::mem::take(&mut self.actions)
    }

    fn log(&mut self, action: AllocatorAction, pool: Pool) {
        self.actions.push(LoggedAction {
            action,
            stats: self.stats,
            pool: pool.private,
        });
    }

    fn pool_of(&self, bytes: u64) -> Pool {
        Pool {
            private: self.capture_pool.unwrap_or(0),
            small: bytes <= SMALL_SIZE_BYTES,
        }
    }

    fn free_set(&mut self, pool: Pool) -> &mut BTreeSet<FreeKey> {
        let i = pool.index();
        if self.free.len() <= i {
            self.free.resize_with(i + 1, BTreeSet::new);
        }
        &mut self.free[i]
    }

    /// Routes new blocks to private pool `pool` (≥ 1: a graph's pool while it is captured,
    /// `torch.cuda.graph(pool=…)`, or another stream's blocks, which PyTorch never hands to
    /// the default stream), or back to the default pool (`None`). Frees always go to the pool
    /// the block came from.
    pub fn set_capture_pool(&mut self, pool: Option<u16>) {
        assert!(pool != Some(0), "private pools are numbered from 1");
        self.capture_pool = pool;
    }

    /// Graphs use private pool `pool`: `empty_cache` keeps its segments until `release_pool`.
    pub fn retain_pool(&mut self, pool: u16) {
        self.retained.insert(pool);
    }

    /// The graphs of private pool `pool` are gone: its wholly free segments go back at the
    /// next `empty_cache`.
    pub fn release_pool(&mut self, pool: u16) {
        self.retained.remove(&pool);
    }

    /// Bytes in segments of private pool `pool` (0: the default pool).
    pub fn pool_reserved(&self, pool: u16) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.live && s.pool.private == pool)
            .map(|s| s.size)
            .sum()
    }

    fn key(&self, id: u32) -> FreeKey {
        let b = &self.blocks[id as usize];
        let base = self.segments[b.segment as usize].base;
        (b.size, base + b.offset, id)
    }

    fn new_block(&mut self, block: Block) -> u32 {
        if let Some(id) = self.free_block_ids.pop() {
            self.blocks[id as usize] = block;
            id
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as u32
        }
    }

    fn insert_free(&mut self, id: u32) {
        let pool = self.segments[self.blocks[id as usize].segment as usize].pool;
        let key = self.key(id);
        self.free_set(pool).insert(key);
    }

    fn remove_free(&mut self, id: u32) {
        let pool = self.segments[self.blocks[id as usize].segment as usize].pool;
        let key = self.key(id);
        self.free_set(pool).remove(&key);
    }

    /// Allocates `requested` bytes; maps a new segment from `source` when no cached block fits,
    /// after giving cached segments back and retrying once (as PyTorch does before an OOM).
    pub fn allocate(
        &mut self,
        requested: u64,
        source: &mut dyn SegmentSource,
    ) -> Result<BlockRef, OutOfMemory> {
        let size = round_size(requested);
        let pool = self.pool_of(size);
        let limit = self.max_split.unwrap_or(u64::MAX);
        // `get_free_block`: the best fit, unless it is an oversize block (≥ the limit) and the
        // request is small, or the request is oversize and the block 20 MiB
        // (`max_non_split_rounding_size`'s default) or more larger than it.
        let found = self
            .free_set(pool)
            .range((size, 0, 0)..)
            .next()
            .copied()
            .filter(|&(block, _, _)| {
                if size < limit {
                    block < limit
                } else {
                    block < size + LARGE_SEGMENT_BYTES
                }
            })
            .map(|k| k.2);
        let id = match found {
            Some(id) => {
                self.remove_free(id);
                id
            }
            None => self.map_new_segment(size, pool, source)?,
        };
        let remaining = self.blocks[id as usize].size - size;
        // `should_split`: an oversize request never splits its block.
        let split = if pool.small {
            remaining >= MIN_BLOCK_BYTES
        } else {
            size < limit && remaining > SMALL_SIZE_BYTES
        };
        if split {
            let b = self.blocks[id as usize].clone();
            let rest = self.new_block(Block {
                segment: b.segment,
                offset: b.offset + size,
                size: remaining,
                allocated: false,
                prev: Some(id),
                next: b.next,
                live: true,
            });
            if let Some(n) = b.next {
                self.blocks[n as usize].prev = Some(rest);
            }
            let blk = &mut self.blocks[id as usize];
            blk.next = Some(rest);
            blk.size = size;
            self.insert_free(rest);
        }
        let blk = &mut self.blocks[id as usize];
        blk.allocated = true;
        let bytes = blk.size;
        let seg = &self.segments[blk.segment as usize];
        let addr = seg.base + blk.offset;
        let block = BlockRef {
            id,
            segment: seg.handle,
            offset: blk.offset,
            bytes,
        };
        self.stats.allocated += bytes;
        self.stats.allocated_peak = self.stats.allocated_peak.max(self.stats.allocated);
        self.log(AllocatorAction::Alloc { bytes, addr }, pool);
        Ok(block)
    }

    fn map_new_segment(
        &mut self,
        size: u64,
        pool: Pool,
        source: &mut dyn SegmentSource,
    ) -> Result<u32, OutOfMemory> {
        let seg_bytes = segment_size_for(size);
        let handle = match source.map_segment(seg_bytes) {
            Some(h) => h,
            None => {
                self.stats.alloc_retries += 1;
                if self.release_available_oversize(size, pool, source) {
                    if let Some(h) = source.map_segment(seg_bytes) {
                        return Ok(self.add_segment(h, seg_bytes, pool));
                    }
                }
                self.empty_cache(source);
                match source.map_segment(seg_bytes) {
                    Some(h) => h,
                    None => {
                        self.stats.ooms += 1;
                        return Err(OutOfMemory {
                            requested: size,
                            segment: seg_bytes,
                            allocated: self.stats.allocated,
                            reserved: self.stats.reserved,
                        });
                    }
                }
            }
        };
        Ok(self.add_segment(handle, seg_bytes, pool))
    }

    /// Records a segment the device just mapped, as one free block.
    fn add_segment(&mut self, handle: SegmentHandle, seg_bytes: u64, pool: Pool) -> u32 {
        if self.next_top == 0 {
            self.next_top = ADDRESS_SPACE_TOP;
        }
        let base = self.next_top - seg_bytes;
        self.next_top = base;
        let seg_id = match self.segments.iter().position(|s| !s.live) {
            Some(i) => {
                self.segments[i] = Segment {
                    handle,
                    base,
                    size: seg_bytes,
                    pool,
                    live: true,
                };
                i as u32
            }
            None => {
                self.segments.push(Segment {
                    handle,
                    base,
                    size: seg_bytes,
                    pool,
                    live: true,
                });
                (self.segments.len() - 1) as u32
            }
        };
        self.stats.reserved += seg_bytes;
        self.stats.reserved_peak = self.stats.reserved_peak.max(self.stats.reserved);
        self.log(
            AllocatorAction::SegmentMap {
                bytes: seg_bytes,
                addr: base,
            },
            pool,
        );
        self.new_block(Block {
            segment: seg_id,
            offset: 0,
            size: seg_bytes,
            allocated: false,
            prev: None,
            next: None,
            live: true,
        })
    }

    /// PyTorch's `release_available_cached_blocks`, tried before every cached segment goes back
    /// when a new one cannot be mapped: with a split limit, the smallest free oversize block of
    /// the request's pool at least as large as the request (or the limit), else the largest
    /// ones, down from the largest, until as many bytes are free. Only whole segments are
    /// given back (an oversize block is one whenever the limit was set before its segment
    /// was made).
    fn release_available_oversize(
        &mut self,
        size: u64,
        pool: Pool,
        source: &mut dyn SegmentSource,
    ) -> bool {
        let Some(limit) = self.max_split else {
            return false;
        };
        let want = size.max(limit);
        let whole = |a: &Self, id: u32| {
            let b = &a.blocks[id as usize];
            b.prev.is_none() && b.next.is_none()
        };
        let fits = self
            .free_set(pool)
            .range((want, 0, 0)..)
            .next()
            .map(|k| k.2);
        if let Some(id) = fits {
            if !whole(self, id) {
                return false;
            }
            self.release_segment(id, source);
            return true;
        }
        let mut released = 0;
        let candidates: Vec<(u64, u32)> = self
            .free_set(pool)
            .iter()
            .rev()
            .take_while(|k| k.0 >= limit)
            .map(|k| (k.0, k.2))
            .collect();
        for (bytes, id) in candidates {
            if released >= want {
                break;
            }
            if whole(self, id) {
                self.release_segment(id, source);
                released += bytes;
            }
        }
        released >= want
    }

    /// Gives the segment of free whole block `id` back to the device.
    fn release_segment(&mut self, id: u32, source: &mut dyn SegmentSource) {
        self.remove_free(id);
        let seg_id = self.blocks[id as usize].segment as usize;
        self.blocks[id as usize].live = false;
        self.free_block_ids.push(id);
        let seg = &mut self.segments[seg_id];
        seg.live = false;
        let (handle, bytes, addr, pool) = (seg.handle, seg.size, seg.base, seg.pool);
        source.unmap_segment(handle);
        self.stats.reserved -= bytes;
        self.log(AllocatorAction::SegmentUnmap { bytes, addr }, pool);
    }

    /// Sets PyTorch's `max_split_size` (`None`: no limit, PyTorch's default). With a limit,
    /// a free block of at least that size is not handed to a smaller request, a request of
    /// at least that size never splits the block it takes and takes none 20 MiB or more
    /// larger than itself, and such blocks are given back first when the device is full
    /// (c10/cuda/CUDACachingAllocator.cpp `get_free_block`, `should_split`,
    /// `release_available_cached_blocks`). vLLM sets 20 MiB around its weight load from
    /// 0.21 and around its profile run from 0.31 (`_scoped_allocator_max_split`).
    pub fn set_max_split(&mut self, bytes: Option<u64>) {
        self.max_split = bytes;
    }

    /// Returns a block to its pool, merging it with free neighbours.
    pub fn free(&mut self, block: BlockRef) {
        let mut id = block.id;
        let (addr, pool) = {
            let b = &self.blocks[block.id as usize];
            let seg = &self.segments[b.segment as usize];
            (seg.base + b.offset, seg.pool)
        };
        {
            let b = &mut self.blocks[id as usize];
            assert!(b.live && b.allocated, "double free of block {id}");
            b.allocated = false;
            self.stats.allocated -= b.size;
        }
        self.log(
            AllocatorAction::Free {
                bytes: block.bytes,
                addr,
            },
            pool,
        );
        if let Some(p) = self.blocks[id as usize].prev {
            if !self.blocks[p as usize].allocated {
                self.remove_free(p);
                self.merge_into_prev(p, id);
                id = p;
            }
        }
        if let Some(n) = self.blocks[id as usize].next {
            if !self.blocks[n as usize].allocated {
                self.remove_free(n);
                self.merge_into_prev(id, n);
            }
        }
        self.insert_free(id);
    }

    /// Folds block `b` into `a`, its previous neighbour.
    fn merge_into_prev(&mut self, a: u32, b: u32) {
        let bb = self.blocks[b as usize].clone();
        let blk = &mut self.blocks[a as usize];
        blk.size += bb.size;
        blk.next = bb.next;
        if let Some(n) = bb.next {
            self.blocks[n as usize].prev = Some(a);
        }
        self.blocks[b as usize].live = false;
        self.free_block_ids.push(b);
    }

    /// Gives every wholly free segment back to the device (`torch.cuda.empty_cache()`), but
    /// for those of private pools whose graphs are alive.
    pub fn empty_cache(&mut self, source: &mut dyn SegmentSource) {
        let whole: Vec<u32> = self
            .free
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.retained.contains(&((i / 2) as u16)))
            .flat_map(|(_, set)| set.iter())
            .map(|k| k.2)
            .filter(|&id| {
                let b = &self.blocks[id as usize];
                b.prev.is_none() && b.next.is_none()
            })
            .collect();
        for id in whole {
            self.release_segment(id, source);
        }
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        self.stats.allocated_peak = self.stats.allocated;
        self.stats.reserved_peak = self.stats.reserved;
    }

    /// Live segments with their sizes, for fragmentation views and tests.
    pub fn segment_count(&self) -> usize {
        self.segments.iter().filter(|s| s.live).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that hands out fake addresses and can be made to run out of memory.
    #[derive(Default)]
    struct FakeDevice {
        next: u64,
        used: u64,
        limit: Option<u64>,
        maps: u32,
        unmaps: u32,
        /// Give unmapped bytes back (`used` drops), as a real device does.
        frees: bool,
        sizes: std::collections::HashMap<u64, u64>,
    }

    impl SegmentSource for FakeDevice {
        fn map_segment(&mut self, bytes: u64) -> Option<SegmentHandle> {
            if self.limit.is_some_and(|l| self.used + bytes > l) {
                return None;
            }
            self.used += bytes;
            self.maps += 1;
            self.next += 1 << 40;
            self.sizes.insert(self.next, bytes);
            Some(SegmentHandle(self.next))
        }
        fn unmap_segment(&mut self, handle: SegmentHandle) {
            self.unmaps += 1;
            if self.frees {
                self.used -= self.sizes.remove(&handle.0).unwrap_or(0);
            }
        }
    }

    const MIB: u64 = 1 << 20;

    /// A graph's private pool keeps its own segments: the default pool's cached blocks are
    /// not used during capture, frees go back to the block's own pool, a later capture into
    /// the same pool reuses them (vLLM captures its sizes largest first into one pool), and
    /// `empty_cache` keeps them while the pool's graphs live.
    #[test]
    fn private_pools_keep_their_own_segments() {
        let mut d = FakeDevice::default();
        let mut a = CachingAllocator::new();
        let x = a.allocate(30 * MIB, &mut d).unwrap();
        a.free(x);
        assert_eq!(a.stats().reserved, 30 * MIB);
        a.set_capture_pool(Some(1));
        a.retain_pool(1);
        let y = a.allocate(30 * MIB, &mut d).unwrap();
        assert_eq!(
            d.maps, 2,
            "the default pool's free 30 MiB block is not the graph's"
        );
        a.set_capture_pool(None);
        a.free(y);
        assert_eq!(a.pool_reserved(1), 30 * MIB);
        assert_eq!(a.pool_reserved(0), 30 * MIB);
        // A smaller capture into the same pool splits its cached block.
        a.set_capture_pool(Some(1));
        let z = a.allocate(12 * MIB, &mut d).unwrap();
        a.free(z);
        a.set_capture_pool(None);
        assert_eq!(d.maps, 2);
        a.empty_cache(&mut d);
        assert_eq!(a.stats().reserved, 30 * MIB, "the live graph pool stays");
        assert_eq!(a.pool_reserved(1), 30 * MIB);
        a.release_pool(1);
        a.empty_cache(&mut d);
        assert_eq!(a.stats().reserved, 0);
        assert_eq!(d.unmaps, 2);
    }

    #[test]
    fn rounding_follows_pytorch() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size_for(512), 2 * MIB);
        assert_eq!(segment_size_for(MIB), 2 * MIB);
        assert_eq!(segment_size_for(MIB + 512), 20 * MIB);
        assert_eq!(segment_size_for(10 * MIB), 10 * MIB);
        assert_eq!(segment_size_for(11 * MIB + 1), 12 * MIB);
    }

    #[test]
    fn small_requests_share_one_two_mib_segment() {
        let mut dev = FakeDevice::default();
        let mut a = CachingAllocator::new();
        let blocks: Vec<_> = (0..4)
            .map(|_| a.allocate(1000, &mut dev).unwrap())
            .collect();
        assert_eq!(dev.maps, 1);
        assert_eq!(a.stats().allocated, 4 * 1024);
        assert_eq!(a.stats().reserved, 2 * MIB);
        assert_eq!(blocks[1].offset, 1024);
    }

    #[test]
    fn freed_block_is_reused_without_a_new_segment() {
        let mut dev = FakeDevice::default();
        let mut a = CachingAllocator::new();
        let b = a.allocate(64 * MIB, &mut dev).unwrap();
        a.free(b);
        let c = a.allocate(32 * MIB, &mut dev).unwrap();
        assert_eq!(dev.maps, 1);
        assert_eq!(c.offset, 0);
        assert_eq!(a.stats().allocated, 32 * MIB);
        assert_eq!(a.stats().reserved, 64 * MIB);
    }

    #[test]
    fn empty_cache_returns_only_wholly_free_segments() {
        let mut dev = FakeDevice::default();
        let mut a = CachingAllocator::new();
        let x = a.allocate(30 * MIB, &mut dev).unwrap();
        let y = a.allocate(40 * MIB, &mut dev).unwrap();
        let _z = a.allocate(100, &mut dev).unwrap();
        a.free(x);
        a.empty_cache(&mut dev);
        assert_eq!(a.stats().reserved, 40 * MIB + 2 * MIB);
        a.free(y);
        a.empty_cache(&mut dev);
        assert_eq!(a.stats().reserved, 2 * MIB);
        assert_eq!(dev.unmaps, 2);
    }

    #[test]
    fn split_blocks_merge_back_on_free() {
        let mut dev = FakeDevice::default();
        let mut a = CachingAllocator::new();
        let big = a.allocate(64 * MIB, &mut dev).unwrap();
        a.free(big);
        let p = a.allocate(16 * MIB, &mut dev).unwrap();
        let q = a.allocate(16 * MIB, &mut dev).unwrap();
        assert_eq!(q.offset, 16 * MIB);
        a.free(p);
        a.free(q);
        a.empty_cache(&mut dev);
        assert_eq!(a.stats().reserved, 0);
        assert_eq!(a.segment_count(), 0);
    }

    #[test]
    fn peaks_reset_to_current() {
        let mut dev = FakeDevice::default();
        let mut a = CachingAllocator::new();
        let x = a.allocate(8 * MIB, &mut dev).unwrap();
        a.free(x);
        assert_eq!(a.stats().allocated_peak, 8 * MIB);
        a.reset_peak();
        assert_eq!(a.stats().allocated_peak, 0);
        assert_eq!(a.stats().reserved_peak, 20 * MIB);
    }

    #[test]
    fn out_of_memory_releases_cache_then_fails_cleanly() {
        let mut dev = FakeDevice {
            limit: Some(100 * MIB),
            ..Default::default()
        };
        let mut a = CachingAllocator::new();
        let x = a.allocate(60 * MIB, &mut dev).unwrap();
        a.free(x);
        dev.used = 60 * MIB;
        // 60 MiB cached, 80 MiB wanted: the cache is released, then the retry succeeds.
        dev.limit = Some(100 * MIB);
        let y = a.allocate(80 * MIB, &mut dev);
        assert!(y.is_err(), "fake device never frees used bytes on unmap");
        assert_eq!(a.stats().alloc_retries, 1);
        assert_eq!(a.stats().ooms, 1);
        assert_eq!(a.stats().reserved, 0);
    }

    #[test]
    fn actions_carry_running_stats() {
        let mut dev = FakeDevice::default();
        let mut a = CachingAllocator::new();
        let x = a.allocate(3 * MIB, &mut dev).unwrap();
        a.free(x);
        let acts = a.drain_actions();
        assert_eq!(acts.len(), 3);
        assert_eq!(
            acts[0].action,
            AllocatorAction::SegmentMap {
                bytes: 20 * MIB,
                addr: ADDRESS_SPACE_TOP - 20 * MIB
            }
        );
        assert_eq!(
            acts[1].action,
            AllocatorAction::Alloc {
                bytes: 3 * MIB,
                addr: ADDRESS_SPACE_TOP - 20 * MIB
            }
        );
        assert_eq!(acts[0].stats.allocated, 0);
        assert_eq!(acts[1].stats.allocated, 3 * MIB);
        assert_eq!(acts[2].stats.allocated, 0);
    }

    /// PyTorch's `max_split_size` (vLLM's 20 MiB around its load): a free block of 20 MiB or
    /// more is not handed to a smaller request, an oversize request does not split the block
    /// it takes (the block's whole size counts as allocated) and takes none 20 MiB or more
    /// larger than itself; lifting the limit restores best fit with splitting.
    #[test]
    fn split_limit_keeps_oversize_blocks_whole() {
        let mut d = FakeDevice::default();
        let mut a = CachingAllocator::new();
        a.set_max_split(Some(20 * MIB));
        let big = a.allocate(100 * MIB, &mut d).unwrap();
        a.free(big);
        // A small request does not take the cached 100 MiB block.
        let small = a.allocate(4 * MIB, &mut d).unwrap();
        assert_eq!(d.maps, 2);
        assert_eq!(small.bytes, 4 * MIB);
        // An oversize request within 20 MiB of it takes it whole.
        let near = a.allocate(90 * MIB, &mut d).unwrap();
        assert_eq!(d.maps, 2);
        assert_eq!(
            near.bytes,
            100 * MIB,
            "not split: the slack counts as allocated"
        );
        assert_eq!(a.stats().allocated, 104 * MIB);
        a.free(near);
        // One 20 MiB or more smaller maps a segment of its own.
        let far = a.allocate(60 * MIB, &mut d).unwrap();
        assert_eq!(d.maps, 3);
        assert_eq!(far.bytes, 60 * MIB);
        a.free(far);
        a.free(small);
        // Without the limit the same request splits the 100 MiB block.
        a.set_max_split(None);
        let split = a.allocate(60 * MIB, &mut d).unwrap();
        assert_eq!(d.maps, 3);
        assert_eq!(split.bytes, 60 * MIB);
        assert_eq!(a.stats().reserved, 100 * MIB + 20 * MIB + 60 * MIB);
    }

    /// With a split limit, a full device first gives back cached oversize segments (largest
    /// first when none is large enough alone) before every cached segment goes.
    #[test]
    fn split_limit_releases_oversize_blocks_first_when_full() {
        let mut d = FakeDevice {
            limit: Some(150 * MIB),
            frees: true,
            ..FakeDevice::default()
        };
        let mut a = CachingAllocator::new();
        a.set_max_split(Some(20 * MIB));
        let x = a.allocate(40 * MIB, &mut d).unwrap();
        let y = a.allocate(50 * MIB, &mut d).unwrap();
        let z = a.allocate(4 * MIB, &mut d).unwrap();
        a.free(x);
        a.free(y);
        a.free(z);
        // 110 MiB mapped; 60 MiB more does not fit and no cached block holds it: the largest
        // oversize segments go until 60 MiB are released (50, then 40), the 20 MiB one that
        // held the small request stays cached.
        let w = a.allocate(60 * MIB, &mut d).unwrap();
        assert_eq!(d.unmaps, 2);
        assert_eq!(a.stats().reserved, 20 * MIB + 60 * MIB);
        assert_eq!(w.bytes, 60 * MIB);
    }
}
