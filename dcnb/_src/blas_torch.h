// cblas_sgemm and cblas_dgemm over the Fortran sgemm_ and dgemm_ that PyTorch's CPU library exports (the MKL it
// calls itself on x86-64): what DaCe's BLAS expansions call, where no cblas.h is installed (dcnb/_src/blas.py);
// and a strided batch of products over MKL's sgemm_batch_ and dgemm_batch_, where the library exports them.
// With DCNB_ONEDNN_PRODUCTS defined (blas_onednn.h), float products of at least ONEDNN_FROM multiply-adds run
// through oneDNN's matmul inside PyTorch instead (torch_kernels.cpp), MKL's the rest.
#pragma once

#include <utility>
#include <vector>

#ifdef DCNB_ONEDNN_PRODUCTS
#include "torch_kernels.h"
#endif

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };

extern "C" {
void sgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k, const float *alpha,
            const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
            const int *ldc);
void dgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k, const double *alpha,
            const double *a, const int *lda, const double *b, const int *ldb, const double *beta, double *c,
            const int *ldc);
// only called where PyTorch's BLAS exports them (blas.py); a strong reference, so that the linker keeps the library
// (with --as-needed it drops one that only weak references name: the call then jumped to address 0)
void sgemm_batch_(const char *transa, const char *transb, const int *m, const int *n, const int *k, const float *alpha,
                  const float **a, const int *lda, const float **b, const int *ldb, const float *beta, float **c,
                  const int *ldc, const int *group_count, const int *group_size);
void dgemm_batch_(const char *transa, const char *transb, const int *m, const int *n, const int *k, const double *alpha,
                  const double **a, const int *lda, const double **b, const int *ldb, const double *beta, double **c,
                  const int *ldc, const int *group_count, const int *group_size);
}

namespace dcnb_blas {

// below about 128x128x128, oneDNN's call costs more than MKL's product (12 us against 1 at 8x32x32; even at
// 128x128x128; 0.45x MKL's time from 256x256x256 on an AVX-512 AMD EPYC: benchmarks/NOTES.md, BLAS)
constexpr long ONEDNN_FROM = 1L << 21;

// the float product in column-major terms through oneDNN, where DCNB_ONEDNN_PRODUCTS and it is large enough;
// false where MKL's is to run
inline bool by_onednn(char opa, char opb, int m, int n, int k, float alpha, const float *a, int lda, long stride_a,
                      const float *b, int ldb, long stride_b, float beta, float *c, int ldc, long stride_c,
                      int batch) {
#ifdef DCNB_ONEDNN_PRODUCTS
    if (long(m) * n * k * batch < ONEDNN_FROM) return false;
    return dcnb_torch_sgemm(opa != 'N', opb != 'N', m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                            stride_c, batch) == 0;
#else
    return false;
#endif
}
inline bool by_onednn(char, char, int, int, int, double, const double *, int, long, const double *, int, long, double,
                      double *, int, long, int) {
    return false;
}

template <typename T, typename Gemm>
inline void gemm(Gemm fortran, CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                 T alpha, const T *a, int lda, const T *b, int ldb, T beta, T *c, int ldc) {
    auto op = [](CBLAS_TRANSPOSE t) { return t == CblasNoTrans ? 'N' : 'T'; };
    char opa = op(ta), opb = op(tb);
    if (order == CblasRowMajor) {  // C = op(A) op(B) row-major is C^T = op(B)^T op(A)^T column-major
        std::swap(opa, opb);
        std::swap(m, n);
        std::swap(a, b);
        std::swap(lda, ldb);
    }
    if (by_onednn(opa, opb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1)) return;
    fortran(&opa, &opb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

// ``batch`` column-major products C_i = op(A_i) op(B_i) (alpha, beta), A_i at a + i * stride_a (a stride of 0:
// one matrix for all), in one call: MKL spreads the batch over its threads, as eager's bmm has it do, where a loop
// of GEMMs runs each small product on all threads in turn
template <typename T, typename Batch>
inline void gemm_batched(Batch fortran, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, T alpha,
                         const T *a, int lda, long stride_a, const T *b, int ldb, long stride_b, T beta, T *c,
                         int ldc, long stride_c, int batch) {
    char opa = ta == CblasNoTrans ? 'N' : 'T', opb = tb == CblasNoTrans ? 'N' : 'T';
    if (by_onednn(opa, opb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch)) return;
    std::vector<const T *> as(batch), bs(batch);
    std::vector<T *> cs(batch);
    for (int i = 0; i < batch; ++i) {
        as[i] = a + i * stride_a;
        bs[i] = b + i * stride_b;
        cs[i] = c + i * stride_c;
    }
    const int groups = 1;
    fortran(&opa, &opb, &m, &n, &k, &alpha, as.data(), &lda, bs.data(), &ldb, &beta, cs.data(), &ldc, &groups,
            &batch);
}

}  // namespace dcnb_blas

inline void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    dcnb_blas::gemm(sgemm_, order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void cblas_dgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                        const double *a, int lda, const double *b, int ldb, double beta, double *c, int ldc) {
    dcnb_blas::gemm(dgemm_, order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void dcnb_gemm_batched(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float *a,
                              int lda, long stride_a, const float *b, int ldb, long stride_b, float beta, float *c,
                              int ldc, long stride_c, int batch) {
    dcnb_blas::gemm_batched(sgemm_batch_, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                            stride_c, batch);
}

inline void dcnb_gemm_batched(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                              const double *a, int lda, long stride_a, const double *b, int ldb, long stride_b,
                              double beta, double *c, int ldc, long stride_c, int batch) {
    dcnb_blas::gemm_batched(dgemm_batch_, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                            stride_c, batch);
}
