// GPU sampler (see sampling.h): one 1024-thread block per row of logits.
//
// Order. Token i gets the sort key (ord(x_i) << 32) | ~i, where x_i is the penalised
// logit divided by the temperature and ord() maps floats to unsigned ints in order.
// Keys are distinct and sort exactly as the CPU sampler sorts (value desc, id asc),
// so every kept set (top-k, then top-p, then min-p) is {key >= threshold}.
//
// Selection without a full sort. The CPU rule needs the sorted prefix only near its
// boundary. Candidates are narrowed by key range:
//   * top-k (k <= 1024): the k-th largest of the 1024 per-thread maxima is a lower
//     bound of the k-th largest key, so one pass collects a superset of the top k;
//   * top-p / min-p without top-k: a pass of online softmax gives Z, and tokens with
//     exp(x - max) < (1 - top_p) Z / (2 vocab) can never be inside the nucleus;
//   * otherwise (or when the superset exceeds the candidate list) a 4096-bin
//     histogram of counts / masses over the current key range finds the bins that
//     may hold the boundary; repeat on those bins (each level shrinks the range
//     4096-fold, 64-bit keys need at most 6 levels).
// The surviving candidates (<= 8192) are sorted in shared memory (bitonic) and the
// CPU rule is applied to them exactly, in double, in sorted order. Elements above
// the candidate range are known to be kept, and enter only as a count and a mass.
//
// Draw. u = Philox4x32-10(counter = rng_offset[row], key = seed); the token is the
// first whose running mass exceeds u * total, in sorted order when the kept set is
// in shared memory, else in a fixed thread-major order over the vocabulary (any
// fixed order gives the same distribution).
//
// Masses: exp() in double for the candidates (as the CPU), expf() for histogram
// masses, summed as 2^-44 fixed point so that sums do not depend on atomic order
// (same input, same seed -> same token). Histogram decisions carry a tolerance of
// 3e-7 Z, larger than the expf/fixed-point error, so the exact decision is always
// made on candidates.
#include "backend/cuda/sampling.h"

#include <curand_kernel.h>

#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 4096;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kCandCap = 8192;
constexpr int kCandPerThread = kCandCap / kThreads;
constexpr double kFix = 17592186044416.0;  // 2^44: a mass <= 1 times this fits, 152k of them sum < 2^62
constexpr double kInvFix = 1.0 / kFix;
constexpr size_t kRegionBytes = static_cast<size_t>(kCandCap) * 16;  // keys + running masses
static_assert(kRegionBytes >= static_cast<size_t>(kBins) * 12, "histogram aliases the candidate list");
constexpr u64 kKeyMax = ~0ull;

void require(bool cond, const char* what) {
  if (!cond) check(cudaErrorInvalidValue, what, __FILE__, __LINE__);
}

size_t smem_bytes(int vocab) { return kRegionBytes + static_cast<size_t>((vocab + 31) / 32) * 4; }

struct Scratch {
  u64 u[kWarps];
  double d[kWarps];
  u64 at_cnt[2];
  u64 at_mass[2];
  int n;
  double rng_u;
};

// ---- keys --------------------------------------------------------------------------

__device__ __forceinline__ unsigned f2ord(float x) {
  const unsigned b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float ord2f(unsigned o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ u64 make_key(float x, int i) {
  return (static_cast<u64>(f2ord(x)) << 32) | static_cast<u64>(~static_cast<unsigned>(i));
}
__device__ __forceinline__ int key_id(u64 k) { return static_cast<int>(~static_cast<unsigned>(k & 0xffffffffull)); }
__device__ __forceinline__ float key_x(u64 k) { return ord2f(static_cast<unsigned>(k >> 32)); }
// x at a histogram bin edge: edges may fall in the ord ranges of NaNs; clamp them to +-inf.
__device__ __forceinline__ float edge_x(u64 k) {
  unsigned o = static_cast<unsigned>(k >> 32);
  o = o < 0x007fffffu ? 0x007fffffu : (o > 0xff800000u ? 0xff800000u : o);
  return ord2f(o);
}

struct RowCtx {
  const float* logits;       // [vocab]
  const unsigned* pen_bits;  // [vocab / 32] ids under the repetition penalty, or null
  float penalty;
  float temperature;
  bool greedy;
  int vocab;
};

// x_i as the CPU computes it: penalty (divide positive, multiply negative), then / T.
// The sampler's value of token i from its raw logit l.
__device__ __forceinline__ float finish_x(const RowCtx& c, float l, int i) {
  if (c.pen_bits && ((c.pen_bits[i >> 5] >> (i & 31)) & 1u)) l = l > 0.0f ? l / c.penalty : l * c.penalty;
  float x = c.greedy ? l : l / c.temperature;
  if (x != x) x = -INFINITY;  // NaN never wins
  if (x == 0.0f) x = 0.0f;    // -0 == +0 for the CPU: same key, tie broken by id
  return x;
}
__device__ __forceinline__ float load_x(const RowCtx& c, int i) { return finish_x(c, __ldg(c.logits + i), i); }

// ---- block primitives (fixed summation order: results do not vary run to run) -------

struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* s_part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = s_part[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, s_part[w]);
  __syncthreads();
  return r;
}

template <typename T>
__device__ T block_exclusive_scan(T v, T* s_part, T* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  T exc = __shfl_up_sync(0xffffffffu, inc, 1);
  if (lane == 0) exc = T(0);
  if (lane == 31) s_part[warp] = inc;
  __syncthreads();
  T pre = T(0), tot = T(0);
  for (int w = 0; w < kWarps; ++w) {
    const T x = s_part[w];
    if (w < warp) pre += x;
    tot += x;
  }
  __syncthreads();
  *total = tot;
  return pre + exc;
}

// Descending bitonic sort of a[0..n), n <= kCandCap; pads to a power of two with 0
// (below every real key).
__device__ void sort_desc(u64* a, int n) {
  int n2 = 2;
  while (n2 < n) n2 <<= 1;
  for (int j = n + threadIdx.x; j < n2; j += kThreads) a[j] = 0;
  __syncthreads();
  for (int size = 2; size <= n2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < n2 / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const u64 x = a[i], y = a[j];
        const bool desc = (i & size) == 0;
        if (desc ? x < y : x > y) {
          a[i] = y;
          a[j] = x;
        }
      }
      __syncthreads();
    }
  }
}

// Copies the keys in [lo, hi] into s_keys (at most cap of them, in no particular
// order); returns how many there are.
__device__ int collect(const RowCtx& c, u64 lo, u64 hi, int cap, u64* s_keys, Scratch& s) {
  if (threadIdx.x == 0) s.n = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  for (int i0 = 0; i0 < c.vocab; i0 += kThreads) {
    const int i = i0 + threadIdx.x;
    u64 key = 0;
    bool in = false;
    if (i < c.vocab) {
      key = make_key(load_x(c, i), i);
      in = key >= lo && key <= hi;
    }
    const unsigned mask = __ballot_sync(0xffffffffu, in);
    if (mask) {
      int base = 0;
      if (lane == 0) base = atomicAdd(&s.n, __popc(mask));
      base = __shfl_sync(0xffffffffu, base, 0);
      if (in) {
        const int pos = base + __popc(mask & ((1u << lane) - 1u));
        if (pos < cap) s_keys[pos] = key;
      }
    }
  }
  __syncthreads();
  const int n = s.n;
  __syncthreads();
  return n;
}

// s_cum[j] = sum_{i <= j} exp(x_i - m) over the sorted candidates, in double as the
// CPU does; returns the total. Thread t owns j in [8t, 8t + 8).
__device__ double list_scan(const u64* s_keys, double* s_cum, int n, float m, Scratch& s) {
  const int j0 = threadIdx.x * kCandPerThread;
  double e[kCandPerThread];
  double sum = 0.0;
#pragma unroll
  for (int q = 0; q < kCandPerThread; ++q) {
    const int j = j0 + q;
    e[q] = j < n ? exp(static_cast<double>(key_x(s_keys[j]) - m)) : 0.0;
    sum += e[q];
  }
  double total;
  double run = block_exclusive_scan(sum, s.d, &total);
#pragma unroll
  for (int q = 0; q < kCandPerThread; ++q) {
    const int j = j0 + q;
    if (j < n) {
      run += e[q];
      s_cum[j] = run;
    }
  }
  __syncthreads();
  return total;
}

// ---- multi-level select ------------------------------------------------------------------

// What decides the boundary: a count (top-k), or a mass / value (top-p, min-p).
struct Crit {
  bool by_count;
  u64 k;
  bool topp;
  double top_p;
  bool minp;
  float min_p;
  double z;  // normaliser of the masses; < 0: take it from the first histogram
  float m;   // max x
};

// Candidate range: keys in [lo, hi] (n of them, sorted in s_keys once collected);
// above_* = the elements above hi that are known to be kept.
struct Sel {
  u64 lo, hi;
  u64 above_cnt, above_mass;  // mass in 2^-44 units
  int n;
};

// One histogram level over [sel.lo, sel.hi]. Returns true when the boundary falls on a
// bin edge (sel becomes an empty range, its threshold sel.hi + 1); else narrows sel to
// the bins that may hold the boundary and sets *known to how many keys they hold.
__device__ bool hist_level(const RowCtx& c, Crit& cr, Sel& sel, long long* known, int cap, unsigned* s_hcnt,
                           u64* s_hmass, Scratch& s) {
  const u64 lo = sel.lo, hi = sel.hi;
  const u64 width = hi - lo;
  int shift = 0;
  while ((width >> shift) >= static_cast<u64>(kBins)) ++shift;
  const int nb = static_cast<int>(width >> shift) + 1;

  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    s_hcnt[b] = 0;
    s_hmass[b] = 0;
  }
  __syncthreads();
  const bool want_z = cr.z < 0.0;
  double tail = 0.0;
  for (int i = threadIdx.x; i < c.vocab; i += kThreads) {
    const float x = load_x(c, i);
    const u64 key = make_key(x, i);
    if (key >= lo && key <= hi) {
      const int b = static_cast<int>((key - lo) >> shift);
      atomicAdd(&s_hcnt[b], 1u);
      atomicAdd(&s_hmass[b], static_cast<u64>(__float2ull_rn(expf(x - cr.m) * static_cast<float>(kFix))));
    } else if (want_z && key < lo) {
      tail += static_cast<double>(expf(x - cr.m));
    }
  }
  __syncthreads();

  // Thread t owns ranks r = 4t .. 4t+3 in descending key order (bin nb-1-r).
  unsigned cnt[kBinsPerThread];
  u64 mass[kBinsPerThread];
  u64 csum = 0, msum = 0;
#pragma unroll
  for (int q = 0; q < kBinsPerThread; ++q) {
    const int r = threadIdx.x * kBinsPerThread + q;
    cnt[q] = r < nb ? s_hcnt[nb - 1 - r] : 0u;
    mass[q] = r < nb ? s_hmass[nb - 1 - r] : 0ull;
    csum += cnt[q];
    msum += mass[q];
  }
  u64 ctot, mtot;
  const u64 cbase = block_exclusive_scan(csum, s.u, &ctot);
  const u64 mbase = block_exclusive_scan(msum, s.u, &mtot);
  if (want_z) cr.z = static_cast<double>(sel.above_mass + mtot) * kInvFix + block_reduce(tail, SumOp{}, s.d);

  int rs = nb, re = nb;
  u64 new_lo = lo, new_hi = hi, c_rs = 0, m_rs = 0, c_re = 0;
  for (int strict = 0; strict < 2; ++strict) {
    // rs: first rank not surely kept; rd: first rank surely dropped.
    int my_rs = nb, my_rd = nb;
    u64 cb = cbase, mb = mbase;
#pragma unroll
    for (int q = 0; q < kBinsPerThread; ++q) {
      const int r = threadIdx.x * kBinsPerThread + q;
      if (r < nb) {
        bool kept, dropped;
        if (cr.by_count) {
          const u64 gc = sel.above_cnt + cb;
          kept = gc + cnt[q] <= cr.k;
          dropped = gc >= cr.k;
        } else {
          kept = true;
          dropped = false;
          if (cr.topp) {
            const double gm = static_cast<double>(sel.above_mass + mb) * kInvFix;
            const double target = cr.top_p * cr.z;
            const double tol = strict ? 0.0 : 3e-7 * cr.z + 1e-8;
            kept = gm + static_cast<double>(mass[q]) * kInvFix < target - tol;
            dropped = gm >= target + tol;
          }
          if (cr.minp) {
            const int b = nb - 1 - r;
            const u64 klo = lo + (static_cast<u64>(b) << shift);
            const u64 khi = b == nb - 1 ? hi : klo + ((1ull << shift) - 1);
            const float e_lo = expf(edge_x(klo) - cr.m), e_hi = expf(edge_x(khi) - cr.m);
            const float eps = strict ? 0.0f : 1e-5f;
            kept = kept && e_lo >= cr.min_p * (1.0f + eps);
            dropped = dropped || e_hi < cr.min_p * (1.0f - eps);
          }
        }
        if (!kept && r < my_rs) my_rs = r;
        if (dropped && r < my_rd) my_rd = r;
      }
      cb += cnt[q];
      mb += mass[q];
    }
    rs = static_cast<int>(block_reduce(static_cast<u64>(my_rs), MinOp{}, s.u));
    const int rd = static_cast<int>(block_reduce(static_cast<u64>(my_rd), MinOp{}, s.u));
    re = rd > rs ? rd : rs;
    // Cumulative count / mass before ranks rs and re.
    cb = cbase;
    mb = mbase;
#pragma unroll
    for (int q = 0; q < kBinsPerThread; ++q) {
      const int r = threadIdx.x * kBinsPerThread + q;
      if (r < nb) {
        if (r == rs) {
          s.at_cnt[0] = cb;
          s.at_mass[0] = mb;
        }
        if (r == re) {
          s.at_cnt[1] = cb;
          s.at_mass[1] = mb;
        }
      }
      cb += cnt[q];
      mb += mass[q];
    }
    if (threadIdx.x == 0) {
      if (rs >= nb) {
        s.at_cnt[0] = ctot;
        s.at_mass[0] = mtot;
      }
      if (re >= nb) {
        s.at_cnt[1] = ctot;
        s.at_mass[1] = mtot;
      }
    }
    __syncthreads();
    c_rs = s.at_cnt[0];
    m_rs = s.at_mass[0];
    c_re = s.at_cnt[1];
    __syncthreads();
    if (rs == re) break;
    const int b_hi = nb - 1 - rs, b_lo = nb - re;
    new_lo = lo + (static_cast<u64>(b_lo) << shift);
    new_hi = b_hi == nb - 1 ? hi : lo + (static_cast<u64>(b_hi + 1) << shift) - 1;
    // The tolerance may keep the whole range (all of it within 3e-7 Z of the target) or
    // leave too many single keys: decide on the histogram alone then (ties below float
    // rounding of the masses, where no two implementations agree anyway).
    const bool stuck = new_lo == lo && new_hi == hi;
    const bool too_many = shift == 0 && c_re - c_rs > static_cast<u64>(cap);
    if (!(stuck || too_many)) break;
  }
  sel.above_cnt += c_rs;
  sel.above_mass += m_rs;
  if (rs == re) {
    // Every rank before rs kept, every rank from rs on dropped: threshold on a bin edge.
    const u64 edge = rs == 0 ? hi + 1 : lo + (static_cast<u64>(nb - rs) << shift);
    sel.lo = edge;
    sel.hi = edge - 1;
    sel.n = 0;
    return true;
  }
  sel.lo = new_lo;
  sel.hi = new_hi;
  *known = static_cast<long long>(c_re - c_rs);
  return false;
}

// Narrows sel until its range fits the candidate list, then collects and sorts it:
// on return s_keys[0..sel.n) holds the keys in [sel.lo, sel.hi], descending.
// known: keys in the range (-1: unknown, try to collect). hist_first: start with a
// histogram (needed when cr.z must be measured).
__device__ void select(const RowCtx& c, Crit& cr, Sel& sel, long long known, bool hist_first, int cap,
                       uint8_t* region, Scratch& s) {
  u64* s_keys = reinterpret_cast<u64*>(region);
  unsigned* s_hcnt = reinterpret_cast<unsigned*>(region);
  u64* s_hmass = reinterpret_cast<u64*>(region + kBins * 4);
  for (int level = 0; level < 24; ++level) {
    if (!hist_first) {
      if (known >= 0 && sel.above_cnt + static_cast<u64>(known) <= static_cast<u64>(cap)) {
        // Everything from lo up fits: take the kept elements too, so the list is the whole set.
        known += static_cast<long long>(sel.above_cnt);
        sel.hi = kKeyMax;
        sel.above_cnt = 0;
        sel.above_mass = 0;
      }
      if (known < 0 || known <= cap) {
        const int n = collect(c, sel.lo, sel.hi, cap, s_keys, s);
        if (n <= cap) {
          sort_desc(s_keys, n);
          sel.n = n;
          return;
        }
        known = n;
      }
    }
    hist_first = false;
    if (hist_level(c, cr, sel, &known, cap, s_hcnt, s_hmass, s)) return;
  }
  // Not reached (each level shrinks the range 4096-fold); stay memory-safe regardless.
  const int n = collect(c, sel.lo, sel.hi, cap, s_keys, s);
  sel.n = n < cap ? n : cap;
  sort_desc(s_keys, sel.n);
}

// Draw over {key >= thr} of the whole row, thread-major order: thread t's tokens
// t, t + 1024, ... form its segment; the segment holding u * total is rescanned by warp 0.
__device__ int sample_global(const RowCtx& c, u64 thr, float m, double u, Scratch& s) {
  double st = 0.0;
  for (int i = threadIdx.x; i < c.vocab; i += kThreads) {
    const float x = load_x(c, i);
    if (make_key(x, i) >= thr) st += static_cast<double>(expf(x - m));
  }
  double total;
  const double pre = block_exclusive_scan(st, s.d, &total);
  const double target = u * total;
  u64 win = block_reduce(static_cast<u64>(st > 0.0 && pre + st > target ? threadIdx.x : kThreads), MinOp{}, s.u);
  if (win == static_cast<u64>(kThreads))  // u * total rounded up to total: last non-empty segment
    win = block_reduce(static_cast<u64>(st > 0.0 ? threadIdx.x : 0), MaxOp{}, s.u);
  if (threadIdx.x == win) s.d[0] = pre;
  __syncthreads();
  const double rem = target - s.d[0];
  __syncthreads();
  int chosen = -1;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    double run = 0.0;
    int last = -1;
    for (int base = static_cast<int>(win); base < c.vocab; base += 32 * kThreads) {
      const int i = base + lane * kThreads;
      double e = 0.0;
      if (i < c.vocab) {
        const float x = load_x(c, i);
        if (make_key(x, i) >= thr) e = static_cast<double>(expf(x - m));
      }
      double inc = e;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double n = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += n;
      }
      const double seg = __shfl_sync(0xffffffffu, inc, 31);
      const unsigned hit = __ballot_sync(0xffffffffu, e > 0.0 && run + inc > rem);
      const unsigned pos = __ballot_sync(0xffffffffu, e > 0.0);
      if (hit) chosen = base + (__ffs(hit) - 1) * kThreads;
      if (pos) last = base + (31 - __clz(pos)) * kThreads;
      run += seg;
      if (chosen >= 0) break;
    }
    if (chosen < 0) chosen = last;
  }
  return chosen;  // valid in thread 0
}

__global__ void __launch_bounds__(kThreads, 1) sample_kernel(const __grid_constant__ SampleParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ Scratch s;
  uint8_t* region = smem;                                     // list or histogram
  u64* s_keys = reinterpret_cast<u64*>(region);               // [kCandCap]
  double* s_cum = reinterpret_cast<double*>(region + kCandCap * 8);  // [kCandCap]
  unsigned* s_pen = reinterpret_cast<unsigned*>(smem + kRegionBytes);  // [vocab / 32]
  const int row = blockIdx.x, tid = threadIdx.x, vocab = p.vocab;
  const SamplingRow rp = p.rows[row];
  // The logits and the history are earlier kernels' output, and so is the Philox counter (the
  // previous call's): everything below waits (pdl_launch.h).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  if (tid == 0) {
    // Only this thread touches the counter: read, advance, draw u in [0, 1) (53 bits).
    const u64 off = p.rng_offset[row];
    p.rng_offset[row] = off + 1;
    const uint4 r = curand_Philox4x32_10(make_uint4(static_cast<unsigned>(off), static_cast<unsigned>(off >> 32), 0u, 0u),
                                         make_uint2(static_cast<unsigned>(rp.seed), static_cast<unsigned>(rp.seed >> 32)));
    s.rng_u = (static_cast<double>(r.x >> 5) * 67108864.0 + static_cast<double>(r.y >> 6)) * (1.0 / 9007199254740992.0);
  }
  RowCtx c;
  c.logits = p.logits + static_cast<size_t>(row) * static_cast<size_t>(p.logits_ld > 0 ? p.logits_ld : vocab);
  c.pen_bits = nullptr;
  c.penalty = rp.repetition_penalty;
  c.temperature = rp.temperature;
  c.greedy = !(rp.temperature > 0.0f);
  c.vocab = vocab;

  int n_hist = 0;
  if (p.history && p.history_len && rp.repetition_penalty != 1.0f) {
    n_hist = p.history_len[row];
    if (!p.history_off) n_hist = n_hist < p.history_ld ? n_hist : p.history_ld;
  }
  if (n_hist > 0) {
    // Bit per id: a repeated id is penalised once, as with the CPU's set.
    const int words = (vocab + 31) >> 5;
    for (int w = tid; w < words; w += kThreads) s_pen[w] = 0u;
    __syncthreads();
    const int32_t* h = p.history + (p.history_off ? p.history_off[row] : static_cast<int64_t>(row) * p.history_ld);
    for (int j = tid; j < n_hist; j += kThreads) {
      const int id = h[j];
      if (id >= 0 && id < vocab) atomicOr(&s_pen[id >> 5], 1u << (id & 31));
    }
    __syncthreads();
    c.pen_bits = s_pen;
  }

  const bool topk_on = !c.greedy && rp.top_k > 0 && rp.top_k < vocab;
  const bool topp_on = !c.greedy && rp.top_p < 1.0f;
  const bool minp_on = !c.greedy && rp.min_p > 0.0f;
  const bool need_zest = topp_on && !topk_on;

  // Pass A: max key (argmax, lowest id on ties), per-thread max keys, online softmax sum.
  // A thread's logits are loaded kPassA at a time before they are folded in, in the same order
  // (one memory round trip per kPassA of them: 38 -> a few us for a 128k vocabulary at greedy).
  constexpr int kPassA = 8;
  u64 tmax = 0;
  float om = -INFINITY, os = 0.0f;
  const auto fold = [&](float x, int i) {
    const u64 key = make_key(x, i);
    tmax = key > tmax ? key : tmax;
    if (need_zest && x > -INFINITY) {
      if (x > om) {
        os = os * expf(om - x) + 1.0f;
        om = x;
      } else {
        os += expf(x - om);
      }
    }
  };
  int i0 = tid;
  for (; i0 + (kPassA - 1) * kThreads < vocab; i0 += kThreads * kPassA) {  // whole groups: loads, then folds
    float l[kPassA];
#pragma unroll
    for (int k = 0; k < kPassA; ++k) l[k] = __ldg(c.logits + i0 + k * kThreads);
#pragma unroll
    for (int k = 0; k < kPassA; ++k) fold(finish_x(c, l[k], i0 + k * kThreads), i0 + k * kThreads);
  }
  for (; i0 < vocab; i0 += kThreads) fold(load_x(c, i0), i0);
  const u64 kmax = block_reduce(tmax, MaxOp{}, s.u);
  const float m = key_x(kmax);
  if (c.greedy || !(m > -INFINITY) || !(m < INFINITY)) {
    if (tid == 0) {
      p.out[row] = key_id(kmax);
      if (p.debug_threshold) p.debug_threshold[row] = kmax;
    }
    return;
  }
  const double u = s.rng_u;  // written before block_reduce's barrier
  const int cap = p.max_candidates > 0 && p.max_candidates < kCandCap ? p.max_candidates : kCandCap;

  u64 thr = 0;       // kept set = {key >= thr}
  bool covers = false;  // s_keys[0..n_final) is exactly the kept set, s_cum its running mass
  int n_final = 0;
  double z = -1.0;
  bool list_is_topk = false;
  int kp = 0;
  Sel sel{0, kKeyMax, 0, 0, 0};

  // ---- top-k: count boundary; Z_k over the survivors ----
  if (topk_on) {
    const int k = rp.top_k;
    long long known = vocab;
    u64 lo0 = 0;
    if (k <= kThreads) {
      s_keys[tid] = tmax;
      sort_desc(s_keys, kThreads);  // its first barrier publishes the writes
      lo0 = s_keys[k - 1];
      __syncthreads();
      known = -1;
    }
    Crit cr{true, static_cast<u64>(k), false, 1.0, false, 0.0f, 0.0, m};
    sel = Sel{lo0, kmax, 0, 0, 0};
    select(c, cr, sel, known, false, cap, region, s);
    const long long kk = static_cast<long long>(k) - static_cast<long long>(sel.above_cnt);
    kp = static_cast<int>(kk < 0 ? 0 : (kk > sel.n ? sel.n : kk));
    thr = kp > 0 ? s_keys[kp - 1] : sel.hi + 1;
    z = static_cast<double>(sel.above_mass) * kInvFix + list_scan(s_keys, s_cum, kp, m, s);
    list_is_topk = sel.above_cnt == 0;
    covers = list_is_topk;
    n_final = kp;
  }

  // ---- top-p, min-p: mass / value boundary within the top-k survivors ----
  if (topp_on || minp_on) {
    Crit cr{false, 0, topp_on, static_cast<double>(rp.top_p), minp_on, fminf(rp.min_p, 1.0f), z, m};
    if (topk_on && list_is_topk) {
      sel = Sel{thr, kKeyMax, 0, 0, kp};  // candidates and s_cum already in place
    } else {
      long long known = -1;
      bool hist_first = false;
      u64 lo0 = 0;
      if (topk_on) {
        lo0 = thr;
        known = rp.top_k;
      } else {
        hist_first = true;  // measures Z
        float d_cut = INFINITY;
        const double zest = block_reduce(static_cast<double>(os) * exp(static_cast<double>(om - m)), SumOp{}, s.d);
        if (topp_on && 1.0f - rp.top_p > 1e-5f) {
          // Tokens below m - d_cut hold < (1 - top_p) Z / 2 together: never in the nucleus.
          const double eps = (1.0 - static_cast<double>(rp.top_p)) * zest / (2.0 * vocab);
          d_cut = static_cast<float>(-log(eps));
        }
        if (minp_on) d_cut = fminf(d_cut, -logf(cr.min_p) + 0.01f);
        if (d_cut < INFINITY) lo0 = static_cast<u64>(f2ord(m - d_cut)) << 32;
      }
      sel = Sel{lo0, kmax, 0, 0, 0};
      select(c, cr, sel, known, hist_first, cap, region, s);
      list_scan(s_keys, s_cum, sel.n, m, s);
    }
    // The CPU rule, exactly, on the sorted candidates.
    const double above = static_cast<double>(sel.above_mass) * kInvFix;
    int first_fail = sel.n;
    for (int q = 0; q < kCandPerThread; ++q) {
      const int j = tid * kCandPerThread + q;
      if (j >= sel.n) break;
      const double e = exp(static_cast<double>(key_x(s_keys[j]) - m));
      const double before = above + (j > 0 ? s_cum[j - 1] : 0.0);
      bool kept = true;
      if (cr.topp) kept = before / cr.z < cr.top_p;
      if (cr.minp) kept = kept && e / cr.z >= static_cast<double>(cr.min_p) * (1.0 / cr.z);
      if (sel.above_cnt == 0 && j == 0) kept = true;  // the top token always survives
      if (!kept) {
        first_fail = j;
        break;
      }
    }
    const int n_keep = static_cast<int>(block_reduce(static_cast<u64>(first_fail), MinOp{}, s.u));
    thr = n_keep > 0 ? s_keys[n_keep - 1] : sel.hi + 1;
    covers = sel.above_cnt == 0;
    n_final = n_keep;
  }

  // ---- draw ----
  int id;
  if (covers && n_final > 0) {
    const double target = u * s_cum[n_final - 1];
    int first = n_final - 1;
    for (int q = 0; q < kCandPerThread; ++q) {
      const int j = tid * kCandPerThread + q;
      if (j >= n_final) break;
      if (s_cum[j] > target) {
        first = j;
        break;
      }
    }
    const int j = static_cast<int>(block_reduce(static_cast<u64>(first), MinOp{}, s.u));
    id = key_id(s_keys[j]);
  } else {
    id = sample_global(c, thr, m, u, s);
  }
  if (tid == 0) {
    p.out[row] = id;
    if (p.debug_threshold) p.debug_threshold[row] = thr;
  }
}

std::once_flag g_attr_once[64];

}  // namespace

void launch_sample(const SampleParams& p, cudaStream_t stream) {
  if (p.n_rows == 0) return;
  int dev = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  // Opt in to > 48 KiB of dynamic shared memory, once per device (not a stream operation,
  // so it is also safe while a graph is being captured).
  std::call_once(g_attr_once[dev & 63], [] {
    DHS_CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes(kSamplingMaxVocab))));
  });
  launch_pdl(sample_kernel, dim3(static_cast<unsigned>(p.n_rows)), dim3(kThreads), smem_bytes(p.vocab), stream, p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void sample(const SampleParams& p, cudaStream_t stream) {
  require(p.logits && p.rows && p.rng_offset && p.out, "sample: null pointer");
  require(p.n_rows >= 0 && p.vocab > 0 && p.vocab <= kSamplingMaxVocab, "sample: vocab must be in [1, 2^19]");
  require(!p.history || (p.history_len && (p.history_off || p.history_ld > 0)),
          "sample: history needs history_len and history_off or history_ld");
  require(p.logits_ld == 0 || p.logits_ld >= p.vocab, "sample: logits_ld must be 0 or >= vocab");
  require(p.max_candidates >= 0, "sample: max_candidates must be >= 0");
  launch_sample(p, stream);
}

}  // namespace dhs::cuda
