/*
 * prefetch.h - a restore's images read ahead into the page cache.
 *
 * From cold storage a restore leaves the disk idle much of the time: each
 * restored process reads its own pages-*.img, one read at a time, and the
 * carriers wait for LOAD, which comes after criu's restore and the native
 * one. At the start of a restore (cuip_prefetch_start, from the hooks'
 * init) one reader process asks the kernel to read ahead, in the order
 * they will be needed, criu's page images and then every carrier file the
 * participants will LOAD (a chain's ancestors' files too): each file's data
 * only (holes are skipped), what is already cached is not asked for again,
 * and no more than a budget, so that read-ahead never evicts what it
 * brought in before its reader comes (CUINTERPOSE_PREFETCH_MB; by default
 * half the host's available memory; 0: off).
 *
 * The reader is not criu's child: criu's restore waits for any of its
 * children (compel's wait4(-1, __WALL)) and calls one it did not expect an
 * error. A process in between forks it and exits at once; the reader then
 * belongs to init (or the nearest subreaper), which reaps it. criu holds
 * its pidfd, and the reader watches criu's: it ends when criu does, and
 * cuip_prefetch_stop (RESUME_DEVICES_LATE, when LOAD has read everything,
 * and fini) stops it if it still runs. It is advisory: it changes nothing
 * of what the restore reads or checks, and what goes wrong in it is
 * logged, never the restore's failure.
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
 * ck: the checkpoint as cuip_images_read gave it (NULL: criu's pages only). */
void cuip_prefetch_start(int dirfd, const struct cuip_ckpt *ck, int64_t budget_mb);

/* Stop the reader if it still runs and reap it; `when` names the hook for
 * the log. Nothing when none was started. */
void cuip_prefetch_stop(const char *when);

#endif /* CUIP_PLUGIN_PREFETCH_H */
