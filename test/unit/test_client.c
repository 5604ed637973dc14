/*
 * test_client.c - the one control-protocol client (protocol/client.c) against
 * a scripted server on the other end of a socketpair: the handshake's
 * answer, refusal, missing identity and timeout; a checked request's
 * refusal and its arena-decoded answer; the raw call that hands a refusal
 * back as a response; BYE waiting for the server to close, and timing out
 * when it does not. Each case runs its server in a forked child (Check's
 * fork mode) so that a stuck exchange cannot hang the suite.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client.h"
#include "gphase.h"
#include "wire.h"

enum reply {
	R_HANDSHAKE, /* a HandshakeReply naming SELF_ID / SELF_PID, phase ACTIVE */
	R_REFUSE,    /* status -EBUSY, "busy right now" */
	R_EMPTY,     /* status 0 and no body */
	R_SILENT,    /* read the request, answer nothing, keep the socket open */
	R_BYE_CLOSE, /* status 0, then close */
	R_BYE_STAY,  /* status 0, then keep the socket open */
};

#define SELF_ID	 0x1122334455667788ull
#define SELF_PID 4242

/* The server: one request, the scripted reply; the body case it received
 * is its exit status (so the test can check what the client sent). */
static pid_t serve(int *client_sock, enum reply r)
{
	int sv[2];
	pid_t pid;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		Cuip__Response resp = CUIP__RESPONSE__INIT;
		Cuip__HandshakeReply hr = CUIP__HANDSHAKE_REPLY__INIT;
		Cuip__ProcessId self = CUIP__PROCESS_ID__INIT;
		ProtobufCMessage *m = NULL;
		char err[256], c;
		int body;

		close(sv[0]);
		if (cuip_msg_recv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &m, NULL, err,
				  sizeof(err)))
			_exit(100);
		body = ((Cuip__Request *)m)->body_case;
		if (r == R_SILENT) {
			while (read(sv[1], &c, 1) > 0)
				;
			_exit(body);
		}
		if (r == R_HANDSHAKE) {
			self.id = SELF_ID;
			self.pid = SELF_PID;
			hr.self = &self;
			hr.phase = CUIP__PHASE__PHASE_ACTIVE;
			hr.version = "test";
			resp.body_case = CUIP__RESPONSE__BODY_HANDSHAKE;
			resp.handshake = &hr;
		} else if (r == R_REFUSE) {
			resp.status = -EBUSY;
			resp.error = "busy right now";
		}
		if (cuip_msg_send(sv[1], CUIP_KIND_RESPONSE, &resp.base, -1))
			_exit(101);
		if (r == R_BYE_STAY)
			pause(); /* killed by the test */
		_exit(body);
	}
	close(sv[1]);
	*client_sock = sv[0];
	return pid;
}

/* What the server received (its exit status). */
static int served(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

START_TEST(handshake_returns_who_answered)
{
	struct cuip_peer peer = {0};
	char err[256] = "";
	int s;
	pid_t pid = serve(&s, R_HANDSHAKE);

	ck_assert_int_eq(cuip_client_handshake(s, "test", 5000, &peer, err, sizeof(err)), 0);
	ck_assert_uint_eq(peer.id, SELF_ID);
	ck_assert_int_eq(peer.pid, SELF_PID);
	ck_assert_int_eq(peer.phase, CUIP__PHASE__PHASE_ACTIVE);
	close(s);
	ck_assert_int_eq(served(pid), CUIP__REQUEST__BODY_HANDSHAKE);
}
END_TEST

START_TEST(handshake_refusal_is_its_status_and_names_the_request)
{
	char err[256] = "";
	int s;
	pid_t pid = serve(&s, R_REFUSE);

	ck_assert_int_eq(cuip_client_handshake(s, "test", 5000, NULL, err, sizeof(err)), -EBUSY);
	ck_assert_str_eq(err, "HANDSHAKE refused: busy right now");
	close(s);
	ck_assert_int_eq(served(pid), CUIP__REQUEST__BODY_HANDSHAKE);
}
END_TEST

START_TEST(handshake_reply_without_identity_is_a_protocol_error)
{
	struct cuip_peer peer = {.id = 7};
	char err[256] = "";
	int s;
	pid_t pid = serve(&s, R_EMPTY);

	ck_assert_int_eq(cuip_client_handshake(s, "test", 5000, &peer, err, sizeof(err)), -EPROTO);
	ck_assert_str_eq(err, "HANDSHAKE reply carries no identity");
	ck_assert_uint_eq(peer.id, 7); /* untouched */
	close(s);
	served(pid);
}
END_TEST

START_TEST(handshake_without_reply_times_out_naming_the_limit)
{
	char err[256] = "";
	int s;
	pid_t pid = serve(&s, R_SILENT);

	ck_assert_int_eq(cuip_client_handshake(s, "test", 200, NULL, err, sizeof(err)), -ETIMEDOUT);
	ck_assert_str_eq(err, "no reply to HANDSHAKE within 200 ms");
	close(s); /* the silent server sees EOF and exits */
	ck_assert_int_eq(served(pid), CUIP__REQUEST__BODY_HANDSHAKE);
}
END_TEST

START_TEST(checked_request_refusal_leaves_no_response)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp = (Cuip__Response *)&req; /* must be reset */
	char err[256] = "";
	int s;
	pid_t pid = serve(&s, R_REFUSE);

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	ck_assert_int_eq(cuip_client_request(s, &req, -1, 5000, &resp, err, sizeof(err)), -EBUSY);
	ck_assert_ptr_null(resp);
	ck_assert_str_eq(err, "INSPECT refused: busy right now");
	close(s);
	ck_assert_int_eq(served(pid), CUIP__REQUEST__BODY_INSPECT);
}
END_TEST

START_TEST(checked_request_answer_lives_until_freed)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp = NULL;
	char err[256] = "";
	int s;
	pid_t pid = serve(&s, R_HANDSHAKE);

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	ck_assert_int_eq(cuip_client_request(s, &req, -1, 5000, &resp, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(resp);
	ck_assert_int_eq(resp->body_case, CUIP__RESPONSE__BODY_HANDSHAKE);
	ck_assert_uint_eq(resp->handshake->self->id, SELF_ID);
	ck_assert_str_eq(resp->handshake->version, "test");
	cuip_client_free(resp); /* the arena goes; ASan builds catch a leak */
	cuip_client_free(NULL);
	close(s);
	served(pid);
}
END_TEST

START_TEST(raw_call_hands_a_refusal_back_as_the_response)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Response *resp = NULL;
	char err[256] = "";
	int s, fd = 12345;
	pid_t pid = serve(&s, R_REFUSE);

	req.body_case = CUIP__REQUEST__BODY_RESUME;
	req.resume = 1;
	ck_assert_int_eq(cuip_client_call(s, &req, -1, &resp, &fd, err, sizeof(err)), 0);
	ck_assert_int_eq(fd, -1); /* no descriptor came */
	ck_assert_int_eq(resp->status, -EBUSY);
	ck_assert_str_eq(resp->error, "busy right now");
	cuip__response__free_unpacked(resp, NULL);
	close(s);
	ck_assert_int_eq(served(pid), CUIP__REQUEST__BODY_RESUME);
}
END_TEST

START_TEST(bye_waits_for_the_server_to_close)
{
	int s;
	pid_t pid = serve(&s, R_BYE_CLOSE);

	ck_assert_int_eq(cuip_client_bye(s, 5000), 0); /* closes s */
	ck_assert_int_eq(fcntl(s, F_GETFD), -1);
	ck_assert_int_eq(served(pid), CUIP__REQUEST__BODY_BYE);
	ck_assert_int_eq(cuip_client_bye(-1, 5000), 0); /* nothing to say goodbye to */
}
END_TEST

START_TEST(bye_times_out_when_the_server_keeps_the_connection)
{
	int s, st;
	pid_t pid = serve(&s, R_BYE_STAY);

	ck_assert_int_eq(cuip_client_bye(s, 200), -ETIMEDOUT);
	kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}
END_TEST

START_TEST(request_names_come_from_the_schema)
{
	ck_assert_str_eq(cuip_request_name(CUIP__REQUEST__BODY_FETCH_MANY), "FETCH_MANY");
	ck_assert_str_eq(cuip_request_name(CUIP__REQUEST__BODY_BYE), "BYE");
	ck_assert_str_eq(cuip_request_name(999), "?");
	ck_assert_str_eq(cuip_request_name(CUIP__REQUEST__BODY_PREPARE_MULTICAST), "PREPARE_MULTICAST");
}
END_TEST

/* Every phase's name reads back as the phase; anything else is none. */
START_TEST(phase_names_read_back)
{
	for (int ph = CUIP_GPHASE_NONE + 1; ph < CUIP_GPHASE_COUNT; ph++)
		ck_assert_int_eq(cuip_gphase_parse(cuip_gphase_name(ph)), ph);
	ck_assert_str_eq(cuip_gphase_name(CUIP_GPHASE_PREPARE_MULTICAST_ROLLBACK), "PREPARE_MULTICAST (rollback)");
	ck_assert_str_eq(cuip_gphase_name(CUIP_GPHASE_COUNT), "?");
	ck_assert_int_eq(cuip_gphase_parse("native-lock"), CUIP_GPHASE_NONE);
	ck_assert_int_eq(cuip_gphase_parse("PREPARE_MULTICAST (roll"), CUIP_GPHASE_NONE);
	ck_assert_int_eq(cuip_gphase_parse(NULL), CUIP_GPHASE_NONE);
	ck_assert_int_eq(cuip_gphase_base(CUIP_GPHASE_PREPARE_UNICAST_ROLLBACK), CUIP_GPHASE_PREPARE_UNICAST);
	ck_assert_int_eq(cuip_gphase_base(CUIP_GPHASE_REBUILD_MC_BINDINGS), CUIP_GPHASE_REBUILD);
	ck_assert_int_eq(cuip_gphase_base(CUIP_GPHASE_SAVE), CUIP_GPHASE_SAVE);
	ck_assert_int_eq(cuip_gphase_of_stage(CUIP__STAGE__STAGE_MC_DEVICES), CUIP_GPHASE_REBUILD_MC_DEVICES);
	ck_assert_int_eq(cuip_gphase_of_stage(0), CUIP_GPHASE_NONE);
	ck_assert_int_eq(cuip_gphase_of_request(CUIP__REQUEST__BODY_BYE), CUIP_GPHASE_NONE);
}
END_TEST

int main(void)
{
	Suite *su = suite_create("client");
	TCase *t = tcase_create("client");
	SRunner *sr;
	int failed;

	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(t, 30);
	tcase_add_test(t, handshake_returns_who_answered);
	tcase_add_test(t, handshake_refusal_is_its_status_and_names_the_request);
	tcase_add_test(t, handshake_reply_without_identity_is_a_protocol_error);
	tcase_add_test(t, handshake_without_reply_times_out_naming_the_limit);
	tcase_add_test(t, checked_request_refusal_leaves_no_response);
	tcase_add_test(t, checked_request_answer_lives_until_freed);
	tcase_add_test(t, raw_call_hands_a_refusal_back_as_the_response);
	tcase_add_test(t, bye_waits_for_the_server_to_close);
	tcase_add_test(t, bye_times_out_when_the_server_keeps_the_connection);
	tcase_add_test(t, request_names_come_from_the_schema);
	tcase_add_test(t, phase_names_read_back);
	suite_add_tcase(su, t);
	sr = srunner_create(su);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
