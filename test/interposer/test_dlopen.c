/*
 * test_dlopen - libcuinterpose.so works when dlopen'ed into a running
 * process rather than preloaded: its API gate keeps each thread's slot in
 * initial-exec TLS (gate.c), which a library loaded late must find in
 * glibc's static TLS surplus. Run by test_dlopen.sh under the fake driver,
 * without LD_PRELOAD.
 *
 *   test_dlopen LIBCUINTERPOSE
 *
 * Asserts: the library is not loaded before; dlopen(RTLD_NOW) succeeds;
 * its cuInit, context set-up and stream creation succeed; its gated
 * cuLaunchKernel of a NULL function returns the fake driver's
 * CUDA_ERROR_INVALID_HANDLE (the call passed the gate and reached the
 * driver) on the main thread and on a thread started after the dlopen,
 * 1000 times each. Exit 0 on success, 1 with a FAIL line otherwise.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			      CUstream, void **, void **);

static launch_fn launch;
static CUstream stream;
static CUcontext ctx;
static CUresult (*set_current)(CUcontext);

static int launches(const char *who)
{
	for (int i = 0; i < 1000; i++) {
		CUresult r = launch(NULL, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);

		if (r != CUDA_ERROR_INVALID_HANDLE) {
			printf("FAIL: %s: cuLaunchKernel(NULL) through the dlopen'ed interposer returned %d, "
			       "expected CUDA_ERROR_INVALID_HANDLE (%d), call %d\n",
			       who, (int)r, (int)CUDA_ERROR_INVALID_HANDLE, i);
			return 1;
		}
	}
	return 0;
}

static void *thread_main(void *arg)
{
	(void)arg;
	if (set_current(ctx) != CUDA_SUCCESS) {
		printf("FAIL: thread: cuCtxSetCurrent failed\n");
		return (void *)1;
	}
	return (void *)(long)launches("a thread started after dlopen");
}

#define SYM(h, var, name)                                              \
	do {                                                           \
		*(void **)&(var) = dlsym(h, name);                     \
		if (!(var)) {                                          \
			printf("FAIL: %s not found (%s)\n", name, #h); \
			return 1;                                      \
		}                                                      \
	} while (0)

int main(int argc, char **argv)
{
	CUresult (*init)(unsigned), (*dev_get)(CUdevice *, int), (*retain)(CUcontext *, CUdevice);
	CUresult (*stream_create)(CUstream *, unsigned);
	CUdevice dev;
	pthread_t t;
	void *h, *hc, *res;

	if (argc != 2)
		return fprintf(stderr, "usage: test_dlopen LIBCUINTERPOSE\n"), 2;
	if (dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD)) {
		printf("FAIL: %s is loaded before the dlopen (preloaded?)\n", argv[1]);
		return 1;
	}
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		printf("FAIL: dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	/* what the interposer does not wrap comes from the driver itself */
	hc = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!hc) {
		printf("FAIL: dlopen libcuda.so.1: %s\n", dlerror());
		return 1;
	}
	SYM(h, init, "cuInit");
	SYM(hc, dev_get, "cuDeviceGet");
	SYM(hc, retain, "cuDevicePrimaryCtxRetain");
	SYM(hc, set_current, "cuCtxSetCurrent");
	SYM(hc, stream_create, "cuStreamCreate");
	SYM(h, launch, "cuLaunchKernel");
	if (init(0) != CUDA_SUCCESS || dev_get(&dev, 0) != CUDA_SUCCESS || retain(&ctx, dev) != CUDA_SUCCESS ||
	    set_current(ctx) != CUDA_SUCCESS || stream_create(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
		printf("FAIL: context or stream set-up through the dlopen'ed interposer failed\n");
		return 1;
	}
	if (launches("main thread"))
		return 1;
	if (pthread_create(&t, NULL, thread_main, NULL) || pthread_join(t, &res)) {
		printf("FAIL: pthread_create/join\n");
		return 1;
	}
	if (res)
		return 1;
	printf("PASS: dlopen'ed interposer: gated calls on 2 threads reached the driver\n");
	return 0;
}
