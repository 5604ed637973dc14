/*
 * progress.h - the page where a process publishes how far its SAVE is.
 *
 * The plugin creates a memfd of CUIP_PROGRESS_PAGE bytes, maps it and
 * passes it after the carrier files when Save.progress_page is set. The
 * process (carrier/carrier.c and save.c, through
 * interposer/checkpoint/carry.c) maps it shared and stores into it while it
 * saves; the plugin's monitor reads it for its progress lines and its stall
 * bound. Without it the monitor could only count the blocks of the carrier
 * files, and a scan that finds every chunk zero or unchanged writes none: a
 * long scan would look stalled.
 *
 * Single writer (the saving process), any number of readers: each field is
 * stored and loaded with relaxed 64-bit atomics, and only grows during one
 * SAVE. A reader never trusts it beyond the SAVE's total.
 */
#ifndef CUIP_PROGRESS_H
#define CUIP_PROGRESS_H

#include <stdint.h>

#define CUIP_PROGRESS_PAGE  4096u
#define CUIP_PROGRESS_MAGIC 0x31676f7270706975ull /* "uipprog1" */

struct cuip_save_progress {
	uint64_t magic;	  /* CUIP_PROGRESS_MAGIC once the process has started writing */
	uint64_t scanned; /* bytes scanned on the device so far */
	uint64_t copied;  /* bytes copied to the host (and written) so far */
	uint64_t done;	  /* bytes decided: left behind by the scan (zero or unchanged) plus copied */
};

static inline void cuip_progress_store(volatile uint64_t *f, uint64_t v)
{
	__atomic_store_n(f, v, __ATOMIC_RELAXED);
}

static inline uint64_t cuip_progress_load(const volatile uint64_t *f)
{
	return __atomic_load_n(f, __ATOMIC_RELAXED);
}

#endif /* CUIP_PROGRESS_H */
