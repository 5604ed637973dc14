/*
 * tracee.h - letting chosen threads of a ptrace-frozen process run for a
 * while (the driver's restore thread, the interposer's "cuip-*" threads)
 * and stopping them again, as CRIU's cuda_plugin does for the restore
 * thread.
 *
 * CRIU is the tracer of every thread while the device hooks run: at
 * CHECKPOINT_DEVICES and fini(DUMP) threads sit in a PTRACE_INTERRUPT stop,
 * at RESUME_DEVICES_LATE in the syscall-exit stop of rt_sigreturn. Only
 * the tracer thread (the one running the hook) may issue these requests,
 * so they are serial; the work the threads then do is parallel. A thread
 * that criu does not trace (TracerPid is not us: the dump has not frozen it
 * yet, or has let it go) is left alone and reported as such.
 */
#ifndef CUIP_PLUGIN_TRACEE_H
#define CUIP_PLUGIN_TRACEE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct cuip_tracee {
	pid_t pid; /* process */
	pid_t tid; /* thread */
	uint64_t saved_mask;
	bool resumed; /* we let it run and must stop it again */
};

/* Block every signal but SIGTRAP, clear the options, PTRACE_CONT.
 * 0 (also when the thread is not ptrace-stopped by us: nothing to do) or -errno. */
int cuip_tracee_resume(struct cuip_tracee *t);

/* PTRACE_INTERRUPT, wait for the stop, restore options and mask. */
int cuip_tracee_stop(struct cuip_tracee *t);

#endif /* CUIP_PLUGIN_TRACEE_H */
