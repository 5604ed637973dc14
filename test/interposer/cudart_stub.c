/*
 * cudart_stub.c - a stand-in for libcudart's driver-entry-point lookups,
 * for tests only. Like the real runtime it asks the driver's
 * cuGetProcAddress_v2; it finds that function with libc's own dlsym, so
 * the pointers it returns are the real driver's and only the interposer's
 * cudaGetDriverEntryPoint* wrappers can substitute them.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>

#define STUB_API __attribute__((visibility("default")))

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static gpa_fn gpa(void)
{
	void *(*libc_dlsym)(void *, const char *) =
		(void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
	void *h = dlopen("libcuda.so.1", RTLD_NOW);

	if (!libc_dlsym)
		libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
	return h && libc_dlsym ? (gpa_fn)libc_dlsym(h, "cuGetProcAddress_v2") : NULL;
}

static int lookup(const char *symbol, void **fp, unsigned ver, unsigned long long flags, int *status)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	gpa_fn f = gpa();
	CUresult r;

	if (!f)
		return 3; /* cudaErrorInitializationError */
	r = f(symbol, fp, (int)ver, flags, &st);
	if (status)
		*status = (int)st;
	return r == CUDA_SUCCESS ? 0 : 500; /* cudaErrorSymbolNotFound */
}

STUB_API int cudaGetDriverEntryPoint(const char *symbol, void **fp, unsigned long long flags, int *status);
STUB_API int cudaGetDriverEntryPoint_ptsz(const char *symbol, void **fp, unsigned long long flags, int *status);
STUB_API int cudaGetDriverEntryPointByVersion(const char *symbol, void **fp, unsigned ver, unsigned long long flags,
					      int *status);
STUB_API int cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **fp, unsigned ver,
						   unsigned long long flags, int *status);

STUB_API int cudaGetDriverEntryPoint(const char *symbol, void **fp, unsigned long long flags, int *status)
{
	return lookup(symbol, fp, CUDA_VERSION, flags, status);
}

STUB_API int cudaGetDriverEntryPoint_ptsz(const char *symbol, void **fp, unsigned long long flags, int *status)
{
	return lookup(symbol, fp, CUDA_VERSION, flags | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, status);
}

STUB_API int cudaGetDriverEntryPointByVersion(const char *symbol, void **fp, unsigned ver, unsigned long long flags,
					      int *status)
{
	return lookup(symbol, fp, ver, flags, status);
}

STUB_API int cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **fp, unsigned ver,
						   unsigned long long flags, int *status)
{
	return lookup(symbol, fp, ver, flags | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, status);
}
