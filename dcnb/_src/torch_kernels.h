// PyTorch's own CPU kernels over generated code's pointers (dcnb/_src/torch_kernels.py builds the library).
#pragma once

#include <cstdint>

extern "C" {
// y = conv(x, w) + b over (N, C, spatial...) with ``rank`` spatial dimensions; b (packed, one per output channel)
// may be null
void dcnb_torch_conv(int is_double, int64_t rank, const int64_t* x_shape, const int64_t* x_strides, const void* x,
                     const int64_t* w_shape, const int64_t* w_strides, const void* w, const void* b,
                     const int64_t* y_shape, const int64_t* y_strides, void* y, const int64_t* stride,
                     const int64_t* pad, const int64_t* dilation, int64_t groups);
// the gradients dx, dw and db (each null where not asked for; dx and dw in x's and w's strides, db packed) from y's
// gradient dy; x (w) may be null where dw (dx) is not asked for
void dcnb_torch_conv_backward(int is_double, int64_t rank, const int64_t* x_shape, const int64_t* x_strides,
                              const void* x, const int64_t* w_shape, const int64_t* w_strides, const void* w,
                              const int64_t* y_shape, const int64_t* y_strides, const void* dy, void* dx, void* dw,
                              void* db, const int64_t* stride, const int64_t* pad, const int64_t* dilation,
                              int64_t groups);
}
