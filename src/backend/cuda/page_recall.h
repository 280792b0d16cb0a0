// The KV hierarchy's device I/O engine (issue 23; the CPU statement is kv/tier_copy.h): the host
// tier's storage in pinned, mapped DRAM, and the moves of head-pages between it and the HBM pool.
// One gather/scatter kernel copies K and V of each move zero-copy over PCIe, reading its move
// list and count from device memory (a captured graph replays with whatever count was written
// before it); the copy-engine forms (cudaMemcpyAsync per run, cudaMemcpyBatchAsync) are kept for
// comparison (bench/recall_bench.cu, docs/kernels/page_recall_NOTES.md).
//
//   host tier k, v:  [n_pages, page_size, head_dim] f16, pinned and mapped (HostPagePool)
//   device pool k, v: [n_pages, page_size, head_dim] f16 (DevicePagePool)
//   moves:    [capacity, 2] int32 (src slot, dst slot) in the direction's source / destination pool
//   n_moves:  [1] int32 moves to do, read by the kernel (clamped to [0, capacity])
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cuda/device_page_pool.h"
#include "kv/tier_copy.h"

namespace dhs::cuda {

// The host tier's storage: the same f16 head-page layout as DevicePagePool (K and V apart), in
// pinned DRAM mapped into the device's address space (cudaHostAllocMapped | Portable). The
// allocator and accounting stay in a PagePool(Tier::Host, .., with_storage = false).
class HostPagePool {
 public:
  // Throws dhs::Error (naming the GiB asked for) when the pinned allocation fails.
  HostPagePool(int64_t n_pages, int page_size, int head_dim);
  ~HostPagePool();
  HostPagePool(const HostPagePool&) = delete;
  HostPagePool& operator=(const HostPagePool&) = delete;

  int64_t n_pages() const { return n_pages_; }
  int page_size() const { return page_size_; }
  int head_dim() const { return head_dim_; }
  size_t page_elems() const { return static_cast<size_t>(page_size_) * static_cast<size_t>(head_dim_); }
  size_t bytes() const { return 2 * static_cast<size_t>(n_pages_) * page_elems() * sizeof(__half); }  // K + V

  // For the CPU: [n_pages, page_size, head_dim].
  __half* k_h() { return k_h_; }
  __half* v_h() { return v_h_; }
  const __half* k_h() const { return k_h_; }
  const __half* v_h() const { return v_h_; }
  // The same bytes as the device sees them (cudaHostGetDevicePointer): what kernels read and
  // write, every access crossing PCIe.
  __half* k_d() { return k_d_; }
  __half* v_d() { return v_d_; }
  const __half* k_d() const { return k_d_; }
  const __half* v_d() const { return v_d_; }
  // The mapped pages as kernels read them (decode attention over late pages, tier_split.h).
  PagePoolView view() const { return {k_d_, v_d_, n_pages_, page_size_, head_dim_}; }

 private:
  int64_t n_pages_;
  int page_size_, head_dim_;
  __half* k_h_ = nullptr;
  __half* v_h_ = nullptr;
  __half* k_d_ = nullptr;
  __half* v_d_ = nullptr;
};

enum class PageMoveDirection : uint8_t {
  Recall,  // host tier -> device pool
  Evict,   // device pool -> host tier
};

// A move list on the device, for one direction, capacity fixed at construction so that a
// captured graph's replays never allocate. Pairs and count may be written by the host (upload)
// or by a kernel of the step before the copy.
class DeviceMoveList {
 public:
  DeviceMoveList(int capacity, PageMoveDirection direction);
  ~DeviceMoveList();
  DeviceMoveList(const DeviceMoveList&) = delete;
  DeviceMoveList& operator=(const DeviceMoveList&) = delete;

  // Writes the pairs and the count (synchronous). Throws dhs::Error if the moves exceed the
  // capacity or name tiers other than the direction's (Recall: Host -> Device).
  void upload(std::span<const PageMove> moves);

  int capacity() const { return capacity_; }
  PageMoveDirection direction() const { return direction_; }
  int32_t* moves_d() { return moves_d_; }  // [capacity, 2] (src slot, dst slot)
  int32_t* count_d() { return count_d_; }  // [1]
  const int32_t* moves_d() const { return moves_d_; }
  const int32_t* count_d() const { return count_d_; }

 private:
  int capacity_;
  PageMoveDirection direction_;
  int32_t* moves_d_ = nullptr;
  int32_t* count_d_ = nullptr;
};

// Everything the move kernel reads, by value (__grid_constant__). Moves must name distinct
// destination slots (which copy lands last is otherwise unspecified); a move naming a slot
// outside either pool is skipped, never an out-of-bounds access, and counted in n_bad.
struct PageMoveParams {
  const int32_t* moves = nullptr;    // [max_moves, 2] (src slot, dst slot)
  const int32_t* n_moves = nullptr;  // [1] read on the device, clamped to [0, max_moves]
  const __half* src_k = nullptr;     // [n_src_pages, page_size, head_dim] (mapped host or HBM)
  const __half* src_v = nullptr;     // [n_src_pages, page_size, head_dim]
  __half* dst_k = nullptr;           // [n_dst_pages, page_size, head_dim]
  __half* dst_v = nullptr;           // [n_dst_pages, page_size, head_dim]
  int32_t* n_bad = nullptr;          // [1] += moves skipped for a slot out of range, or null
  int max_moves = 0;
  int64_t n_src_pages = 0;
  int64_t n_dst_pages = 0;
  int page_words = 0;  // 16-byte words per K (or V) page: page_size * head_dim / 8
};

// Blocks of the move kernel when the caller names none. Provisional: 8 blocks of 256 threads
// saturated PCIe in the anchor probe (51 GB/s; shared/anchors/h200-2026-11-29.md, io_probe2),
// each with 32 KiB of loads in flight, as here; fewer blocks leave more of the GPU to attention.
// To be confirmed by bench/recall_bench rows (b) and (c); see docs/kernels/page_recall_NOTES.md.
inline constexpr int kPageMoveBlocks = 8;
inline constexpr int kPageMoveThreads = 256;  // threads per block

// Launches the move kernel on n_blocks blocks (no checks).
void launch_page_move(const PageMoveParams& p, int n_blocks, cudaStream_t stream);

// The backend ops: check the list's direction, the pools' page shapes and n_blocks, then launch.
// No host sync and no allocation: capturable in a CUDA graph.
void recall_pages(const DeviceMoveList& moves, const HostPagePool& host, DevicePagePool& dev, cudaStream_t stream,
                  int n_blocks = kPageMoveBlocks);
void evict_pages(const DeviceMoveList& moves, const DevicePagePool& dev, HostPagePool& host, cudaStream_t stream,
                 int n_blocks = kPageMoveBlocks);

// Rows of one device array copied to other rows of the same array: what follows a page between
// the tiers besides its K and V — its key sketch and summary rows, kept under the page's key
// (kv/tier_split.h: device slot s, host slot n_device + h). pairs: [n, 2] (source row,
// destination row) in device memory; row_bytes a multiple of 16; no row both a source and a
// destination of one call.
void launch_move_rows(void* base, int64_t row_bytes, const int32_t* pairs, int n, cudaStream_t stream);

// ---- The copy-engine forms, for comparison: the host builds the copies from a host move list.

// A run of moves whose source and destination slots both advance by one (as tier_copy.cpp
// coalesces them): n pages from src.. to dst...
struct PageRun {
  int32_t src = 0, dst = 0, n = 0;
};
// Coalesces moves in list order. Throws dhs::Error on a move of other tiers than src -> dst or a
// slot outside [0, n_src) / [0, n_dst).
std::vector<PageRun> coalesce_page_moves(std::span<const PageMove> moves, Tier src_tier, int64_t n_src, Tier dst_tier,
                                         int64_t n_dst);

enum class CopyEngineForm : uint8_t {
  PerRun,  // one cudaMemcpyAsync per run and per K / V
  Batch,   // the same copies through cudaMemcpyBatchAsync (stream must not be the legacy null stream)
};
// Enqueue the copies on `stream`; return the runs (copies per K / V).
int64_t recall_pages_copy_engine(std::span<const PageMove> moves, const HostPagePool& host, DevicePagePool& dev,
                                 CopyEngineForm form, cudaStream_t stream);
int64_t evict_pages_copy_engine(std::span<const PageMove> moves, const DevicePagePool& dev, HostPagePool& host,
                                CopyEngineForm form, cudaStream_t stream);

}  // namespace dhs::cuda
