/*
 * config.c - the carrier's configuration: the defaults and the
 * CUINTERPOSE_* variables that override them (carrier_config_init), and
 * the driver table resolved through the caller's lookup
 * (carrier_ops_resolve). Contract in carrier.h; called by the interposer,
 * by carrier.c when a save or load gets no configuration, and by the
 * tests. No state of its own: it fills the caller's structures.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "carrier.h"
#include "errfmt.h"
#include "settings.h"
#include "xfer.h"
#include "zchunk.h"

/* ---- configuration ------------------------------------------------------ */

/* A number by the settings table: its range and default are the row's. */
static int env_num(const char *name, uint64_t *out, char *err, size_t errlen)
{
	int rc = cuip_setting_number(name, out, err, errlen);

	return rc < 0 ? rc : 0;
}

int carrier_config_init(struct carrier_config *cfg, char *err, size_t errlen)
{
	uint64_t staging = 0, chunk = 0, threads = 0;
	const char *v;
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	cfg->staging_bytes = DEFAULT_STAGING;
	cfg->chunk_size = DEFAULT_CHUNK;
	cfg->threads = 0;
	rc = env_num("CUINTERPOSE_STAGING_MB", &staging, err, errlen);
	if (!rc)
		rc = env_num("CUINTERPOSE_TEST_CHUNK_MB", &chunk, err, errlen);
	if (!rc)
		rc = env_num("CUINTERPOSE_TEST_CARRIER_THREADS", &threads, err, errlen);
	if (rc)
		return rc;
	v = getenv("CUINTERPOSE_TEST_LOAD_VERIFY");
	if (v && *v && strcmp(v, "first") && strcmp(v, "chunk")) {
		errfmt(err, errlen, "CUINTERPOSE_TEST_LOAD_VERIFY=%s: expected \"first\" or \"chunk\"", v);
		return -EINVAL;
	}
	cfg->staging_bytes = staging * MIB;
	cfg->chunk_size = (uint32_t)(chunk * MIB);
	cfg->threads = (unsigned)threads;
	cfg->verify_first = v && !strcmp(v, "first");
	v = getenv("CUINTERPOSE_CARRIER_HASH");
	if (v && *v && strcmp(v, "device") && strcmp(v, "sha256") && strcmp(v, "off")) {
		errfmt(err, errlen, "CUINTERPOSE_CARRIER_HASH=%s: expected \"device\", \"sha256\" or \"off\"", v);
		return -EINVAL;
	}
	cfg->hash = !v || !*v || strcmp(v, "off");
	cfg->device_scan = !v || !*v || !strcmp(v, "device");
	v = getenv("CUINTERPOSE_CARRIER_COMPRESS");
	if (cuip_zchunk_parse(v, &cfg->compress_level, &cfg->compress)) {
		errfmt(err, errlen,
		       "CUINTERPOSE_CARRIER_COMPRESS=%s: expected \"off\", \"zstd\" or \"zstd:LEVEL\" (%d..%d)", v,
		       CUIP_ZCHUNK_LEVEL_MIN, CUIP_ZCHUNK_LEVEL_MAX);
		return -EINVAL;
	}
	return 0;
}

int carrier_ops_resolve(struct carrier_ops *ops, void *(*lookup)(void *arg, const char *name), void *arg, char *err,
			size_t errlen)
{
	static const struct {
		const char *name;
		size_t off;
		bool optional;
	} syms[] = {
#define SYM(field, name, opt) {name, offsetof(struct carrier_ops, field), opt}
		SYM(ctx_get_current, "cuCtxGetCurrent", false),
		SYM(ctx_set_current, "cuCtxSetCurrent", false),
		SYM(mem_host_alloc, "cuMemHostAlloc", true),
		SYM(mem_alloc_host, "cuMemAllocHost_v2", false),
		SYM(mem_free_host, "cuMemFreeHost", false),
		SYM(stream_create, "cuStreamCreate", false),
		SYM(stream_destroy, "cuStreamDestroy_v2", false),
		SYM(stream_synchronize, "cuStreamSynchronize", false),
		SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2", false),
		SYM(memcpy_htod_async, "cuMemcpyHtoDAsync_v2", false),
		SYM(get_error_name, "cuGetErrorName", true),
		SYM(mem_host_register, "cuMemHostRegister_v2", true),
		SYM(mem_host_unregister, "cuMemHostUnregister", true),
		SYM(module_load_data, "cuModuleLoadData", true),
		SYM(module_unload, "cuModuleUnload", true),
		SYM(module_get_function, "cuModuleGetFunction", true),
		SYM(launch_kernel, "cuLaunchKernel", true),
		SYM(mem_alloc, "cuMemAlloc_v2", true),
		SYM(mem_free, "cuMemFree_v2", true),
		SYM(memset_d8_async, "cuMemsetD8Async", true),
#undef SYM
	};

	memset(ops, 0, sizeof(*ops));
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *p = lookup(arg, syms[i].name);

		if (!p && !syms[i].optional) {
			errfmt(err, errlen, "carrier: driver lacks %s", syms[i].name);
			return -ENOENT;
		}
		memcpy((uint8_t *)ops + syms[i].off, &p, sizeof(p));
	}
	return 0;
}
