// cblas_sgemm and cblas_dgemm over the Fortran sgemm_ and dgemm_ that PyTorch's CPU library exports (the MKL it
// calls itself on x86-64): what DaCe's BLAS expansions call, where no cblas.h is installed (dcnb/_src/blas.py).
#pragma once

#include <utility>

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };

extern "C" {
void sgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k, const float *alpha,
            const float *a, const int *lda, const float *b, const int *ldb, const float *beta, float *c,
            const int *ldc);
void dgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k, const double *alpha,
            const double *a, const int *lda, const double *b, const int *ldb, const double *beta, double *c,
            const int *ldc);
}

namespace dcnb_blas {

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
    fortran(&opa, &opb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
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
