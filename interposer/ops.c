/*
 * ops.c - plugin operations, run one at a time by the "cuip-op" thread.
 *
 * INSPECT answers the tracked state. The checkpoint operations (QUIESCE,
 * PREPARE_*, SAVE, LOAD, REBUILD, VERIFY, RESUME) drive the lifecycle
 * ACTIVE -> QUIESCED -> PREPARED -> RESTORING -> ACTIVE (or FAILED).
 * Replies come from the reply arena (inspect.c).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cuip.h"

static Cuip__Response *reply(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static Cuip__Response *reply(int status, const char *fmt, ...)
{
	Cuip__Response *r = cuip_zalloc(sizeof(*r));
	char buf[512];
	va_list ap;

	if (!r)
		return NULL;
	cuip__response__init(r);
	r->status = status;
	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(buf, sizeof(buf), fmt, ap);
		va_end(ap);
		r->error = cuip_strdup(buf);
		if (status)
			pr_err("%s", buf);
	}
	return r;
}

static Cuip__Response *op_inspect(void)
{
	Cuip__Response *r = reply(0, NULL);

	if (!r)
		return NULL;
	pthread_mutex_lock(&cuip_state_lock);
	r->state = cuip_state_build();
	pthread_mutex_unlock(&cuip_state_lock);
	if (!r->state)
		return reply(-ENOMEM, "out of memory building the state");
	r->body_case = CUIP__RESPONSE__BODY_STATE;
	return r;
}

Cuip__Response *cuip_op_run(const Cuip__Request *req, int fd)
{
	Cuip__Response *r;

	switch (req->body_case) {
	case CUIP__REQUEST__BODY_INSPECT:
		r = op_inspect();
		break;
	default:
		r = reply(-ENOSYS, "request %d is not implemented by this interposer", (int)req->body_case);
		break;
	}
	if (fd >= 0)
		close(fd);
	return r;
}

void cuip_response_free(Cuip__Response *r)
{
	(void)r;
	cuip_arena_release();
}
