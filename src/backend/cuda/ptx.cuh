// Thin wrappers over the PTX instructions the kernels share (no logic of their own).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace dhs::cuda::ptx {

// c[16x8] += a[16x16] * b[16x8], f16 in, fp32 accumulate (fragments as in the PTX ISA,
// "Matrix Fragments for mma.m16n8k16"): lane = 4 * group + tig; a = {(g, 2tig..+1),
// (g+8, 2tig..+1), (g, 2tig+8..+9), (g+8, 2tig+8..+9)}; b = {(2tig..+1, g), (2tig+8..+9, g)};
// c = {(g, 2tig), (g, 2tig+1), (g+8, 2tig), (g+8, 2tig+1)}.
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c[16x8] += a[16x32] * b[32x8], int8 in, int32 accumulate ("mma.m16n8k32", .s8): a = 4 words
// of 4 bytes {(g, 4tig..+3), (g+8, 4tig..+3), (g, 16+4tig..+3), (g+8, 16+4tig..+3)};
// b = {(4tig..+3, g), (16+4tig..+3, g)}; c as for m16n8k16.
__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x and log2(x) on the special-function unit: relative error about 2^-22, denormal results
// flushed to 0 (ex2(-inf) = 0, lg2(0) = -inf).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// L2 eviction priorities (createpolicy): data streamed once (evict_first) and data a later kernel
// of the step reads back (evict_last), so that a stream of hundreds of MB does not push it out.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void cp_async_16_hint(uint32_t dst, const void* src, int src_bytes, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void st_global_hint(float* addr, float v, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;\n" ::"l"(addr), "f"(v), "l"(pol) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// mbarriers in shared memory (sm_90): init with the arrival count of a phase; wait until the phase
// of the given parity has completed (spins on try_wait); arrive once.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Programmatic dependent launch (sm_90): the next kernel of the stream, launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, may start once every block of this one has
// called launch_dependents (or exited); griddep_wait blocks until the previous kernel has
// completed and its writes are visible (a no-op without such a launch).
__device__ __forceinline__ void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// The GPU's global timer (ns), for benchmark timelines.
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// Benchmark spans: span[0] = min over calls of %globaltimer (first entry), span[1] = max (last exit).
__device__ __forceinline__ void stamp_span(unsigned long long* span, int which) {
  if (span == nullptr) return;
  const unsigned long long ns = globaltimer();
  if (which == 0) atomicMin(span, ns);
  else atomicMax(span + 1, ns);
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_f16x2(__half lo, __half hi) {
  return static_cast<uint32_t>(__half_as_ushort(lo)) | (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
}

}  // namespace dhs::cuda::ptx
