// dcnb: math functions for generated CPU code, installed into every CPU build's global code.
//
// Scalar code: DaCe's tasklets call math functions unqualified (exp(x)); with only <cmath> included, the global
// namespace holds the C functions on double alone, so exp(float) silently promotes to double and calls scalar
// ::exp. The using-declarations below bring std's float overloads into the global namespace (as <math.h> does in
// C++), and the simd declarations tell GCC that glibc's libmvec has vector variants of these functions, so that
// GCC vectorizes loops calling them (glibc declares them so only under -ffast-math, which we do not use: it would
// drop NaN and inf semantics).
//
// Vector code: DaCe's Vectorization emits calls such as exp(dace::vec<float, 8>) but defines no such overloads;
// the overloads further below route them to libmvec where it has a variant for the ISA we compile for, else apply
// the scalar function lane by lane (which GCC still vectorizes for simple functions like sqrt).
#ifndef DCNB_VECMATH_H
#define DCNB_VECMATH_H
#include <cmath>

using std::acos; using std::asin; using std::atan; using std::atan2; using std::cbrt; using std::ceil;
using std::cos; using std::cosh; using std::erf; using std::erfc; using std::exp; using std::exp2;
using std::expm1; using std::fabs; using std::floor; using std::fmax; using std::fmin; using std::fmod;
using std::hypot; using std::log; using std::log10; using std::log1p; using std::log2; using std::pow;
using std::sin; using std::sinh; using std::sqrt; using std::tan; using std::tanh; using std::trunc;

// libmvec's vector-function ABI: b = SSE4 (128-bit), d = AVX2 (256-bit), e = AVX-512 (512-bit)
#if defined(__GLIBC__) && defined(__x86_64__) && !defined(__CUDACC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define DCNB_HAVE_MVEC 1
#endif

#if defined(DCNB_HAVE_MVEC) && defined(__GNUC__) && !defined(__clang__)
#define DCNB_SIMD_DECL(fn) \
    extern "C" __attribute__((simd("notinbranch"))) double fn(double) noexcept; \
    extern "C" __attribute__((simd("notinbranch"))) float fn##f(float) noexcept;
DCNB_SIMD_DECL(exp) DCNB_SIMD_DECL(log) DCNB_SIMD_DECL(tanh) DCNB_SIMD_DECL(log1p) DCNB_SIMD_DECL(expm1)
DCNB_SIMD_DECL(erf) DCNB_SIMD_DECL(erfc) DCNB_SIMD_DECL(sin) DCNB_SIMD_DECL(cos) DCNB_SIMD_DECL(exp2)
DCNB_SIMD_DECL(log2) DCNB_SIMD_DECL(sinh) DCNB_SIMD_DECL(cosh) DCNB_SIMD_DECL(atan)
#endif

#define DCNB_LANES(T, N, fn, sfn)                                      \
    static inline dace::vec<T, N> fn(dace::vec<T, N> x) {              \
        dace::vec<T, N> r;                                             \
        for (int i = 0; i < N; ++i) r[i] = sfn(x[i]);                  \
        return r;                                                      \
    }
#define DCNB_LANES2(T, N, fn, sfn)                                                \
    static inline dace::vec<T, N> fn(dace::vec<T, N> x, dace::vec<T, N> y) {      \
        dace::vec<T, N> r;                                                        \
        for (int i = 0; i < N; ++i) r[i] = sfn(x[i], y[i]);                       \
        return r;                                                                 \
    }                                                                             \
    static inline dace::vec<T, N> fn(dace::vec<T, N> x, T y) {                    \
        dace::vec<T, N> r;                                                        \
        for (int i = 0; i < N; ++i) r[i] = sfn(x[i], y);                          \
        return r;                                                                 \
    }                                                                             \
    static inline dace::vec<T, N> fn(T x, dace::vec<T, N> y) {                    \
        dace::vec<T, N> r;                                                        \
        for (int i = 0; i < N; ++i) r[i] = sfn(x, y[i]);                          \
        return r;                                                                 \
    }
#define DCNB_MVEC(T, N, fn, sym)                                                  \
    extern "C" dace::vec<T, N> sym(dace::vec<T, N>);                              \
    static inline dace::vec<T, N> fn(dace::vec<T, N> x) { return sym(x); }

#define DCNB_UNARY(T, N)                                              \
    DCNB_UNARY_MVEC(T, N)                                             \
    DCNB_LANES(T, N, sqrt, std::sqrt)                                 \
    DCNB_LANES(T, N, fabs, std::fabs)                                 \
    DCNB_LANES(T, N, abs, std::fabs)                                  \
    DCNB_LANES(T, N, floor, std::floor)                               \
    DCNB_LANES(T, N, ceil, std::ceil)                                 \
    DCNB_LANES(T, N, round, std::round)                               \
    DCNB_LANES2(T, N, max, std::fmax)                                 \
    DCNB_LANES2(T, N, min, std::fmin)                                 \
    DCNB_LANES2(T, N, fmax, std::fmax)                                \
    DCNB_LANES2(T, N, fmin, std::fmin)                                \
    DCNB_LANES2(T, N, pow, std::pow)

#define DCNB_FUNCS(X, T, W, isa, s)                                              \
    X(T, W, exp, _ZGV##isa##N##W##v_exp##s) X(T, W, log, _ZGV##isa##N##W##v_log##s)   \
    X(T, W, tanh, _ZGV##isa##N##W##v_tanh##s) X(T, W, log1p, _ZGV##isa##N##W##v_log1p##s) \
    X(T, W, expm1, _ZGV##isa##N##W##v_expm1##s) X(T, W, erf, _ZGV##isa##N##W##v_erf##s) \
    X(T, W, sin, _ZGV##isa##N##W##v_sin##s) X(T, W, cos, _ZGV##isa##N##W##v_cos##s)   \
    X(T, W, exp2, _ZGV##isa##N##W##v_exp2##s) X(T, W, log2, _ZGV##isa##N##W##v_log2##s) \
    X(T, W, erfc, _ZGV##isa##N##W##v_erfc##s) X(T, W, sinh, _ZGV##isa##N##W##v_sinh##s) \
    X(T, W, cosh, _ZGV##isa##N##W##v_cosh##s) X(T, W, atan, _ZGV##isa##N##W##v_atan##s)

#define DCNB_LANES_AS_MVEC(T, N, fn, sym) DCNB_LANES(T, N, fn, std::fn)

// Pick, per (type, width), libmvec when this ISA has that variant, lanes otherwise.
#define DCNB_UNARY_MVEC(T, N) DCNB_UNARY_MVEC_##T##_##N
#if defined(DCNB_HAVE_MVEC)
#define DCNB_UNARY_MVEC_float_4 DCNB_FUNCS(DCNB_MVEC, float, 4, b, f)
#define DCNB_UNARY_MVEC_double_2 DCNB_FUNCS(DCNB_MVEC, double, 2, b, )
#else
#define DCNB_UNARY_MVEC_float_4 DCNB_FUNCS(DCNB_LANES_AS_MVEC, float, 4, b, f)
#define DCNB_UNARY_MVEC_double_2 DCNB_FUNCS(DCNB_LANES_AS_MVEC, double, 2, b, )
#endif
#if defined(DCNB_HAVE_MVEC) && defined(__AVX2__)
#define DCNB_UNARY_MVEC_float_8 DCNB_FUNCS(DCNB_MVEC, float, 8, d, f)
#define DCNB_UNARY_MVEC_double_4 DCNB_FUNCS(DCNB_MVEC, double, 4, d, )
#else
#define DCNB_UNARY_MVEC_float_8 DCNB_FUNCS(DCNB_LANES_AS_MVEC, float, 8, d, f)
#define DCNB_UNARY_MVEC_double_4 DCNB_FUNCS(DCNB_LANES_AS_MVEC, double, 4, d, )
#endif
#if defined(DCNB_HAVE_MVEC) && defined(__AVX512F__)
#define DCNB_UNARY_MVEC_float_16 DCNB_FUNCS(DCNB_MVEC, float, 16, e, f)
#define DCNB_UNARY_MVEC_double_8 DCNB_FUNCS(DCNB_MVEC, double, 8, e, )
#else
#define DCNB_UNARY_MVEC_float_16 DCNB_FUNCS(DCNB_LANES_AS_MVEC, float, 16, e, f)
#define DCNB_UNARY_MVEC_double_8 DCNB_FUNCS(DCNB_LANES_AS_MVEC, double, 8, e, )
#endif
#define DCNB_UNARY_MVEC_float_2 DCNB_FUNCS(DCNB_LANES_AS_MVEC, float, 2, b, f)
#define DCNB_UNARY_MVEC_double_16 DCNB_FUNCS(DCNB_LANES_AS_MVEC, double, 16, e, )

DCNB_UNARY(float, 2)
DCNB_UNARY(float, 4)
DCNB_UNARY(float, 8)
DCNB_UNARY(float, 16)
DCNB_UNARY(double, 2)
DCNB_UNARY(double, 4)
DCNB_UNARY(double, 8)
DCNB_UNARY(double, 16)

#endif  // DCNB_VECMATH_H
