/*
 * prefetch.h - a restore's images read ahead into the page cache.
 *
 * From cold storage a restore leaves part of the disk idle: while criu
 * restores the processes (each reads its own pages-*.img, one request at a
 * time) and while the native restore runs, the carriers wait for LOAD.
 * At the start of a restore (cuip_prefetch_start, from the hooks' init)
 * one reader process reads the carrier files LOAD will read (a chain's
 * ancestors' files too) into the page cache, in LOAD's order: each file's
 * data only (holes are skipped), what is already cached not again, one
 * block at a time per thread (four) at the lowest best-effort I/O
 * priority, and no more than a budget, so that it never evicts what it
 * brought in before LOAD comes (CUINTERPOSE_PREFETCH_MB: MiB, or auto for
 * half the host's available memory; 0, the default: off). It is stopped
 * when LOAD starts, which reads the rest with all its threads.
 *
 * Off by default because it measured no clear gain on the H200's disk
 * (docs/benchmarks.md): the cold restore of the 8 GiB LLM job took 0.90x
 * as long with it, the 2 GiB one 1.11x; the disk's bandwidth is what both
 * the reader and criu's own reads of its page images need. A first reader
 * that asked the kernel for criu's page images and the carriers all at
 * once queued criu's reads behind 11 GB (1.19x slower); criu's page images
 * are therefore not read ahead.
 *
 * The reader is not criu's child: criu's restore waits for any of its
 * children (compel's wait4(-1, __WALL)) and calls one it did not expect an
 * error. A process in between forks it and exits at once; the reader then
 * belongs to init (or the nearest subreaper), which reaps it. criu holds
 * its pidfd, and the reader watches criu's: it ends when criu does, and
 * cuip_prefetch_stop (before LOAD, at RESUME_DEVICES_LATE when there is
 * none, and at fini) stops it if it still runs. It is advisory: it
 * changes nothing of what the restore reads or checks, and what goes
 * wrong in it is logged, never the restore's failure.
 *
 * Owns the reader's pid and a shared page of counters (criu's main thread
 * only). Calls the protocol library (the checkpoint's carrier files) and
 * the log.
 */
#ifndef CUIP_PLUGIN_PREFETCH_H
#define CUIP_PLUGIN_PREFETCH_H

#include <stdint.h>

struct cuip_ckpt;

/* budget_mb: the most MiB to read ahead, or -1 for half of MemAvailable.
 * ck: the checkpoint as cuip_images_read gave it. */
void cuip_prefetch_start(int dirfd, const struct cuip_ckpt *ck, int64_t budget_mb);

/* Stop the reader if it still runs and reap it; `when` names the hook for
 * the log. Nothing when none was started. */
void cuip_prefetch_stop(const char *when);

#endif /* CUIP_PLUGIN_PREFETCH_H */
