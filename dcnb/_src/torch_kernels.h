// PyTorch's own CPU kernels over generated code's pointers (dcnb/_src/torch_kernels.py builds the library).
#pragma once

#include <cstdint>

extern "C" {
// y = conv(x, w) + b over (N, C, spatial...) with ``rank`` spatial dimensions; b (packed, one per output channel)
// may be null; ``pad`` holds the pads before each spatial dimension, then those after it
void dcnb_torch_conv(int is_double, int64_t rank, const int64_t* x_shape, const int64_t* x_strides, const void* x,
                     const int64_t* w_shape, const int64_t* w_strides, const void* w, const void* b,
                     const int64_t* y_shape, const int64_t* y_strides, void* y, const int64_t* stride,
                     const int64_t* pad, const int64_t* dilation, int64_t groups);
// the gradients dx, dw and db (each null where not asked for; dx and dw in x's and w's strides, db packed) from y's
// gradient dy; x (w) may be null where dw (dx) is not asked for; ``pad`` as dcnb_torch_conv's
void dcnb_torch_conv_backward(int is_double, int64_t rank, const int64_t* x_shape, const int64_t* x_strides,
                              const void* x, const int64_t* w_shape, const int64_t* w_strides, const void* w,
                              const int64_t* y_shape, const int64_t* y_strides, const void* dy, void* dx, void* dw,
                              void* db, const int64_t* stride, const int64_t* pad, const int64_t* dilation,
                              int64_t groups);
// ``batch`` column-major products C_i = alpha op(A_i) op(B_i) + beta C_i in float, A_i at a + i * stride_a (a
// stride of 0: one matrix for all), as BLAS's sgemm takes them, through oneDNN's matmul; 0 where done, else nonzero
// (C untouched: the caller's BLAS runs instead)
int dcnb_torch_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                     int64_t ldc, int64_t stride_c, int64_t batch);
}
