/*
 * settings.c - the table of CUINTERPOSE_* settings and its checks; see
 * settings.h. Stateless; the table is read-only.
 *
 * One row per variable that product code (interposer/, plugin/, carrier/,
 * protocol/, cli/) reads. A number's or a yes/no's range and default are
 * the readers' through cuip_setting_number; a default that is no number
 * ("ask CRIU", "0 (by size...)" aside) is the reader's own, in `where`
 * (test/unit/test_settings.c checks that every such default is a number in
 * its range, and test/unit/settings.sh the names).
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "errfmt.h"
#include "settings.h"
#include "zchunk.h"

#define J      CUIP_READER_JOB
#define P      CUIP_READER_PLUGIN
#define C      CUIP_READER_CLI
#define USER   CUIP_SETTING_USER
#define HOOK   CUIP_SETTING_HOOK
#define REFUSE CUIP_BAD_REFUSE
#define NONE   CUIP_BAD_NONE
#define HEX    CUIP_SETTING_HEX

/* Fields: name, type, unit, min, max, values, default, readers, kind, bad,
 * flags, where, meaning. */
#define ROW(n, t, u, lo, hi, v, d, r, k, b, f, w, m)                   \
	{                                                              \
		n, CUIP_SETTING_##t, u, lo, hi, v, d, r, k, b, f, w, m \
	}

const struct cuip_setting cuip_settings[] = {
	/* ---- criu's plugin (plugin/options.c cuip_opts_load unless named) ---- */
	ROW("CUINTERPOSE_LOCK_TIMEOUT_MS", MS, NULL, 0, 3600000, NULL, "0 (CRIU's --timeout, 10 s)", P, USER, REFUSE,
	    HEX, "plugin/options.c:cuip_opts_load",
	    "How long cuCheckpointProcessLock may wait for a process's CUDA calls in flight."),
	ROW("CUINTERPOSE_DRIVER_TIMEOUT_MS", MS, NULL, 0, 2147483647, NULL, "5000", P, USER, REFUSE, 0,
	    "plugin/options.c:cuip_opts_load (checked), plugin/agent.c:answer_wait_ms",
	    "How long the driver may take for its other answers (GetState, a lock beyond its timeout); 0: forever."),
	ROW("CUINTERPOSE_TEST_OP_TIMEOUT_MS", MS, NULL, 0, 3600000, NULL, "60000", P, HOOK, REFUSE, HEX,
	    "plugin/options.c:cuip_opts_load",
	    "Limit for one control request (handshake, inspect, quiesce, rebuild, verify, resume); 0: none."),
	ROW("CUINTERPOSE_TEST_DATA_TIMEOUT_MS", MS, NULL, 0, 86400000, NULL, "0 (no limit)", P, HOOK, REFUSE, HEX,
	    "plugin/options.c:cuip_opts_load",
	    "Limit for the whole of SAVE, LOAD and REBUILD, which move the carried bytes."),
	ROW("CUINTERPOSE_STALL_TIMEOUT_MS", MS, NULL, 0, 86400000, NULL, "60000", P, USER, REFUSE, HEX,
	    "plugin/options.c:cuip_opts_load",
	    "How long SAVE, LOAD and REBUILD may go without progress before the phase fails; 0: off."),
	ROW("CUINTERPOSE_QUIESCE_TIMEOUT_MS", MS, NULL, 1, 3600000, NULL, "10000", P, USER, REFUSE, HEX,
	    "plugin/options.c:cuip_opts_load",
	    "How long the interposer may wait for calls in flight when it closes its API gate."),
	ROW("CUINTERPOSE_TEST_QUIESCE_RETRIES", INT, "retries", 0, 100, NULL, "3", P, HOOK, REFUSE, HEX,
	    "plugin/options.c:cuip_opts_load",
	    "When closing the gates times out, reopen them, wait and try again this many more times."),
	ROW("CUINTERPOSE_START_WAIT_MS", MS, NULL, 1, 3600000, NULL, "5000", P, USER, REFUSE, HEX,
	    "plugin/options.c:cuip_opts_load",
	    "How long discovery waits for a process inside its first cuInit; past it the dump is refused."),
	ROW("CUINTERPOSE_PROGRESS_MS", MS, NULL, 0, 3600000, NULL, "5000 (the command: 1000 on a terminal)", P | C,
	    USER, REFUSE, HEX, "plugin/options.c:cuip_opts_load, cli/cli_criu.c:run_criu (whether set)",
	    "Interval of the SAVE/LOAD 'in progress' log lines; 0: off."),
	ROW("CUINTERPOSE_TEST_CHUNK_SIZE", INT, "bytes", 4096, 1073741824, NULL, "1048576", P | C, HOOK, REFUSE, 0,
	    "plugin/options.c:cuip_opts_load, cli/cli_precopy.c:cli_precopy",
	    "Bytes per checksum and per hash in the carrier images (precopy must match the dump's)."),
	ROW("CUINTERPOSE_TEST_CARRIER_FILES", INT, "files", 0, 64, NULL,
	    "0 (by size: one per 256 MiB, at most 16 and the CPUs)", P, HOOK, REFUSE, HEX,
	    "plugin/options.c:cuip_opts_load", "Files each creating process's carrier is striped over."),
	ROW("CUINTERPOSE_VERIFY_BEFORE_RESTORE", BOOL, NULL, 0, 0, NULL, "0", P, USER, REFUSE, 0,
	    "plugin/options.c:cuip_opts_load",
	    "1: criu's plugin reads and checks every carrier before it restores any process natively."),
	ROW("CUINTERPOSE_TEST_LEAVE_RUNNING", BOOL, NULL, 0, 0, NULL, "ask CRIU (--leave-running)", P, HOOK, REFUSE, 0,
	    "plugin/options.c:cuip_opts_load",
	    "Force (1) or deny (0) the in-place restore at the end of a successful dump."),
	ROW("CUINTERPOSE_TEST_LOAD_COPIES", ENUM, NULL, 0, 0, "async|sync", "async", P, HOOK, REFUSE, 0,
	    "plugin/options.c:cuip_opts_load",
	    "How LOAD copies carried bytes back to the device: on each thread's streams, or one at a time."),
	ROW("CUINTERPOSE_PREFETCH_MB", MIB, NULL, 0, 1ull << 40, "auto", "0 (off)", P, USER, REFUSE, 0,
	    "plugin/options.c:cuip_opts_load",
	    "Read the carriers ahead into the page cache during a restore, at most this many MiB (auto: half of "
	    "MemAvailable)."),
	ROW("CUINTERPOSE_PARENT", PATH, NULL, 0, 0, NULL, "none (a full dump)", P, USER, REFUSE, 0,
	    "plugin/options.c:cuip_opts_load", "Dump incrementally against the checkpoint in this directory."),
	ROW("CUINTERPOSE_GPU_REMAP", LIST, NULL, 0, 64, "OLDUUID=NEWUUID[,...] (at most 64 pairs), or auto",
	    "none (the same GPUs)", P, USER, REFUSE, 0, "plugin/options.c:cuip_opts_load",
	    "Restore onto other GPUs: pairs of the images' GPUs and this machine's, or auto (by ordinal where clear)."),
	ROW("CUINTERPOSE_GUARDIAN_STOP_MS", MS, NULL, 0, 3600000, NULL, "10000", P, USER, REFUSE, 0,
	    "plugin/guardian.c:stop_bound",
	    "How long criu may stay stopped during a checkpoint before the guardian kills it and rolls back; 0: "
	    "forever."),
	ROW("CUINTERPOSE_LIBCUDA", PATH, NULL, 0, 0, NULL, "libcuda.so.1", P | C, USER, REFUSE, 0,
	    "plugin/options.c:cuip_opts_load, cli/cli_check.c:check_driver",
	    "The driver library the plugin's native agent and `cuinterpose check` load."),
	ROW("CUINTERPOSE_SOCKET_DIR", PATH, NULL, 0, 0, NULL, "/run/cuinterpose (else /tmp/cuinterpose-UID)", J | P | C,
	    USER, REFUSE, 0,
	    "interposer/entry/control.c:sock_dir, plugin/options.c:cuip_opts_load (unused), "
	    "cli/cli_inspect.c:cli_find_socket, cli/cli_check.c:check_sockdir",
	    "Directory of the jobs' control sockets (the plugin finds them through sock_diag)."),
	ROW("CUINTERPOSE_TEST_FAULT", ENUM, NULL, 0, 0, "kill@POINT|stop@POINT|kill-agent@POINT|kill-guardian@POINT",
	    "none", P, HOOK, REFUSE, 0, "plugin/fault.c:cuip_fault_load",
	    "Fault injection: kill or stop criu (or its agent or guardian) once at a named point."),
	ROW("CUINTERPOSE_TEST_LOG", FLAG, NULL, 0, 0, NULL, "unset (off)", P, HOOK, NONE, 0,
	    "plugin/criulog.c:cuip_log", "Unit tests: the plugin outside criu copies its info lines to stderr."),

	/* ---- the job's processes: the interposer and its carrier ---- */
	ROW("CUINTERPOSE_PRIVATE", ENUM, NULL, 0, 0, "carrier|native", "carrier", J, USER, REFUSE, 0,
	    "interposer/core/runtime.c:cuip_init",
	    "Never-shared tracked memory goes through the carrier, or is left to the native checkpoint."),
	ROW("CUINTERPOSE_TEST_STACKS", ENUM, NULL, 0, 0, "lower|keep", "lower", J, HOOK, REFUSE, 0,
	    "interposer/core/runtime.c:cuip_init",
	    "Lower every context's stack limit to 0 before the native checkpoint, set back at RESUME."),
	ROW("CUINTERPOSE_RELEASE", ENUM, NULL, 0, 0, "torch|cupy|python:STATEMENT|none", "none", J, USER, REFUSE, 0,
	    "interposer/checkpoint/release.c:release_env",
	    "What the job gives back before each checkpoint, so that only live memory is carried."),
	ROW("CUINTERPOSE_TEST_RELEASE_TIMEOUT_MS", MS, NULL, 1, 3600000, NULL, "5000", J, HOOK, REFUSE, 0,
	    "interposer/checkpoint/release.c:release_env",
	    "The most a checkpoint waits for the release hooks (at most half of CUINTERPOSE_QUIESCE_TIMEOUT_MS)."),
	ROW("CUINTERPOSE_LOG", INT, "level", 0, 3, NULL, "1", J | P, USER, REFUSE, 0,
	    "interposer/core/log.c:log_init, plugin/options.c:cuip_opts_load",
	    "Log level: the interposer's stderr 0 quiet, 1 errors, 2 info, 3 debug; 2 or more also puts the "
	    "plugin's per-participant lines at info level."),
	ROW("CUINTERPOSE_STAGING_MB", MIB, NULL, 1, 1048576, NULL, "224", J, USER, REFUSE, 0,
	    "carrier/config.c:carrier_config_init",
	    "Most pinned host staging per creating process for carrier copies."),
	ROW("CUINTERPOSE_TEST_CHUNK_MB", MIB, NULL, 1, 256, NULL, "1", J, HOOK, REFUSE, 0,
	    "carrier/config.c:carrier_config_init",
	    "Chunk of carrier items saved without one; the interposer always passes CUINTERPOSE_TEST_CHUNK_SIZE's, so "
	    "only "
	    "direct carrier users (carrier-bench, test/carrier) see it."),
	ROW("CUINTERPOSE_TEST_CARRIER_THREADS", INT, "threads", 0, 64, NULL,
	    "0 (2 per file to save, 12 to load, at most 16 and the CPUs)", J, HOOK, REFUSE, 0,
	    "carrier/config.c:carrier_config_init", "I/O threads per carrier save or load, the caller included."),
	ROW("CUINTERPOSE_TEST_LOAD_VERIFY", ENUM, NULL, 0, 0, "chunk|first", "chunk", J, HOOK, REFUSE, 0,
	    "carrier/config.c:carrier_config_init",
	    "In the job's LOAD: check each chunk as it loads, or the whole carrier before any byte reaches the "
	    "device."),
	ROW("CUINTERPOSE_CARRIER_HASH", ENUM, NULL, 0, 0, "device|sha256|off", "device", J, USER, REFUSE, 0,
	    "carrier/config.c:carrier_config_init",
	    "Each chunk's hash at SAVE (on the device, or SHA-256 on the host), which makes the checkpoint a parent."),
	ROW("CUINTERPOSE_CARRIER_COMPRESS", ENUM, NULL, 0, 0, "off|zstd|zstd:LEVEL (-7 .. 19)", "off", J, USER, REFUSE,
	    0, "carrier/config.c:carrier_config_init, protocol/zchunk.c:cuip_zchunk_parse",
	    "Store compressible carrier chunks as zstd frames."),

	/* ---- the cuinterpose command ---- */
	ROW("CUINTERPOSE_LIB", PATH, NULL, 0, 0, NULL, "the build tree's libcuinterpose.so, else the installed one", C,
	    USER, REFUSE, 0, "cli/cli_lib.c:cli_find_lib", "The interposer library `cuinterpose run` preloads."),
};

const size_t cuip_settings_count = sizeof(cuip_settings) / sizeof(cuip_settings[0]);

const struct cuip_setting *cuip_setting_find(const char *name)
{
	for (size_t i = 0; i < cuip_settings_count; i++)
		if (!strcmp(cuip_settings[i].name, name))
			return &cuip_settings[i];
	return NULL;
}

const char *cuip_setting_type_name(enum cuip_setting_type t)
{
	switch (t) {
	case CUIP_SETTING_BOOL:
		return "bool";
	case CUIP_SETTING_FLAG:
		return "flag";
	case CUIP_SETTING_INT:
		return "integer";
	case CUIP_SETTING_MIB:
		return "MiB";
	case CUIP_SETTING_MS:
		return "ms";
	case CUIP_SETTING_ENUM:
		return "enum";
	case CUIP_SETTING_PATH:
		return "path";
	case CUIP_SETTING_LIST:
		return "list";
	}
	return "?";
}

const char *cuip_setting_bad_name(enum cuip_setting_bad b)
{
	switch (b) {
	case CUIP_BAD_REFUSE:
		return "refuse";
	case CUIP_BAD_NONE:
		return "none";
	}
	return "?";
}

void cuip_setting_readers(unsigned readers, char *buf, size_t len)
{
	static const char *const names[] = {"job", "plugin", "cli"};
	size_t n = 0;

	if (!len)
		return;
	buf[0] = 0;
	for (unsigned i = 0; i < 3; i++) {
		if (!(readers & (1u << i)))
			continue;
		int w = snprintf(buf + n, len - n, "%s%s", n ? "+" : "", names[i]);
		if (w < 0 || (size_t)w >= len - n)
			return;
		n += (size_t)w;
	}
}

void cuip_setting_range(const struct cuip_setting *s, char *buf, size_t len)
{
	switch (s->type) {
	case CUIP_SETTING_BOOL:
		snprintf(buf, len, "1|yes|true|on or 0|no|false|off");
		break;
	case CUIP_SETTING_FLAG:
		snprintf(buf, len, "set (any value) or unset");
		break;
	case CUIP_SETTING_INT:
	case CUIP_SETTING_MIB:
	case CUIP_SETTING_MS:
		snprintf(buf, len, "%s, %llu .. %llu%s%s",
			 s->type == CUIP_SETTING_MS    ? "ms"
			 : s->type == CUIP_SETTING_MIB ? "MiB"
						       : s->unit,
			 (unsigned long long)s->min, (unsigned long long)s->max, s->values ? ", or " : "",
			 s->values ? s->values : "");
		break;
	case CUIP_SETTING_ENUM:
		snprintf(buf, len, "%s", s->values);
		break;
	case CUIP_SETTING_PATH:
		snprintf(buf, len, "a path, shorter than %d bytes", PATH_MAX);
		break;
	case CUIP_SETTING_LIST:
		snprintf(buf, len, "%s", s->values);
		break;
	}
}

/* Whether v is one of the '|'-separated words of list (a word ending in
 * "@POINT", ":LEVEL" or ":STATEMENT" takes any non-empty tail; the
 * parenthesis after a word is a comment). */
static int one_of(const char *v, const char *list)
{
	const char *p = list;

	while (*p) {
		size_t n = strcspn(p, "| ");
		const char *tail = NULL;

		for (size_t k = 0; k < n; k++)
			if (p[k] == '@' || (p[k] == ':' && k + 1 < n && isupper((unsigned char)p[k + 1])))
				tail = p + k + 1;
		if (tail) {
			size_t head = (size_t)(tail - p);
			if (!strncmp(v, p, head) && v[head])
				return 1;
		} else if (strlen(v) == n && !strncmp(v, p, n)) {
			return 1;
		}
		p += n;
		p += strcspn(p, "|");
		if (*p == '|')
			p++;
	}
	return 0;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = tolower(c);
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int cuip_parse_uuid(const char *s, size_t len, uint8_t out[16])
{
	unsigned nib = 0;

	while (len && isspace((unsigned char)*s)) {
		s++;
		len--;
	}
	while (len && isspace((unsigned char)s[len - 1]))
		len--;
	if (len >= 4 && !strncasecmp(s, "GPU-", 4)) {
		s += 4;
		len -= 4;
	}
	for (size_t i = 0; i < len; i++) {
		int v;

		if (s[i] == '-')
			continue;
		v = hexval((unsigned char)s[i]);
		if (v < 0 || nib >= 32)
			return -EINVAL;
		if (nib % 2 == 0)
			out[nib / 2] = (uint8_t)(v << 4);
		else
			out[nib / 2] |= (uint8_t)v;
		nib++;
	}
	return nib == 32 ? 0 : -EINVAL;
}

static int remap_ok(const char *v, uint64_t max)
{
	uint8_t olds[64][16];
	unsigned n = 0;
	const char *p = v;

	if (!strcmp(v, "auto"))
		return 1;
	while (*p) {
		const char *end = strchr(p, ',');
		const char *eq;
		uint8_t new_uuid[16];

		if (!end)
			end = p + strlen(p);
		if (end == p) {
			if (*end)
				return 0; /* only a trailing comma may be empty */
			break;
		}
		eq = memchr(p, '=', (size_t)(end - p));
		if (!eq || n >= max || n >= 64 || cuip_parse_uuid(p, (size_t)(eq - p), olds[n]) ||
		    cuip_parse_uuid(eq + 1, (size_t)(end - eq - 1), new_uuid))
			return 0;
		for (unsigned i = 0; i < n; i++)
			if (!memcmp(olds[i], olds[n], 16))
				return 0;
		n++;
		p = *end ? end + 1 : end;
	}
	return 1;
}

static int number_ok(const struct cuip_setting *s, const char *v)
{
	unsigned long long x;
	char *end;

	if (s->values && one_of(v, s->values))
		return 1;
	if (!isdigit((unsigned char)v[0]))
		return 0;
	errno = 0;
	x = strtoull(v, &end, (s->flags & CUIP_SETTING_HEX) ? 0 : 10);
	return !errno && !*end && x >= s->min && x <= s->max;
}

static int truthy(const char *v)
{
	return !strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "true") || !strcasecmp(v, "on");
}

int cuip_setting_check(const struct cuip_setting *s, const char *value, char *err, size_t errlen)
{
	char range[160];
	int ok = 1, level, on;

	if (!value || (!*value && s->type != CUIP_SETTING_FLAG))
		return 0;
	switch (s->type) {
	case CUIP_SETTING_BOOL:
		ok = truthy(value) || !strcmp(value, "0") || !strcasecmp(value, "no") || !strcasecmp(value, "false") ||
		     !strcasecmp(value, "off");
		break;
	case CUIP_SETTING_FLAG:
		break;
	case CUIP_SETTING_INT:
	case CUIP_SETTING_MIB:
	case CUIP_SETTING_MS:
		ok = number_ok(s, value);
		break;
	case CUIP_SETTING_ENUM:
		if (!strcmp(s->name, "CUINTERPOSE_CARRIER_COMPRESS"))
			ok = !cuip_zchunk_parse(value, &level, &on); /* the reader's own parser */
		else
			ok = one_of(value, s->values);
		if (ok && !strcmp(s->name, "CUINTERPOSE_TEST_FAULT")) /* plugin/fault.c's bounds */
			ok = strcspn(value, "@") < 16 && strlen(strchr(value, '@') + 1) < 64;
		break;
	case CUIP_SETTING_PATH:
		ok = strlen(value) < PATH_MAX;
		break;
	case CUIP_SETTING_LIST:
		ok = remap_ok(value, s->max);
		break;
	}
	if (ok)
		return 0;
	cuip_setting_range(s, range, sizeof(range));
	errfmt(err, errlen, "%s=%s: want %s", s->name, value, range);
	return -EINVAL;
}

int cuip_settings_check_env(unsigned readers, char *err, size_t errlen)
{
	for (size_t i = 0; i < cuip_settings_count; i++) {
		const struct cuip_setting *s = &cuip_settings[i];

		if ((s->readers & readers) && cuip_setting_check(s, getenv(s->name), err, errlen))
			return -EINVAL;
	}
	return 0;
}

int cuip_setting_number(const char *name, uint64_t *out, char *err, size_t errlen)
{
	const struct cuip_setting *s = cuip_setting_find(name);
	const char *v = getenv(name);
	bool has_default;

	if (!s || (s->type != CUIP_SETTING_BOOL && s->type != CUIP_SETTING_INT && s->type != CUIP_SETTING_MIB &&
		   s->type != CUIP_SETTING_MS)) {
		errfmt(err, errlen, "%s is no number or yes/no setting of the table", name);
		return -ENOENT;
	}
	/* the default: the whole number the row's default starts with */
	has_default = isdigit((unsigned char)s->dflt[0]);
	if (has_default)
		*out = strtoull(s->dflt, NULL, 10);
	if (cuip_setting_check(s, v, err, errlen))
		return -EINVAL;
	if (!v || !*v)
		return has_default ? 0 : CUIP_SETTING_UNSET;
	if (s->type == CUIP_SETTING_BOOL) {
		*out = truthy(v);
		return 0;
	}
	if (s->values && one_of(v, s->values))
		return CUIP_SETTING_WORD;
	*out = strtoull(v, NULL, (s->flags & CUIP_SETTING_HEX) ? 0 : 10);
	return 0;
}
