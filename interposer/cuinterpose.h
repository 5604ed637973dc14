/*
 * cuinterpose.h - what a job may call in libcuinterpose.so (installed).
 *
 * The library is preloaded (`cuinterpose run`), so a job need not link
 * it: look the function up at run time, and run on without it when the
 * job runs without cuinterpose:
 *
 *	int (*reg)(void (*)(void *), void *) =
 *		(int (*)(void (*)(void *), void *))dlsym(RTLD_DEFAULT, "cuinterpose_on_checkpoint");
 *	if (reg)
 *		reg(empty_my_cache, my_allocator);
 */
#ifndef CUINTERPOSE_H
#define CUINTERPOSE_H

#ifdef __cplusplus
extern "C" {
#endif

/* The most hooks one process may register. */
#define CUINTERPOSE_MAX_HOOKS 16

/*
 * Run fn(arg) before each checkpoint of this process, while the job still
 * runs: the place for a framework to give back device memory it only
 * caches (a caching allocator's free blocks), so that the checkpoint
 * carries the live bytes only; after the restore the job allocates again
 * as usual. Hooks run in the order registered, on one thread of the
 * interposer's with every asynchronous signal blocked, concurrently with the job's own
 * threads, and may call CUDA. The checkpoint waits for them at most
 * 5 s (and half the quiesce bound), then goes on with the memory
 * allocated at that moment; a hook still running finishes later (its CUDA
 * calls wait while the process is checkpointed). What is allocated when
 * the gate closes is what the checkpoint carries, nothing is lost either
 * way; while they still run, a later checkpoint does not run them again.
 * Returns 0, -EINVAL (fn is NULL) or -ENOSPC (CUINTERPOSE_MAX_HOOKS
 * already registered). A hook cannot be removed; a forked child starts
 * with none.
 */
int cuinterpose_on_checkpoint(void (*fn)(void *arg), void *arg);

#ifdef __cplusplus
}
#endif

#endif /* CUINTERPOSE_H */
