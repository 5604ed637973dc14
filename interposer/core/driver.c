/*
 * driver.c - the real CUDA driver, resolved at run time: the one table of
 * every driver entry point the interposer calls (driver.h), for every
 * module.
 *
 * libcuinterpose never links libcuda: it dlopens "libcuda.so.1" on first
 * need and looks every entry point it calls up in that handle, so lookups
 * never land on its own exported wrappers. Base layer: calls only the log. The real dlsym comes from libc by
 * version (our own dlsym is a wrapper). Written once under pthread_once,
 * read-only afterwards; no lock.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "cuip.h"
#include "driver.h"

struct cuip_real real;
_Atomic int cuip_driver_loaded; /* 1 once real is written (release) */
static void *cuda_handle;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static void *(*libc_dlsym)(void *, const char *);

CUIP_NOSAN static void dlsym_init(void)
{
	static const char *const vers[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};

	for (int i = 0; vers[i] && !libc_dlsym; i++)
		libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", vers[i]);
}

CUIP_NOSAN void *cuip_real_dlsym(void *handle, const char *name)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, dlsym_init);
	if (!libc_dlsym)
		return NULL;
	return libc_dlsym(handle, name);
}

static void driver_load(void)
{
	cuda_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!cuda_handle) {
		pr_err("cannot load the CUDA driver (libcuda.so.1): %s", dlerror());
		return;
	}
#define X(name) real.name = (__typeof__(real.name))cuip_real_dlsym(cuda_handle, #name);
	CUIP_REAL_FUNCS(X)
#undef X
	real.cuGetProcAddress_v2_ptsz = cuip_real_dlsym(cuda_handle, "cuGetProcAddress_v2_ptsz");
#define L(name, base, ver, ptds, params, args) \
	real.launch.name = (__typeof__(real.launch.name))cuip_real_dlsym(cuda_handle, #name);
	CUIP_LAUNCH_LIST(L)
#undef L
	atomic_store_explicit(&cuip_driver_loaded, 1, memory_order_release);
}

int cuip_driver_load(void)
{
	pthread_once(&driver_once, driver_load);
	return cuda_handle ? 0 : -ENOENT;
}

void *cuip_driver_handle(void)
{
	cuip_driver_init();
	return cuda_handle;
}

const char *cuip_cuerr(CUresult r)
{
	static __thread char buf[32];
	const char *s = NULL;

	if (real.cuGetErrorString && real.cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
		return s;
	snprintf(buf, sizeof(buf), "CUresult %d", (int)r);
	return buf;
}
