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

/* A number or yes/no by the settings table (range and default there). */
static int env_num(const char *name, unsigned *out, char *err, size_t errlen)
{
	uint64_t v = 0;
	int ret = cuip_setting_number(name, &v, err, errlen);

	if (ret < 0)
		return ret;
	if (ret == 0)
		*out = (unsigned)v; /* every such row's max fits */
	return 0;
}

static int env_flag(const char *name, int *out, char *err, size_t errlen)
{
	unsigned v = (unsigned)*out;
	int ret = env_num(name, &v, err, errlen);

	*out = (int)v;
	return ret;
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
	char copies[32];
	unsigned chunk = 0, level = 0;
	int ret, n;

	memset(o, 0, sizeof(*o));
	/* The table's check first: every variable of criu's plugin, those
	 * read elsewhere (agent.c, guardian.c) too, refused with its range. */
	ret = cuip_settings_check_env(CUIP_READER_PLUGIN, err, errlen);
	if (ret)
		return ret;
	o->leave_running = -1; /* unset: ask CRIU */
	if ((ret = env_num("CUINTERPOSE_LOCK_TIMEOUT_MS", &o->lock_timeout_ms, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_TEST_OP_TIMEOUT_MS", &o->op_timeout_ms, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_TEST_DATA_TIMEOUT_MS", &o->data_timeout_ms, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_STALL_TIMEOUT_MS", &o->stall_timeout_ms, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_QUIESCE_TIMEOUT_MS", &o->quiesce_timeout_ms, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_TEST_QUIESCE_RETRIES", &o->quiesce_retries, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_START_WAIT_MS", &o->start_wait_ms, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_PROGRESS_MS", &o->progress_ms, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_TEST_CHUNK_SIZE", &chunk, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_TEST_CARRIER_FILES", &o->carrier_files, err, errlen)) ||
	    (ret = env_flag("CUINTERPOSE_VERIFY_BEFORE_RESTORE", &o->verify_carriers, err, errlen)) ||
	    (ret = env_num("CUINTERPOSE_LOG", &level, err, errlen)) ||
	    (ret = env_flag("CUINTERPOSE_TEST_LEAVE_RUNNING", &o->leave_running, err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_SOCKET_DIR", "", o->socket_dir, sizeof(o->socket_dir), err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_LIBCUDA", "libcuda.so.1", o->libcuda, sizeof(o->libcuda), err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_TEST_LOAD_COPIES", "async", copies, sizeof(copies), err, errlen)) ||
	    (ret = env_str("CUINTERPOSE_PARENT", "", o->parent, sizeof(o->parent), err, errlen)))
		return ret;
	{
		uint64_t mb = 0;

		ret = cuip_setting_number("CUINTERPOSE_PREFETCH_MB", &mb, err, errlen);
		if (ret < 0)
			return ret;
		o->prefetch_mb = ret == CUIP_SETTING_WORD ? -1 : (int64_t)mb; /* auto: -1 */
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
