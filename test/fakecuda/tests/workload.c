/*
 * A CUDA workload for the CRIU end-to-end test, written only against cuda.h:
 * private device memory (cuMemAlloc + a never-exported POSIX-capable VMM
 * allocation) filled with a pattern; it keeps calling the API until WORKDIR/go
 * appears, then checks every byte at the same addresses, runs a kernel and
 * writes WORKDIR/result ("ok" or what went wrong).
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LIN_SIZE (8u << 20)
#define VMM_SIZE (4u << 20)

static char dir[256];

static void put(const char *name, const char *text)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static int fail(const char *what, CUresult r)
{
	char msg[256];
	const char *n = "?";

	cuGetErrorName(r, &n);
	snprintf(msg, sizeof(msg), "%s: %s\n", what, n);
	put("result", msg);
	return 1;
}

#define C(x)                                 \
	do {                                 \
		CUresult r_ = (x);           \
		if (r_ != CUDA_SUCCESS)      \
			return fail(#x, r_); \
	} while (0)

static uint32_t pat(size_t i, uint32_t seed)
{
	return seed ^ (uint32_t)(i * 2654435761u);
}

int main(int argc, char **argv)
{
	static uint32_t buf[LIN_SIZE / 4];
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;
	CUmemAccessDesc ad;
	CUdeviceptr lin, vmm;
	CUcontext ctx;
	CUmodule mod;
	CUfunction add;
	char text[128], path[512];
	size_t n = LIN_SIZE / 4, i;
	uint32_t one = 1;
	void *args[] = {&lin, &n, &one};

	if (argc != 2)
		return 2;
	snprintf(dir, sizeof(dir), "%s", argv[1]);
	C(cuInit(0));
	C(cuDevicePrimaryCtxRetain(&ctx, 0));
	C(cuCtxSetCurrent(ctx));
	C(cuMemAlloc(&lin, LIN_SIZE));
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	C(cuMemCreate(&h, VMM_SIZE, &prop, 0));
	C(cuMemAddressReserve(&vmm, VMM_SIZE, 0, 0, 0));
	C(cuMemMap(vmm, VMM_SIZE, 0, h, 0));
	memset(&ad, 0, sizeof(ad));
	ad.location = prop.location;
	ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	C(cuMemSetAccess(vmm, VMM_SIZE, &ad, 1));
	for (i = 0; i < LIN_SIZE / 4; i++)
		buf[i] = pat(i, 0xc0ffee);
	C(cuMemcpyHtoD(lin, buf, LIN_SIZE));
	for (i = 0; i < VMM_SIZE / 4; i++)
		buf[i] = pat(i, 0xbeef);
	C(cuMemcpyHtoD(vmm, buf, VMM_SIZE));
	C(cuModuleLoadData(&mod, "image"));
	C(cuModuleGetFunction(&add, mod, "fake_add_u32"));
	snprintf(text, sizeof(text), "%llx %llx\n", (unsigned long long)lin, (unsigned long long)vmm);
	put("addrs", text);
	put("ready", "");

	snprintf(path, sizeof(path), "%s/go", dir);
	for (i = 0; access(path, F_OK) < 0; i++) {
		if (i > 12000)
			return fail("timeout waiting for go", CUDA_ERROR_TIMEOUT);
		C(cuStreamQuery(NULL)); /* blocked by the checkpoint lock while it is held */
		usleep(5000);
	}

	C(cuMemcpyDtoH(buf, lin, LIN_SIZE));
	for (i = 0; i < LIN_SIZE / 4; i++)
		if (buf[i] != pat(i, 0xc0ffee))
			return fail("cuMemAlloc bytes differ after restore", CUDA_ERROR_UNKNOWN);
	C(cuMemcpyDtoH(buf, vmm, VMM_SIZE));
	for (i = 0; i < VMM_SIZE / 4; i++)
		if (buf[i] != pat(i, 0xbeef))
			return fail("VMM bytes differ after restore", CUDA_ERROR_UNKNOWN);
	C(cuLaunchKernel(add, 1, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
	C(cuCtxSynchronize());
	C(cuMemcpyDtoH(buf, lin, LIN_SIZE));
	for (i = 0; i < LIN_SIZE / 4; i++)
		if (buf[i] != pat(i, 0xc0ffee) + 1)
			return fail("kernel after restore", CUDA_ERROR_UNKNOWN);
	snprintf(text, sizeof(text), "ok %llx %llx\n", (unsigned long long)lin, (unsigned long long)vmm);
	put("result", text);
	return 0;
}
