/*
 * Modules and kernels.  Any module image is accepted; functions are looked up
 * by name among the builtin "kernels" below, which do checkable work on device
 * memory through devmem.c (with the launching context's device as accessor, so
 * VMM access rights matter).  Launches are queued on a stream (stream.c);
 * FAKECUDA_KERNEL_DELAY_US makes each one take that long (FAKECUDA_KERNEL_HOLD=
 * FILE: and then until FILE exists, at most FK_HOLD_MAX_S).  Module table under
 * G.lock; the kernel table is constant.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake.h"

#define CHUNK_U32 16384

static uint64_t arg_u64(const unsigned char *args, int i)
{
	uint64_t v;

	memcpy(&v, args + 8 * i, sizeof(v));
	return v;
}

static uint32_t arg_u32(const unsigned char *args, int i)
{
	uint32_t v;

	memcpy(&v, args + 8 * i, sizeof(v));
	return v;
}

/* fake_fill_u32(uint32_t *p, size_t n, uint32_t v): p[i] = v */
static CUresult k_fill(const unsigned char *args, int ord)
{
	uint32_t v = arg_u32(args, 2);

	return devmem_fill(arg_u64(args, 0), &v, 4, arg_u64(args, 1), ord);
}

/* fake_add_u32(uint32_t *p, size_t n, uint32_t delta): p[i] += delta */
static CUresult k_add(const unsigned char *args, int ord)
{
	uint32_t buf[CHUNK_U32], d = arg_u32(args, 2);
	uint64_t p = arg_u64(args, 0), n = arg_u64(args, 1);

	while (n > 0) {
		size_t k = n < CHUNK_U32 ? n : CHUNK_U32;
		CUresult r = devmem_read(buf, p, k * 4, ord);

		if (r)
			return r;
		for (size_t i = 0; i < k; i++)
			buf[i] += d;
		r = devmem_write(p, buf, k * 4, ord);
		if (r)
			return r;
		p += k * 4;
		n -= k;
	}
	return CUDA_SUCCESS;
}

/* fake_copy(void *dst, const void *src, size_t bytes) */
static CUresult k_copy(const unsigned char *args, int ord)
{
	return devmem_copy(arg_u64(args, 0), arg_u64(args, 1), arg_u64(args, 2), ord);
}

static const struct fk_kernel kernels[] = {
	{"fake_fill_u32", {8, 8, 4}, 3, k_fill},
	{"fake_add_u32", {8, 8, 4}, 3, k_add},
	{"fake_copy", {8, 8, 8}, 3, k_copy},
};

static int module_valid(struct fk_module *m)
{
	uintptr_t p = (uintptr_t)m, b = (uintptr_t)G.mod;

	return p >= b && p < b + sizeof(G.mod) && (p - b) % sizeof(G.mod[0]) == 0 && m->magic == FK_MOD_MAGIC &&
	       m->used;
}

static CUresult module_load(CUmodule *module, const void *image, const char *fname)
{
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	if (!module || (!image && !fname))
		return CUDA_ERROR_INVALID_VALUE;
	if (fname && access(fname, R_OK) < 0)
		return CUDA_ERROR_FILE_NOT_FOUND;
	LOCK();
	for (int i = 0; i < FK_MAX_MOD; i++) {
		struct fk_module *m = &G.mod[i];

		if (!m->used) {
			m->used = 1;
			m->magic = FK_MOD_MAGIC;
			m->ctx = c;
			*module = (CUmodule)m;
			UNLOCK();
			return CUDA_SUCCESS;
		}
	}
	UNLOCK();
	return CUDA_ERROR_OUT_OF_MEMORY;
}

FK_API CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
	FK_CALL("cuModuleLoadData", module_load(module, image, NULL));
}

FK_API CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
	FK_CALL("cuModuleLoad", module_load(module, NULL, fname));
}

static CUresult module_unload(CUmodule hmod)
{
	struct fk_module *m = (struct fk_module *)hmod;
	CUresult r = CUDA_SUCCESS;

	LOCK();
	if (!module_valid(m))
		r = CUDA_ERROR_INVALID_HANDLE;
	else
		m->used = 0, m->magic = 0;
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
	FK_CALL("cuModuleUnload", module_unload(hmod));
}

static CUresult get_function(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	int ok;

	if (!hfunc || !name)
		return CUDA_ERROR_INVALID_VALUE;
	LOCK();
	ok = module_valid((struct fk_module *)hmod);
	UNLOCK();
	if (!ok)
		return CUDA_ERROR_INVALID_HANDLE;
	for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
		if (!strcmp(kernels[i].name, name)) {
			*hfunc = (CUfunction)&kernels[i];
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_NOT_FOUND;
}

FK_API CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	FK_CALL("cuModuleGetFunction", get_function(hfunc, hmod, name));
}

/* Packs arguments into 8-byte slots from kernelParams or from an `extra` buffer (natural alignment). */
static CUresult pack_args(const struct fk_kernel *k, void **params, void **extra, unsigned char *out)
{
	if (params && extra)
		return CUDA_ERROR_INVALID_VALUE;
	if (params) {
		for (int i = 0; i < k->nargs; i++)
			memcpy(out + 8 * i, params[i], k->argsz[i]);
		return CUDA_SUCCESS;
	}
	if (extra) {
		const unsigned char *buf = NULL;
		size_t size = 0, off = 0;

		for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
			if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
				buf = extra[i + 1];
			else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
				memcpy(&size, extra[i + 1], sizeof(size));
			else
				return CUDA_ERROR_INVALID_VALUE;
		}
		if (!buf)
			return CUDA_ERROR_INVALID_VALUE;
		for (int i = 0; i < k->nargs; i++) {
			off = (off + k->argsz[i] - 1) / k->argsz[i] * k->argsz[i];
			if (off + k->argsz[i] > size)
				return CUDA_ERROR_INVALID_VALUE;
			memcpy(out + 8 * i, buf + off, k->argsz[i]);
			off += k->argsz[i];
		}
		return CUDA_SUCCESS;
	}
	return k->nargs ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* FAKECUDA_KERNEL_HOLD's value for the queue (a launch may change it):
 * the last one kept, an earlier one leaked (tests set a few). */
static const char *hold_path(void)
{
	static char *last;
	const char *h = getenv("FAKECUDA_KERNEL_HOLD");

	if (!h || !*h)
		return NULL;
	if (!last || strcmp(last, h))
		last = strdup(h);
	return last;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		       CUstream hStream, void **params, void **extra)
{
	const struct fk_kernel *k = (const struct fk_kernel *)f;
	struct fk_op op = {.type = OP_KERNEL};
	const char *delay = getenv("FAKECUDA_KERNEL_DELAY_US");
	struct fk_stream *s;
	struct fk_ctx *c;
	CUresult r = ctx_require(&c);

	if (r)
		return r;
	if ((uintptr_t)k < (uintptr_t)kernels ||
	    (uintptr_t)k >= (uintptr_t)(kernels + sizeof(kernels) / sizeof(kernels[0])))
		return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	r = pack_args(k, params, extra, op.args);
	if (r)
		return r;
	op.kernel = k;
	op.ord = c->ord;
	c->launched = 1;
	op.delay_us = delay ? (uint32_t)strtoul(delay, NULL, 10) : 0;
	op.hold = hold_path();
	LOCK();
	r = stream_resolve(hStream, &s);
	if (!r)
		r = stream_enqueue(&op, s);
	UNLOCK();
	return r;
}

FK_API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
				       unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
				       unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
				       void **kernelParams, void **extra)
{
	FK_CALL("cuLaunchKernel",
		launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams, extra));
}
