// cuBLAS and cuDNN for CUDA builds without their headers or a link to them: the few types, enumerators and
// prototypes generated code uses (values from cublas_api.h of CUDA 12/13 and cuDNN 9's cudnn_graph.h, cudnn_cnn.h
// and cudnn_ops.h), each function resolved with dlsym at first use from the copy PyTorch's CUDA build loaded into
// the process (dcnb/_src/gpu_libs.py, docs/gpu.md).
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <vector>

// --- cuBLAS (cublas_api.h) ---------------------------------------------------------------------------------------
typedef struct cublasContext *cublasHandle_t;
enum cublasStatus_t : int { CUBLAS_STATUS_SUCCESS = 0 };
enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes);
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc);
cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const double *alpha, const double *A, int lda, const double *B, int ldb,
                              const double *beta, double *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb, long long strideB,
                                         const float *beta, float *C, int ldc, long long strideC, int batchCount);
cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const double *alpha, const double *A, int lda,
                                         long long strideA, const double *B, int ldb, long long strideB,
                                         const double *beta, double *C, int ldc, long long strideC, int batchCount);
}

// --- cuDNN 9 (cudnn_graph.h, cudnn_cnn.h, cudnn_ops.h) -----------------------------------------------------------
typedef struct cudnnContext *cudnnHandle_t;
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct *cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct *cudnnConvolutionDescriptor_t;
typedef struct cudnnPoolingStruct *cudnnPoolingDescriptor_t;
enum cudnnStatus_t : int { CUDNN_STATUS_SUCCESS = 0 };
enum cudnnDataType_t : int { CUDNN_DATA_FLOAT = 0, CUDNN_DATA_DOUBLE = 1 };
enum cudnnTensorFormat_t : int { CUDNN_TENSOR_NCHW = 0 };
enum cudnnConvolutionMode_t : int { CUDNN_CONVOLUTION = 0, CUDNN_CROSS_CORRELATION = 1 };
enum cudnnMathType_t : int { CUDNN_DEFAULT_MATH = 0, CUDNN_TENSOR_OP_MATH = 1, CUDNN_FMA_MATH = 3 };
enum cudnnDeterminism_t : int { CUDNN_NON_DETERMINISTIC = 0, CUDNN_DETERMINISTIC = 1 };
enum cudnnNanPropagation_t : int { CUDNN_NOT_PROPAGATE_NAN = 0, CUDNN_PROPAGATE_NAN = 1 };
enum cudnnPoolingMode_t : int {
    CUDNN_POOLING_MAX = 0,
    CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1,
    CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2,
    CUDNN_POOLING_MAX_DETERMINISTIC = 3,
};
typedef int cudnnConvolutionFwdAlgo_t, cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdFilterAlgo_t;

// the three cudnnConvolution*AlgoPerf_t share this layout
template <typename Algo>
struct cudnnAlgoPerf {
    Algo algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t mathType;
    int reserved[3];
};
typedef cudnnAlgoPerf<cudnnConvolutionFwdAlgo_t> cudnnConvolutionFwdAlgoPerf_t;
typedef cudnnAlgoPerf<cudnnConvolutionBwdDataAlgo_t> cudnnConvolutionBwdDataAlgoPerf_t;
typedef cudnnAlgoPerf<cudnnConvolutionBwdFilterAlgo_t> cudnnConvolutionBwdFilterAlgoPerf_t;

extern "C" {
cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream);
const char *cudnnGetErrorString(cudnnStatus_t status);
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *desc);
cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t desc, cudnnDataType_t dataType, int nbDims,
                                         const int dimA[], const int strideA[]);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *desc);
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int nbDims, const int filterDimA[]);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *desc);
cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t desc, int arrayLength, const int padA[],
                                              const int filterStrideA[], const int dilationA[],
                                              cudnnConvolutionMode_t mode, cudnnDataType_t computeType);
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t desc, int groupCount);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t mathType);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc);
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, cudnnTensorDescriptor_t srcDesc,
                                                     cudnnFilterDescriptor_t filterDesc,
                                                     cudnnConvolutionDescriptor_t convDesc,
                                                     cudnnTensorDescriptor_t destDesc, int requestedAlgoCount,
                                                     int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults);
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, cudnnTensorDescriptor_t xDesc,
                                                      cudnnFilterDescriptor_t wDesc,
                                                      cudnnConvolutionDescriptor_t convDesc,
                                                      cudnnTensorDescriptor_t yDesc, cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *sizeInBytes);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha, cudnnTensorDescriptor_t xDesc,
                                      const void *x, cudnnFilterDescriptor_t wDesc, const void *w,
                                      cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
                                      cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, cudnnFilterDescriptor_t filterDesc,
                                                          cudnnTensorDescriptor_t diffDesc,
                                                          cudnnConvolutionDescriptor_t convDesc,
                                                          cudnnTensorDescriptor_t gradDesc, int requestedAlgoCount,
                                                          int *returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perfResults);
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, cudnnFilterDescriptor_t wDesc,
                                                           cudnnTensorDescriptor_t dyDesc,
                                                           cudnnConvolutionDescriptor_t convDesc,
                                                           cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha, cudnnFilterDescriptor_t wDesc,
                                           const void *w, cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
                                           cudnnTensorDescriptor_t dxDesc, void *dx);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, cudnnTensorDescriptor_t srcDesc,
                                                            cudnnTensorDescriptor_t diffDesc,
                                                            cudnnConvolutionDescriptor_t convDesc,
                                                            cudnnFilterDescriptor_t gradDesc, int requestedAlgoCount,
                                                            int *returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perfResults);
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, cudnnTensorDescriptor_t xDesc,
                                                             cudnnTensorDescriptor_t dyDesc,
                                                             cudnnConvolutionDescriptor_t convDesc,
                                                             cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                                             size_t *sizeInBytes);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha, cudnnTensorDescriptor_t xDesc,
                                             const void *x, cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                             size_t workSpaceSizeInBytes, const void *beta,
                                             cudnnFilterDescriptor_t dwDesc, void *dw);
cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha, cudnnTensorDescriptor_t aDesc, const void *A,
                             const void *beta, cudnnTensorDescriptor_t cDesc, void *C);
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *desc);
cudnnStatus_t cudnnSetPoolingNdDescriptor(cudnnPoolingDescriptor_t desc, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t maxpoolingNanOpt, int nbDims,
                                          const int windowDimA[], const int paddingA[], const int strideA[]);
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t desc);
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
                                  cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                  cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
                                   cudnnTensorDescriptor_t yDesc, const void *y, cudnnTensorDescriptor_t dyDesc,
                                   const void *dy, cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
                                   cudnnTensorDescriptor_t dxDesc, void *dx);
}

namespace dcnb_gpu {

// The copy of a library the process has loaded (PyTorch's), else whatever dlopen finds; null where neither.
inline void *library(const char *const *sonames) {
    for (const char *const *name = sonames; *name; ++name)
        if (void *handle = dlopen(*name, RTLD_NOW | RTLD_NOLOAD)) return handle;
    for (const char *const *name = sonames; *name; ++name)
        if (void *handle = dlopen(*name, RTLD_NOW | RTLD_LOCAL)) return handle;
    return nullptr;
}

inline void *cublas_library() {
    static const char *const sonames[] = {"libcublas.so.13", "libcublas.so.12", nullptr};
    static void *handle = library(sonames);
    return handle;
}

inline void *cudnn_library() {
    static const char *const sonames[] = {"libcudnn.so.9", nullptr};
    static void *handle = library(sonames);
    return handle;
}

inline void *symbol(void *library, const char *soname, const char *name) {
    void *found = library ? dlsym(library, name) : nullptr;
    if (!found)
        std::fprintf(stderr,
                     "dcnb: %s is not loaded in this process (%s); import a CUDA build of PyTorch before "
                     "calling a CUDA build of dcnb\n",
                     name, library ? "the library lacks it" : soname);
    return found;
}

// ``call(FN, args...)``: FN resolved once, then called; a missing function reads as a failed call (status 1)
#define DCNB_CUBLAS(FN, ...) \
    dcnb_gpu::call<decltype(&::FN)>(dcnb_gpu::cublas_library, "libcublas.so.13/12", #FN, __VA_ARGS__)
#define DCNB_CUDNN(FN, ...) dcnb_gpu::call<decltype(&::FN)>(dcnb_gpu::cudnn_library, "libcudnn.so.9", #FN, __VA_ARGS__)

template <typename F>
struct Resolved {
    static F get(void *(*library)(), const char *soname, const char *name) {
        static F function = reinterpret_cast<F>(symbol(library(), soname, name));
        return function;
    }
};

template <typename F, typename... Args>
inline int call(void *(*library)(), const char *soname, const char *name, Args... args) {
    F function = Resolved<F>::get(library, soname, name);
    if (!function) return 1;
    int status = static_cast<int>(function(args...));
    if (status != 0) std::fprintf(stderr, "dcnb: %s failed with status %d\n", name, status);
    return status;
}

// --- cuBLAS ------------------------------------------------------------------------------------------------------

// One handle per loaded binary (a field of its state), created at load and bound to the calling stream on every
// call; with a workspace of its own, so that no call allocates (a call captured into a CUDA graph must not).
struct Cublas {
    static constexpr size_t WORKSPACE_BYTES = size_t(32) << 20;  // what cuBLAS's docs recommend for Hopper
    cublasHandle_t handle = nullptr;
    void *workspace = nullptr;

    bool create() {
        return DCNB_CUBLAS(cublasCreate_v2, &handle) == 0 && cudaMalloc(&workspace, WORKSPACE_BYTES) == cudaSuccess;
    }

    void destroy() {
        if (handle) DCNB_CUBLAS(cublasDestroy_v2, handle);
        if (workspace) cudaFree(workspace);
        handle = nullptr;
        workspace = nullptr;
    }

    // cublasSetStream resets the workspace to cuBLAS's own pool, so it is given again after it
    bool on(cudaStream_t stream) {
        return DCNB_CUBLAS(cublasSetStream_v2, handle, stream) == 0 &&
               DCNB_CUBLAS(cublasSetWorkspace_v2, handle, workspace, WORKSPACE_BYTES) == 0;
    }
};

inline int gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    return DCNB_CUBLAS(cublasSgemm_v2, h, ta, tb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc);
}

inline int gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, double alpha,
                const double *a, int lda, const double *b, int ldb, double beta, double *c, int ldc) {
    return DCNB_CUBLAS(cublasDgemm_v2, h, ta, tb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc);
}

inline int gemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                        float alpha, const float *a, int lda, long long sa, const float *b, int ldb, long long sb,
                        float beta, float *c, int ldc, long long sc, int batch) {
    return DCNB_CUBLAS(cublasSgemmStridedBatched, h, ta, tb, m, n, k, &alpha, a, lda, sa, b, ldb, sb, &beta, c, ldc,
                       sc, batch);
}

inline int gemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                        double alpha, const double *a, int lda, long long sa, const double *b, int ldb, long long sb,
                        double beta, double *c, int ldc, long long sc, int batch) {
    return DCNB_CUBLAS(cublasDgemmStridedBatched, h, ta, tb, m, n, k, &alpha, a, lda, sa, b, ldb, sb, &beta, c, ldc,
                       sc, batch);
}

// --- cuDNN -------------------------------------------------------------------------------------------------------

// One handle per loaded binary, and one workspace its convolutions share (they run one after another on the
// binary's stream), grown at load to the largest any of them asked for.
struct Cudnn {
    cudnnHandle_t handle = nullptr;
    void *workspace = nullptr;
    size_t workspace_bytes = 0;

    bool create() { return DCNB_CUDNN(cudnnCreate, &handle) == 0; }

    void destroy() {
        if (handle) DCNB_CUDNN(cudnnDestroy, handle);
        if (workspace) cudaFree(workspace);
        handle = nullptr;
        workspace = nullptr;
        workspace_bytes = 0;
    }

    bool reserve(size_t bytes) {
        if (bytes <= workspace_bytes) return true;
        if (workspace) cudaFree(workspace);
        workspace = nullptr;
        workspace_bytes = 0;
        if (cudaMalloc(&workspace, bytes) != cudaSuccess) return false;
        workspace_bytes = bytes;
        return true;
    }

    bool on(cudaStream_t stream) { return DCNB_CUDNN(cudnnSetStream, handle, stream) == 0; }
};

// An N-d array as cuDNN takes it: at least 4 dimensions (a 1-d convolution's arrays get a trailing one of size 1)
struct Shape {
    int rank = 0;
    int dims[8] = {};
    int strides[8] = {};

    Shape(int n, const int *d, const int *s) : rank(n < 4 ? 4 : n) {
        for (int i = 0; i < rank; ++i) {
            dims[i] = i < n ? d[i] : 1;
            strides[i] = i < n ? s[i] : 1;
        }
    }

    Shape(std::initializer_list<int> d, std::initializer_list<int> s)
        : Shape(static_cast<int>(d.size()), d.begin(), s.begin()) {}
};

// per spatial dimension, at least 2 (as the arrays' dimensions), ``fill`` past the given ones
struct Spatial {
    int n = 0;
    int values[8] = {};

    Spatial(std::initializer_list<int> given, int fill) : n(given.size() < 2 ? 2 : static_cast<int>(given.size())) {
        for (int i = 0; i < n; ++i) values[i] = i < static_cast<int>(given.size()) ? given.begin()[i] : fill;
    }
};

inline bool tensor(cudnnTensorDescriptor_t *desc, cudnnDataType_t type, const Shape &shape) {
    return DCNB_CUDNN(cudnnCreateTensorDescriptor, desc) == 0 &&
           DCNB_CUDNN(cudnnSetTensorNdDescriptor, *desc, type, shape.rank, shape.dims, shape.strides) == 0;
}

// a per-channel vector (a bias) as the tensor 1 x C x 1 x ... that cuDNN broadcasts
inline bool channels(cudnnTensorDescriptor_t *desc, cudnnDataType_t type, int rank, int count) {
    int dims[8], strides[8];
    for (int i = 0; i < rank; ++i) {
        dims[i] = i == 1 ? count : 1;
        strides[i] = i == 0 ? count : 1;
    }
    return tensor(desc, type, Shape(rank, dims, strides));
}

inline void release(cudnnTensorDescriptor_t &desc) {
    if (desc) DCNB_CUDNN(cudnnDestroyTensorDescriptor, desc);
    desc = nullptr;
}

// One convolution node: its descriptors, and the algorithm cuDNN's heuristics rank first for each direction it
// runs, all chosen when the binary is loaded, with the workspace they need reserved then.
struct Convolution {
    cudnnDataType_t type = CUDNN_DATA_FLOAT;
    cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnConvolutionFwdAlgo_t forward_algo = 0;
    cudnnConvolutionBwdDataAlgo_t data_algo = 0;
    cudnnConvolutionBwdFilterAlgo_t filter_algo = 0;
    size_t forward_bytes = 0, data_bytes = 0, filter_bytes = 0;
    // the bias's gradient, the output gradient summed per channel as two products with a vector of ones (over the
    // positions, then over the batch) on cuBLAS: cudnnConvolutionBackwardBias answered CUDNN_STATUS_BAD_PARAM on an
    // H100. ``sums`` holds each item's, where both sums are needed
    int batch = 0, channel_count = 0, positions = 0;
    void *ones = nullptr, *sums = nullptr;

    // ``spatial`` dimensions after batch and channel; ``runs``: 'f' forward, 'd' data gradient, 'w' weight
    // gradient, 'b' bias gradient (of a packed output gradient)
    bool create(Cudnn &dnn, cudnnDataType_t dtype, const Shape &xs, const Shape &ws, const Shape &ys,
                const Spatial &p, const Spatial &s, const Spatial &d, int groups, const char *runs) {
        type = dtype;
        const int n = p.n;
        bool ok = tensor(&x, type, xs) && tensor(&y, type, ys) &&
                  DCNB_CUDNN(cudnnCreateFilterDescriptor, &w) == 0 &&
                  DCNB_CUDNN(cudnnSetFilterNdDescriptor, w, type, CUDNN_TENSOR_NCHW, ws.rank, ws.dims) == 0 &&
                  DCNB_CUDNN(cudnnCreateConvolutionDescriptor, &conv) == 0 &&
                  // PyTorch's convolutions are cross-correlations; accumulated in the data's own type
                  DCNB_CUDNN(cudnnSetConvolutionNdDescriptor, conv, n, p.values, s.values, d.values,
                             CUDNN_CROSS_CORRELATION, type) == 0 &&
                  DCNB_CUDNN(cudnnSetConvolutionGroupCount, conv, groups) == 0 &&
                  // plain float arithmetic, no TF32 tensor cores: as cuBLAS's default math, within the check
                  DCNB_CUDNN(cudnnSetConvolutionMathType, conv, CUDNN_FMA_MATH) == 0 &&
                  channels(&bias, type, ys.rank, ys.dims[1]);
        for (const char *r = runs; ok && *r; ++r) {
            int found = 0;
            if (*r == 'f') {
                cudnnConvolutionFwdAlgoPerf_t perf[8];
                ok = DCNB_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7, dnn.handle, x, w, conv, y, 8, &found, perf) ==
                         0 &&
                     pick(perf, found, &forward_algo) &&
                     DCNB_CUDNN(cudnnGetConvolutionForwardWorkspaceSize, dnn.handle, x, w, conv, y, forward_algo,
                                &forward_bytes) == 0 &&
                     dnn.reserve(forward_bytes);
            } else if (*r == 'd') {
                cudnnConvolutionBwdDataAlgoPerf_t perf[8];
                ok = DCNB_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7, dnn.handle, w, y, conv, x, 8, &found,
                                perf) == 0 &&
                     pick(perf, found, &data_algo) &&
                     DCNB_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize, dnn.handle, w, y, conv, x, data_algo,
                                &data_bytes) == 0 &&
                     dnn.reserve(data_bytes);
            } else if (*r == 'b') {
                ok = bias_sums(ys);
            } else if (*r == 'w') {
                cudnnConvolutionBwdFilterAlgoPerf_t perf[8];
                ok = DCNB_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7, dnn.handle, x, y, conv, w, 8, &found,
                                perf) == 0 &&
                     pick(perf, found, &filter_algo) &&
                     DCNB_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize, dnn.handle, x, y, conv, w,
                                filter_algo, &filter_bytes) == 0 &&
                     dnn.reserve(filter_bytes);
            }
        }
        return ok;
    }

    bool bias_sums(const Shape &ys) {
        batch = ys.dims[0];
        channel_count = ys.dims[1];
        positions = 1;
        for (int i = 2; i < ys.rank; ++i) positions *= ys.dims[i];
        const int count = batch > positions ? batch : positions;
        const size_t size = type == CUDNN_DATA_DOUBLE ? sizeof(double) : sizeof(float);
        const bool uploaded = type == CUDNN_DATA_DOUBLE ? upload_ones<double>(count) : upload_ones<float>(count);
        const bool both = batch > 1 && positions > 1;
        return uploaded && (!both || cudaMalloc(&sums, size_t(batch) * channel_count * size) == cudaSuccess);
    }

    template <typename T>
    bool upload_ones(int count) {
        const std::vector<T> host(count, T(1));
        return cudaMalloc(&ones, count * sizeof(T)) == cudaSuccess &&
               cudaMemcpy(ones, host.data(), count * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
    }

    // db[c] = the sum of dy[n, c, ...] over n and the positions, written whole
    template <typename T>
    bool bias_gradient(Cublas &blas, cudaStream_t stream, const T *dyp, T *dbp) const {
        const T *one = static_cast<const T *>(ones);
        const int rows = batch * channel_count;
        if (batch == 1 && positions == 1) {
            const size_t bytes = channel_count * sizeof(T);
            return cudaMemcpyAsync(dbp, dyp, bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess;
        }
        if (!blas.on(stream)) return false;
        // each item's sums: dy's rows (an item's channel, of its positions) times the ones
        T *items = batch == 1 ? dbp : static_cast<T *>(sums);
        if (positions > 1 && gemm(blas.handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, 1, positions, T(1), dyp, positions, one,
                                  positions, T(0), items, rows) != 0)
            return false;
        // then over the batch: the items' sums (or dy itself, of one position), channels by batch, times the ones
        const T *summed = positions == 1 ? dyp : items;
        return batch == 1 || gemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, channel_count, 1, batch, T(1), summed,
                                  channel_count, one, batch, T(0), dbp, channel_count) == 0;
    }

    // the first algorithm the heuristics rank that cuDNN says it can run here
    template <typename Perf, typename Algo>
    static bool pick(const Perf *perf, int found, Algo *algo) {
        for (int i = 0; i < found; ++i)
            if (perf[i].status == CUDNN_STATUS_SUCCESS) {
                *algo = perf[i].algo;
                return true;
            }
        std::fprintf(stderr, "dcnb: cuDNN's heuristics found no algorithm for a convolution\n");
        return false;
    }

    void destroy() {
        release(x);
        release(y);
        release(bias);
        if (ones) cudaFree(ones);
        if (sums) cudaFree(sums);
        ones = sums = nullptr;
        if (w) DCNB_CUDNN(cudnnDestroyFilterDescriptor, w);
        if (conv) DCNB_CUDNN(cudnnDestroyConvolutionDescriptor, conv);
        w = nullptr;
        conv = nullptr;
    }

    // y = conv(x, w) (+ b): alpha and beta in the data's type (cuDNN reads doubles for double data)
    template <typename T>
    bool forward(Cudnn &dnn, cudaStream_t stream, const T *xp, const T *wp, const T *bp, T *yp) const {
        const T one = 1, zero = 0;
        return dnn.on(stream) &&
               DCNB_CUDNN(cudnnConvolutionForward, dnn.handle, &one, x, xp, w, wp, conv, forward_algo, dnn.workspace,
                          forward_bytes, &zero, y, yp) == 0 &&
               (!bp || DCNB_CUDNN(cudnnAddTensor, dnn.handle, &one, bias, bp, &one, y, yp) == 0);
    }

    // the gradients asked for (null pointers: not asked), each written whole (beta 0)
    template <typename T>
    bool backward(Cudnn &dnn, Cublas &blas, cudaStream_t stream, const T *dyp, const T *xp, const T *wp, T *dxp,
                  T *dwp, T *dbp) const {
        const T one = 1, zero = 0;
        bool ok = dnn.on(stream);
        if (ok && dxp)
            ok = DCNB_CUDNN(cudnnConvolutionBackwardData, dnn.handle, &one, w, wp, y, dyp, conv, data_algo,
                            dnn.workspace, data_bytes, &zero, x, dxp) == 0;
        if (ok && dwp)
            ok = DCNB_CUDNN(cudnnConvolutionBackwardFilter, dnn.handle, &one, x, xp, y, dyp, conv, filter_algo,
                            dnn.workspace, filter_bytes, &zero, w, dwp) == 0;
        if (ok && dbp) ok = bias_gradient(blas, stream, dyp, dbp);
        return ok;
    }
};

// One pooling node: its descriptors, and for a max pooling's gradient the output recomputed (cuDNN's backward
// reads it), in memory allocated at load.
struct Pooling {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnPoolingDescriptor_t pool = nullptr;
    void *output = nullptr;

    bool create(cudnnDataType_t type, const Shape &xs, const Shape &ys, cudnnPoolingMode_t mode, const Spatial &k,
                const Spatial &p, const Spatial &s, size_t output_bytes) {
        // NaN propagates, as in PyTorch's max pooling
        return tensor(&x, type, xs) && tensor(&y, type, ys) &&
               DCNB_CUDNN(cudnnCreatePoolingDescriptor, &pool) == 0 &&
               DCNB_CUDNN(cudnnSetPoolingNdDescriptor, pool, mode, CUDNN_PROPAGATE_NAN, k.n, k.values, p.values,
                          s.values) == 0 &&
               (output_bytes == 0 || cudaMalloc(&output, output_bytes) == cudaSuccess);
    }

    void destroy() {
        release(x);
        release(y);
        if (pool) DCNB_CUDNN(cudnnDestroyPoolingDescriptor, pool);
        if (output) cudaFree(output);
        pool = nullptr;
        output = nullptr;
    }

    template <typename T>
    bool forward(Cudnn &dnn, cudaStream_t stream, const T *xp, T *yp) const {
        const T one = 1, zero = 0;
        return dnn.on(stream) && DCNB_CUDNN(cudnnPoolingForward, dnn.handle, pool, &one, x, xp, &zero, y, yp) == 0;
    }

    // dx, written whole; ``xp`` null for an average pooling, whose gradient reads neither x nor y: dx and dy stand
    // in for them, as cuDNN's signature takes both
    template <typename T>
    bool backward(Cudnn &dnn, cudaStream_t stream, const T *dyp, const T *xp, T *dxp) const {
        const T one = 1, zero = 0;
        const T *yp = dyp;
        if (xp) {
            if (!forward(dnn, stream, xp, static_cast<T *>(output))) return false;
            yp = static_cast<const T *>(output);
        }
        return dnn.on(stream) && DCNB_CUDNN(cudnnPoolingBackward, dnn.handle, pool, &one, y, yp, y, dyp, x,
                                            xp ? xp : dxp, &zero, x, dxp) == 0;
    }
};

}  // namespace dcnb_gpu
