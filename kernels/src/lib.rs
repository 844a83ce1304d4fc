//! memra-kernels: CUDA kernel sources and their NVRTC build (filled by the CUDA backend work).
