/*
 * The checkpoint mailbox: one page of a memfd named "fakecuda-mailbox",
 * mapped MAP_SHARED in every process that called cuInit.  A checkpoint caller
 * (cuCheckpointProcess* in another process) finds it in /proc/PID/maps, maps
 * it through /proc/PID/map_files/ and rings the doorbell; the target's restore
 * thread does the work and answers.  CRIU dumps and restores memfd shared
 * mappings, so the channel survives `criu dump`/`criu restore`, and it holds
 * no descriptor that would stop a dump.
 *
 * Written by restore_thread.c (target side) and checkpoint.c (caller side).
 * Callers serialize with flock() on their map_files descriptor; the two
 * futex words (req_seq, done_seq) are shared futexes.
 */
#ifndef FAKECUDA_MAILBOX_H
#define FAKECUDA_MAILBOX_H

#include <cuda.h>
#include <stdint.h>

#include "devdwire.h"

#define FK_MB_NAME    "fakecuda-mailbox"
#define FK_MB_MAGIC   0x424d4b46u /* "FKMB" */
#define FK_MB_VERSION 1
#define FK_MB_SIZE    4096

enum fk_mb_action {
	FK_MB_LOCK = 1,
	FK_MB_CHECKPOINT,
	FK_MB_RESTORE,
	FK_MB_UNLOCK,
	FK_MB_STATE, /* answered by the restore thread too, as on NVIDIA's driver */
};

struct fk_mailbox {
	uint32_t magic;
	uint32_t version;
	int32_t pid;	     /* the target process */
	int32_t restore_tid; /* its restore thread */
	uint32_t state;	     /* CUprocessState, written by the target only */
	uint32_t req_seq;    /* doorbell: bumped by the caller after writing the request */
	uint32_t done_seq;   /* set to req_seq by the restore thread when the result is written */
	uint32_t action;     /* enum fk_mb_action */
	int32_t result;	     /* CUresult */
	uint32_t timeout_ms;
	uint32_t npairs;
	uint32_t pad;
	CUcheckpointGpuPair pairs[FKW_MAX_DEV];
};

_Static_assert(sizeof(struct fk_mailbox) <= FK_MB_SIZE, "mailbox larger than its page");

#endif
