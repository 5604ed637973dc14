/*
 * options.h - the plugin's settings, all from CUINTERPOSE_* environment
 * variables of the criu process (documented in docs/configuration.md).
 *
 * Loaded once per CRIU stage by the hooks module; read-only afterwards, so
 * the coordinator's threads read it without a lock.
 */
#ifndef CUIP_PLUGIN_OPTIONS_H
#define CUIP_PLUGIN_OPTIONS_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define CUIP_MAX_REMAP 64

struct cuip_gpu_pair {
	uint8_t old_uuid[16];
	uint8_t new_uuid[16];
};

struct cuip_opts {
	unsigned lock_timeout_ms;    /* CUINTERPOSE_LOCK_TIMEOUT_MS; 0 = take CRIU's --timeout */
	unsigned op_timeout_ms;	     /* CUINTERPOSE_TEST_OP_TIMEOUT_MS: one control request (not SAVE/LOAD) */
	unsigned data_timeout_ms;    /* CUINTERPOSE_TEST_DATA_TIMEOUT_MS: SAVE/LOAD/REBUILD in all; 0 = no limit */
	unsigned stall_timeout_ms;   /* CUINTERPOSE_STALL_TIMEOUT_MS: SAVE/LOAD/REBUILD without progress; 0 = off */
	unsigned quiesce_timeout_ms; /* CUINTERPOSE_QUIESCE_TIMEOUT_MS: draining the API gate */
	unsigned quiesce_retries;    /* CUINTERPOSE_TEST_QUIESCE_RETRIES: reopen and retry a timed-out QUIESCE */
	unsigned start_wait_ms;	     /* CUINTERPOSE_START_WAIT_MS: a process inside its first cuInit at discovery */
	unsigned progress_ms;	     /* CUINTERPOSE_PROGRESS_MS: SAVE/LOAD progress lines; 0 = off */
	uint32_t chunk_size;	     /* CUINTERPOSE_TEST_CHUNK_SIZE: bytes per carrier checksum */
	unsigned carrier_files;	     /* CUINTERPOSE_TEST_CARRIER_FILES: files per carrier; 0 = by size */
	int verify_carriers;	     /* CUINTERPOSE_VERIFY_BEFORE_RESTORE: read every carrier before LOAD */
	int verbose;		     /* CUINTERPOSE_LOG >= 2: per-participant lines at info level */
	int leave_running;	     /* CUINTERPOSE_TEST_LEAVE_RUNNING: -1 = ask CRIU */
	int load_sync;		     /* CUINTERPOSE_TEST_LOAD_COPIES=sync: LOAD's copies synchronous */
	int64_t prefetch_mb;	     /* CUINTERPOSE_PREFETCH_MB: restore read-ahead budget; -1 = auto, 0 = off */
	char socket_dir[PATH_MAX];   /* CUINTERPOSE_SOCKET_DIR, as seen inside the participants */
	char libcuda[PATH_MAX];	     /* CUINTERPOSE_LIBCUDA: driver library for native checkpoint */
	char parent[PATH_MAX];	     /* CUINTERPOSE_PARENT: dump incrementally against this checkpoint */
	struct cuip_gpu_pair remap[CUIP_MAX_REMAP]; /* CUINTERPOSE_GPU_REMAP */
	unsigned n_remap;
	int remap_auto; /* CUINTERPOSE_GPU_REMAP=auto: pair by ordinal where unambiguous */
};

/* Fill `o` from the environment. Every variable the plugin reads is first
 * checked against protocol/settings.c's table. Returns 0, or -EINVAL with
 * `err` naming the variable and the values it accepts. */
int cuip_opts_load(struct cuip_opts *o, char *err, size_t errlen);

/*
 * Parse "olduuid=newuuid,olduuid=newuuid". A UUID is 32 hex digits with
 * optional dashes and an optional "GPU-" prefix (nvidia-smi -L form).
 * Returns the number of pairs, or -EINVAL with `err` set.
 */
int cuip_parse_remap(const char *s, struct cuip_gpu_pair *pairs, unsigned max, char *err, size_t errlen);

/* Format a UUID as GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (buf >= 41). */
void cuip_format_uuid(const uint8_t uuid[16], char *buf, size_t len);

#endif /* CUIP_PLUGIN_OPTIONS_H */
