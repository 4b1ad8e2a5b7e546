// PyTorch's own CPU kernels over generated code's pointers: at::from_blob wraps them without copying, and ATen
// chooses the kernel as eager does (oneDNN's convolutions on x86-64). Built by dcnb/_src/torch_kernels.py.
#include "torch_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <optional>
#include <vector>

// ATen's oneDNN matmul (result = beta result + alpha mat1 mat2, over 2-d or 3-d strided tensors), which ATen itself
// runs for reduced-precision products and not for float ones (MKL's GEMM runs those): not in its installed headers
namespace at::native {
void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& result, float beta, float alpha);
}

namespace {

at::TensorOptions options(int is_double) { return at::TensorOptions().dtype(is_double ? at::kDouble : at::kFloat); }

at::Tensor wrap(const void* data, int64_t dims, const int64_t* shape, const int64_t* strides, int is_double) {
    return at::from_blob(const_cast<void*>(data), at::IntArrayRef(shape, dims), at::IntArrayRef(strides, dims),
                         options(is_double));
}

// an operand the call does not read but ATen's signature takes: its shape, no values
at::Tensor given_or_empty(const void* data, int64_t dims, const int64_t* shape, const int64_t* strides, int is_double) {
    return data ? wrap(data, dims, shape, strides, is_double)
                : at::empty(at::IntArrayRef(shape, dims), options(is_double));
}

// whether a 4-d operand is laid out channels-last (the channels_last action's images), not merely both ways (an
// image of one pixel)
bool channels_last(const at::Tensor& t) {
    return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// a convolution's pads as ATen takes them: as many at both ends of a dimension (the fewer of its two), and the zeros
// added to the input beforehand where the two differ (TensorFlow's SAME at stride 2 pads one more at the end);
// ``pad`` holds the leading pads, then the trailing ones
struct Padding {
    std::vector<int64_t> even, before, after;
    bool uneven = false;

    Padding(int64_t rank, const int64_t* pad) {
        for (int64_t d = 0; d < rank; ++d) {
            even.push_back(std::min(pad[d], pad[rank + d]));
            before.push_back(pad[d] - even[d]);
            after.push_back(pad[rank + d] - even[d]);
            uneven = uneven || pad[d] != pad[rank + d];
        }
    }

    // x's shape padded
    std::vector<int64_t> shape(int64_t dims, const int64_t* x_shape) const {
        std::vector<int64_t> shape(x_shape, x_shape + dims);
        for (size_t d = 0; d < even.size(); ++d) shape[2 + d] += before[d] + after[d];
        return shape;
    }

    // x, where the pads are uneven padded into a new tensor laid out ``format`` (one copy, whatever x's layout)
    at::Tensor padded(const at::Tensor& x, at::MemoryFormat format) const {
        if (!uneven) return x;
        auto out = at::zeros(shape(x.dim(), x.sizes().data()), x.options().memory_format(format));
        auto inside = out;
        for (size_t d = 0; d < even.size(); ++d) inside = inside.narrow(2 + d, before[d], x.size(2 + d));
        inside.copy_(x);
        return out;
    }

    // x's gradient from the padded input's
    at::Tensor cropped(at::Tensor gx, const int64_t* x_shape) const {
        for (size_t d = 0; uneven && d < even.size(); ++d) gx = gx.narrow(2 + d, before[d], x_shape[2 + d]);
        return gx;
    }
};

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
        const Padding padding(rank, pad);
        auto X = wrap(x, rank + 2, x_shape, x_strides, is_double);
        X = padding.padded(X, X.suggest_memory_format());
        // an input of PyTorch's layout into a channels-last image (a network's first convolution): ATen picks its
        // kernel by the input's layout, and the copy costs less than computing (N, C, H, W) and transposing it
        if (channels_last(Y) && !channels_last(X)) X = X.contiguous(at::MemoryFormat::ChannelsLast);
        auto W = wrap(w, rank + 2, w_shape, w_strides, is_double);
        std::optional<at::Tensor> B;
        const int64_t one = 1;
        if (b) B = wrap(b, 1, w_shape, &one, is_double);
        std::vector<int64_t> no_output_padding(rank, 0);
        Y.copy_(at::convolution(X, W, B, at::IntArrayRef(stride, rank), padding.even,
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
        // output) took eager 16.6 ms against 42.6 over contiguous ones (8x96x56x56, 7x7); the copies cost less. So
        // where one image is channels-last and the other not (ResNet-50's first convolution, whose input is the
        // model's, 8x3x224x224: 131 ms backward computed (N, C, H, W) from a channels-last gradient)
        auto DY = wrap(dy, rank + 2, y_shape, y_strides, is_double);
        const bool depthwise = rank == 2 && groups > 1 && groups == x_shape[1];
        const bool last = depthwise || channels_last(DY) ||
                          (x && channels_last(wrap(x, rank + 2, x_shape, x_strides, is_double)));
        const auto format = last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
        const Padding padding(rank, pad);
        // the input padded, or an unread placeholder of its padded shape in the layout the kernel is chosen for
        auto X = x ? padding.padded(wrap(x, rank + 2, x_shape, x_strides, is_double), format)
                   : at::empty(padding.shape(rank + 2, x_shape), options(is_double).memory_format(format));
        auto W = given_or_empty(w, rank + 2, w_shape, w_strides, is_double);
        if (last) {
            if (x) X = X.contiguous(format);
            DY = DY.contiguous(format);
        }
        std::vector<int64_t> no_output_padding(rank, 0), bias{w_shape[0]};
        auto [gx, gw, gb] = at::convolution_backward(
            DY, X, W, db ? at::OptionalIntArrayRef(bias) : std::nullopt, at::IntArrayRef(stride, rank), padding.even,
            at::IntArrayRef(dilation, rank), false, no_output_padding, groups,
            {dx != nullptr, dw != nullptr, db != nullptr});
        if (dx) DX.copy_(padding.cropped(gx, x_shape));
        if (dw) DW.copy_(gw);
        if (db) DB.copy_(gb);
    } catch (const std::exception& e) {
        failed(e.what(), {DX, DW, DB});
    }
}

int dcnb_torch_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                     int64_t ldc, int64_t stride_c, int64_t batch) {
    c10::InferenceMode no_autograd;
    // a column-major matrix is its transpose row-major: C^T = op(B)^T op(A)^T, each operand a strided view; an
    // operand one matrix for all (stride 0) is a batch of one, which oneDNN broadcasts
    auto view = [batch](const float* data, bool transposed, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
        std::vector<int64_t> shape{rows, cols}, strides{transposed ? 1 : ld, transposed ? ld : 1};
        if (batch > 1) {
            shape.insert(shape.begin(), stride == 0 ? 1 : batch);
            strides.insert(strides.begin(), stride == 0 ? rows * cols : stride);
        }
        return at::from_blob(const_cast<float*>(data), shape, strides, at::kFloat);
    };
    try {
        auto BT = view(b, trans_b != 0, n, k, ldb, stride_b);
        auto AT = view(a, trans_a != 0, k, m, lda, stride_a);
        auto CT = view(c, false, n, m, ldc, stride_c);
        at::native::mkldnn_matmul(BT, AT, CT, beta, alpha);
        return 0;
    } catch (const std::exception& e) {
        static std::atomic<bool> said{false};
        if (!said.exchange(true))
            std::fprintf(stderr, "dcnb: oneDNN's matmul failed, MKL's GEMM runs instead: %s\n", e.what());
        return 1;
    }
}
}
