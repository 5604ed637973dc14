/*
 * options.c - CUINTERPOSE_* environment variables and GPU remap parsing.
 * Stateless; see options.h.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errfmt.h"
#include "options.h"
#include "settings.h"

void cuip_format_uuid(const uint8_t u[16], char *buf, size_t len)
{
	snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
		 u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

int cuip_parse_remap(const char *s, struct cuip_gpu_pair *pairs, unsigned max, char *err, size_t errlen)
{
	unsigned n = 0;
	const char *p = s;

	if (!s)
		return 0;
	while (*p) {
		const char *end = strchr(p, ','), *eq;
		size_t len;

		if (!end)
			end = p + strlen(p);
		len = (size_t)(end - p);
		eq = memchr(p, '=', len);
		if (len == 0) {
			/* tolerate a trailing comma, nothing else empty */
			if (*end) {
				errfmt(err, errlen, "CUINTERPOSE_GPU_REMAP: empty entry in \"%s\"", s);
				return -EINVAL;
			}
			break;
		}
		if (!eq) {
			errfmt(err, errlen, "CUINTERPOSE_GPU_REMAP: \"%.*s\" is not OLDUUID=NEWUUID", (int)len, p);
			return -EINVAL;
		}
		if (n >= max) {
			errfmt(err, errlen, "CUINTERPOSE_GPU_REMAP: more than %u pairs", max);
			return -EINVAL;
		}
		if (cuip_parse_uuid(p, (size_t)(eq - p), pairs[n].old_uuid) ||
		    cuip_parse_uuid(eq + 1, (size_t)(end - eq - 1), pairs[n].new_uuid)) {
			errfmt(err, errlen,
			       "CUINTERPOSE_GPU_REMAP: \"%.*s\" has a malformed UUID (want 32 hex digits, "
			       "optionally GPU- prefixed and dashed)",
			       (int)len, p);
			return -EINVAL;
		}
		for (unsigned i = 0; i < n; i++) {
			if (!memcmp(pairs[i].old_uuid, pairs[n].old_uuid, 16)) {
				errfmt(err, errlen, "CUINTERPOSE_GPU_REMAP: GPU \"%.*s\" is remapped twice",
				       (int)(eq - p), p);
				return -EINVAL;
			}
		}
		n++;
		p = *end ? end + 1 : end;
	}
	return (int)n;
}

static int env_uint(const char *name, unsigned def, unsigned min, unsigned max, unsigned *out, char *err, size_t errlen)
{
	const char *v = getenv(name);
	unsigned long long x;
	char *end;

	*out = def;
	if (!v || !*v)
		return 0;
	errno = 0;
	x = strtoull(v, &end, 0);
	if (errno || *end || x < min || x > max) {
		errfmt(err, errlen, "%s=\"%s\": want a number between %u and %u", name, v, min, max);
		return -EINVAL;
	}
	*out = (unsigned)x;
	return 0;
}

static int env_bool(const char *name, int def, int *out, char *err, size_t errlen)
{
	const char *v = getenv(name);

	*out = def;
	if (!v || !*v)
		return 0;
	if (!strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "true") || !strcasecmp(v, "on"))
		*out = 1;
	else if (!strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "false") || !strcasecmp(v, "off"))
		*out = 0;
	else {
		errfmt(err, errlen, "%s=\"%s\": want 0 or 1", name, v);
		return -EINVAL;
	}
	return 0;
}

static int env_str(const char *name, const char *def, char *out, size_t len, char *err, size_t errlen)
{
	const char *v = getenv(name);

	if (!v || !*v)
		v = def;
	if (strlen(v) >= len) {
		errfmt(err, errlen, "%s is longer than %zu bytes", name, len - 1);
		return -EINVAL;
	}
	strcpy(out, v);
	return 0;
}

int cuip_opts_load(struct cuip_opts *o, char *err, size_t errlen)
{
	char copies[32], prefetch[32];
	unsigned chunk, level;
	int ret, n;

	memset(o, 0, sizeof(*o));
	/* The table's check first: every variable of criu's plugin, those
	 * read elsewhere (agent.c, guardian.c) too, refused with its range. */
	ret = cuip_settings_check_env(CUIP_READER_PLUGIN, err, errlen);
	if (ret)
		return ret;
	if ((ret = env_uint("CUINTERPOSE_LOCK_TIMEOUT_MS", 0, 0, 3600000, &o->lock_timeout_ms, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_TEST_OP_TIMEOUT_MS", 60000, 0, 3600000, &o->op_timeout_ms, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_TEST_DATA_TIMEOUT_MS", 0, 0, 86400000, &o->data_timeout_ms, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_STALL_TIMEOUT_MS", 60000, 0, 86400000, &o->stall_timeout_ms, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_QUIESCE_TIMEOUT_MS", 10000, 1, 3600000, &o->quiesce_timeout_ms, err,
			    errlen)) ||
	    (ret = env_uint("CUINTERPOSE_TEST_QUIESCE_RETRIES", 3, 0, 100, &o->quiesce_retries, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_START_WAIT_MS", 5000, 1, 3600000, &o->start_wait_ms, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_PROGRESS_MS", 5000, 0, 3600000, &o->progress_ms, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_TEST_CHUNK_SIZE", 1u << 20, 4096, 1u << 30, &chunk, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_TEST_CARRIER_FILES", 0, 0, 64, &o->carrier_files, err, errlen)) ||
	    (ret = env_bool("CUINTERPOSE_VERIFY_BEFORE_RESTORE", 0, &o->verify_carriers, err, errlen)) ||
	    (ret = env_uint("CUINTERPOSE_LOG", 1, 0, 3, &level, err, errlen)) ||
	    (ret = env_bool("CUINTERPOSE_TEST_LEAVE_RUNNING", -1, &o->leave_running, err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_SOCKET_DIR", "", o->socket_dir, sizeof(o->socket_dir), err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_LIBCUDA", "libcuda.so.1", o->libcuda, sizeof(o->libcuda), err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_TEST_LOAD_COPIES", "async", copies, sizeof(copies), err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_PARENT", "", o->parent, sizeof(o->parent), err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_PREFETCH_MB", "0", prefetch, sizeof(prefetch), err, errlen)))
		return ret;
	if (strcmp(prefetch, "auto")) {
		unsigned long long mb;
		char *end;

		errno = 0;
		mb = strtoull(prefetch, &end, 10);
		if (errno || *end || !isdigit((unsigned char)prefetch[0]) || mb > (1ull << 40)) {
			errfmt(err, errlen, "CUINTERPOSE_PREFETCH_MB=\"%s\": want auto or a number of MiB (0: off)",
			       prefetch);
			return -EINVAL;
		}
		o->prefetch_mb = (int64_t)mb;
	} else {
		o->prefetch_mb = -1;
	}
	if (strcmp(copies, "async") && strcmp(copies, "sync")) {
		errfmt(err, errlen, "CUINTERPOSE_TEST_LOAD_COPIES=\"%s\": want async or sync", copies);
		return -EINVAL;
	}
	o->load_sync = !strcmp(copies, "sync");
	o->chunk_size = chunk;
	o->verbose = level >= 2;
	{
		const char *r = getenv("CUINTERPOSE_GPU_REMAP");

		o->remap_auto = r && !strcmp(r, "auto");
		n = o->remap_auto ? 0 : cuip_parse_remap(r, o->remap, CUIP_MAX_REMAP, err, errlen);
	}
	if (n < 0)
		return n;
	o->n_remap = (unsigned)n;
	return 0;
}
