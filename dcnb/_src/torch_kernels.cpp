// PyTorch's own CPU kernels over generated code's pointers: at::from_blob wraps them without copying, and ATen
// chooses the kernel as eager does (oneDNN's convolutions on x86-64). Built by dcnb/_src/torch_kernels.py.
#include "torch_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>

#include <cstdio>
#include <limits>
#include <optional>
#include <vector>

namespace {

at::TensorOptions options(int is_double) { return at::TensorOptions().dtype(is_double ? at::kDouble : at::kFloat); }

at::Tensor wrap(const void* data, int64_t dims, const int64_t* shape, const int64_t* strides, int is_double) {
    return at::from_blob(const_cast<void*>(data), at::IntArrayRef(shape, dims), at::IntArrayRef(strides, dims),
                         options(is_double));
}

// an operand the call does not read but ATen's signature takes: its shape, no values, in the layout the kernel is
// chosen for
at::Tensor given_or_empty(const void* data, int64_t dims, const int64_t* shape, const int64_t* strides, int is_double,
                          at::MemoryFormat format = at::MemoryFormat::Contiguous) {
    return data ? wrap(data, dims, shape, strides, is_double)
                : at::empty(at::IntArrayRef(shape, dims), options(is_double).memory_format(format));
}

// where ATen refuses (it should not: the expansion checked what it takes), the outputs become NaN, which the check
// against PyTorch then reports, and the reason goes to stderr
void failed(const char* what, std::initializer_list<at::Tensor> outputs) {
    std::fprintf(stderr, "dcnb: PyTorch's convolution failed: %s\n", what);
    for (auto t : outputs)
        if (t.defined()) t.fill_(std::numeric_limits<double>::quiet_NaN());
}

}  // namespace

extern "C" {

void dcnb_torch_conv(int is_double, int64_t rank, const int64_t* x_shape, const int64_t* x_strides, const void* x,
                     const int64_t* w_shape, const int64_t* w_strides, const void* w, const void* b,
                     const int64_t* y_shape, const int64_t* y_strides, void* y, const int64_t* stride,
                     const int64_t* pad, const int64_t* dilation, int64_t groups) {
    c10::InferenceMode no_autograd;
    auto Y = wrap(y, rank + 2, y_shape, y_strides, is_double);
    try {
        auto X = wrap(x, rank + 2, x_shape, x_strides, is_double);
        auto W = wrap(w, rank + 2, w_shape, w_strides, is_double);
        std::optional<at::Tensor> B;
        const int64_t one = 1;
        if (b) B = wrap(b, 1, w_shape, &one, is_double);
        std::vector<int64_t> no_output_padding(rank, 0);
        Y.copy_(at::convolution(X, W, B, at::IntArrayRef(stride, rank), at::IntArrayRef(pad, rank),
                                at::IntArrayRef(dilation, rank), false, no_output_padding, groups));
    } catch (const std::exception& e) {
        failed(e.what(), {Y});
    }
}

void dcnb_torch_conv_backward(int is_double, int64_t rank, const int64_t* x_shape, const int64_t* x_strides,
                              const void* x, const int64_t* w_shape, const int64_t* w_strides, const void* w,
                              const int64_t* y_shape, const int64_t* y_strides, const void* dy, void* dx, void* dw,
                              void* db, const int64_t* stride, const int64_t* pad, const int64_t* dilation,
                              int64_t groups) {
    c10::InferenceMode no_autograd;
    const int64_t one = 1;
    at::Tensor DX, DW, DB;
    if (dx) DX = wrap(dx, rank + 2, x_shape, x_strides, is_double);
    if (dw) DW = wrap(dw, rank + 2, w_shape, w_strides, is_double);
    if (db) DB = wrap(db, 1, w_shape, &one, is_double);
    try {
        // depthwise: oneDNN's backward over channels-last operands (as eager's ConvNeXt-T hands it its permute's
        // output) took eager 16.6 ms against 42.6 over contiguous ones (8x96x56x56, 7x7); the copies cost less
        const bool channels_last = rank == 2 && groups > 1 && groups == x_shape[1];
        const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
        auto X = given_or_empty(x, rank + 2, x_shape, x_strides, is_double, format);
        auto W = given_or_empty(w, rank + 2, w_shape, w_strides, is_double);
        auto DY = wrap(dy, rank + 2, y_shape, y_strides, is_double);
        if (channels_last) {
            if (x) X = X.contiguous(format);  // (an unread placeholder is made so, not copied)
            DY = DY.contiguous(format);
        }
        std::vector<int64_t> no_output_padding(rank, 0), bias{w_shape[0]};
        auto [gx, gw, gb] = at::convolution_backward(
            DY, X, W, db ? at::OptionalIntArrayRef(bias) : std::nullopt, at::IntArrayRef(stride, rank),
            at::IntArrayRef(pad, rank), at::IntArrayRef(dilation, rank), false, no_output_padding, groups,
            {dx != nullptr, dw != nullptr, db != nullptr});
        if (dx) DX.copy_(gx);
        if (dw) DW.copy_(gw);
        if (db) DB.copy_(gb);
    } catch (const std::exception& e) {
        failed(e.what(), {DX, DW, DB});
    }
}
}
