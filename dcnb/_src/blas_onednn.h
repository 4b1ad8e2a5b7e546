// blas_torch.h with float products large enough through oneDNN's matmul inside PyTorch (dcnb/_src/blas.py, onednn)
#pragma once

#define DCNB_ONEDNN_PRODUCTS
#include "blas_torch.h"
