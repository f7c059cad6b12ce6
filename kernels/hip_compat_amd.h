// hip_compat_amd.h: hip_compat.h's section shared by every AMD path (bare clang, hipcc, hiprtc).
// Included by hip_compat.h only (the doc of what a kernel may use is there).
#pragma once

// ------------------------------------------------------------------------------------------------
// Shared by every AMD path.
// ------------------------------------------------------------------------------------------------
// Wave64 on GCN/CDNA (gfx9: gfx90a, gfx942 ...), wave32 on RDNA (gfx10, gfx11, gfx12). clang no longer
// predefines the wavefront size, and __builtin_amdgcn_wavefrontsize() is not a constant expression, so
// the size comes from the target family; rf_check_wave_size() (folded away when right) traps if a build
// forced the other mode (-mwavefrontsize64) without -DRF_WARP_SIZE.
#if defined(RF_WARP_SIZE)
#define WARP_SIZE RF_WARP_SIZE
#elif defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__)
#define WARP_SIZE 32
#else
#define WARP_SIZE 64
#endif

// Four int8 products summed into c (signed bytes): v_dot4_i32_iu8 with both operands signed on RDNA3/4,
// v_dot4(c)_i32_i8 on CDNA and RDNA2.
static __device__ __forceinline__ int rf_dp4a(int a, int b, int c) {
#if defined(__GFX11__) || defined(__GFX12__)
  return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#else
  return __builtin_amdgcn_sdot4(a, b, c, false);
#endif
}
static __device__ __forceinline__ unsigned int rf_float_as_uint(float f) { return __builtin_bit_cast(unsigned int, f); }
static __device__ __forceinline__ float rf_uint_as_float(unsigned int u) { return __builtin_bit_cast(float, u); }
static __device__ __forceinline__ float rf_f16_to_float(unsigned short bits) {
  return (float)__builtin_bit_cast(_Float16, bits);
}
static __device__ __forceinline__ unsigned short rf_float_to_f16(float f) {
  return __builtin_bit_cast(unsigned short, (_Float16)f);
}
// As the NVIDIA section's: v_perm_b32 takes one selector byte per result byte, prmt one nibble (the
// conversion folds away for the constant selectors the kernels pass).
static __device__ __forceinline__ unsigned int rf_byte_perm(unsigned int lo, unsigned int hi, unsigned int selector) {
  const unsigned int bytes = (selector & 7u) | ((selector >> 4) & 7u) << 8 | ((selector >> 8) & 7u) << 16 |
                             ((selector >> 12) & 7u) << 24;
  return __builtin_amdgcn_perm(hi, lo, bytes);
}
typedef _Float16 rf_half2 __attribute__((ext_vector_type(2)));
static __device__ __forceinline__ rf_half2 rf_as_h2(unsigned int w) { return __builtin_bit_cast(rf_half2, w); }
static __device__ __forceinline__ unsigned int rf_h2_fma(unsigned int a, unsigned int b, unsigned int c) {
  return __builtin_bit_cast(unsigned int, __builtin_elementwise_fma(rf_as_h2(a), rf_as_h2(b), rf_as_h2(c)));
}
static __device__ __forceinline__ unsigned int rf_h2_mul(unsigned int a, unsigned int b) {
  return __builtin_bit_cast(unsigned int, rf_as_h2(a) * rf_as_h2(b));
}
static __device__ __forceinline__ unsigned int rf_h2_sub(unsigned int a, unsigned int b) {
  return __builtin_bit_cast(unsigned int, rf_as_h2(a) - rf_as_h2(b));
}
static __device__ __forceinline__ unsigned int rf_floats_to_h2(float lo, float hi) {
  return __builtin_bit_cast(unsigned int, rf_half2{(_Float16)lo, (_Float16)hi});
}

// Matrix cores: MFMA on CDNA, WMMA on RDNA3 and RDNA4 (the builtins of LLVM's BuiltinsAMDGPU.def),
// none on RDNA2 (gfx1030) and older GCN.
#if defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || \
    defined(__gfx950__)
#define RF_MMA_KIND RF_MMA_CDNA_MFMA
#elif defined(__GFX11__)
#define RF_MMA_KIND RF_MMA_RDNA3_WMMA
#elif defined(__GFX12__)
#define RF_MMA_KIND RF_MMA_RDNA4_WMMA
#endif
typedef _Float16 rf_half4 __attribute__((ext_vector_type(4)));
typedef _Float16 rf_half8 __attribute__((ext_vector_type(8)));
typedef _Float16 rf_half16 __attribute__((ext_vector_type(16)));
typedef float rf_floatx4 __attribute__((ext_vector_type(4)));
typedef float rf_floatx8 __attribute__((ext_vector_type(8)));
