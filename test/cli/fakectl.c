/*
 * fakectl.c - `fakectl DIR MODE`: a stand-in for an interposer's control
 * socket, so that test_inspect_errors.sh can drive `cuinterpose inspect`
 * into the answers a real interposer does not give. It listens on
 * DIR/<pid>-0123456789abcdef.sock, prints "ready" once it does, answers
 * HANDSHAKE as a real interposer would, then INSPECT as MODE says:
 *   nostate  status 0 but a HandshakeReply instead of a ProcessState
 *   refuse   status -EBUSY, "busy right now"
 * and BYE with status 0, closing after it. Serves connections one at a
 * time until killed. Single-threaded, no locks.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

static int serve_one(int c, int nostate)
{
	Cuip__ProcessId self = CUIP__PROCESS_ID__INIT;
	Cuip__HandshakeReply hr = CUIP__HANDSHAKE_REPLY__INIT;

	self.id = 0x1122334455667788ull;
	self.pid = (int32_t)getpid();
	hr.self = &self;
	hr.phase = CUIP__PHASE__PHASE_ACTIVE;
	hr.version = "fakectl";
	for (;;) {
		Cuip__Response resp = CUIP__RESPONSE__INIT;
		ProtobufCMessage *m = NULL;
		char err[256];
		int body, ret;

		if (cuip_msg_recv(c, CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &m, NULL, err, sizeof(err)))
			return 0; /* the client went away */
		body = ((Cuip__Request *)m)->body_case;
		protobuf_c_message_free_unpacked(m, NULL);
		if (body == CUIP__REQUEST__BODY_HANDSHAKE || (body == CUIP__REQUEST__BODY_INSPECT && nostate)) {
			resp.body_case = CUIP__RESPONSE__BODY_HANDSHAKE;
			resp.handshake = &hr;
		} else if (body == CUIP__REQUEST__BODY_INSPECT) {
			resp.status = -EBUSY;
			resp.error = "busy right now";
		} else if (body != CUIP__REQUEST__BODY_BYE) {
			resp.status = -ENOSYS;
			resp.error = "fakectl answers HANDSHAKE, INSPECT and BYE only";
		}
		ret = cuip_msg_send(c, CUIP_KIND_RESPONSE, &resp.base, -1);
		if (ret || body == CUIP__REQUEST__BODY_BYE)
			return ret;
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int s, nostate;

	if (argc != 3 || (strcmp(argv[2], "nostate") && strcmp(argv[2], "refuse"))) {
		fprintf(stderr, "usage: fakectl DIR nostate|refuse\n");
		return 2;
	}
	nostate = !strcmp(argv[2], "nostate");
	signal(SIGPIPE, SIG_IGN);
	if (snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%d-0123456789abcdef.sock", argv[1], (int)getpid()) >=
	    (int)sizeof(sa.sun_path)) {
		fprintf(stderr, "fakectl: %s: path too long for a unix socket\n", argv[1]);
		return 1;
	}
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 4)) {
		fprintf(stderr, "fakectl: %s: %s\n", sa.sun_path, strerror(errno));
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);

		if (c < 0 && errno == EINTR)
			continue;
		if (c < 0) {
			fprintf(stderr, "fakectl: accept: %s\n", strerror(errno));
			return 1;
		}
		serve_one(c, nostate);
		close(c);
	}
}
