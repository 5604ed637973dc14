/*
 * lifecycle.c - the top of the interposer: what starts and stops with the
 * process. When the runtime starts (after the first successful cuInit) its
 * start hook starts the control server; at exit the process that started
 * it unlinks its socket. Nothing calls this module; it is reached only
 * through the runtime's start hook and the exit destructor. No state, no
 * lock of its own.
 */
#include <unistd.h>

#include "control.h"
#include "runtime.h"

CUIP_START_HOOK(control, cuip_ctl_start);

__attribute__((destructor)) static void lifecycle_fini(void)
{
	if (cuip_started() && self.pid == getpid())
		cuip_ctl_stop();
}
