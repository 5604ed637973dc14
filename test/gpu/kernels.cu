/*
 * kernels.cu - the device code of the GPU workloads, built here by nvcc into
 * a fatbin (sm_90 SASS + compute_90 PTX) that gpu_job and gpu_microbench
 * embed and load with cuModuleLoadData. The names and semantics are exactly
 * those of the fake driver's builtin kernels (test/fakecuda/module.c), so one
 * workload binary runs on both drivers.
 */
#include <stddef.h>
#include <stdint.h>

extern "C" __global__ void fake_fill_u32(uint32_t *p, size_t n, uint32_t v)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = v;
}

extern "C" __global__ void fake_add_u32(uint32_t *p, size_t n, uint32_t delta)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] += delta;
}

extern "C" __global__ void fake_copy(void *dst, const void *src, size_t bytes)
{
	unsigned char *d = (unsigned char *)dst;
	const unsigned char *s = (const unsigned char *)src;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x)
		d[i] = s[i];
}
