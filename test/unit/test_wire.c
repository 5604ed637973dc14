/*
 * test_wire.c - the framing every cuinterpose message and image goes
 * through: bytes on the wire, refusal of foreign/truncated/corrupt/
 * wrong-version data, one FD per message, no FD leaks on malformed input.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "arena.h"
#include "wire.h"
#include "../tmpname.h"

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ".", "..", and the DIR's own fd */
}

static void make_state(Cuip__ProcessState *st, Cuip__ProcessId *self, Cuip__Allocation *a, Cuip__Allocation **ap,
		       Cuip__AllocId *id, Cuip__AllocProps *props)
{
	cuip__process_state__init(st);
	cuip__process_id__init(self);
	self->id = 0x1122334455667788ull;
	self->pid = 4242;
	st->self = self;
	st->phase = CUIP__PHASE__PHASE_ACTIVE;
	cuip__allocation__init(a);
	cuip__alloc_id__init(id);
	id->creator = self->id;
	id->serial = 7;
	cuip__alloc_props__init(props);
	props->size = 2u << 20;
	props->handle_types = 1;
	a->id = id;
	a->kind = CUIP__ALLOC_KIND__KIND_UNICAST;
	a->owner = CUIP__OWNER__OWNER_SHARED;
	a->origin = CUIP__ORIGIN__ORIGIN_VMM_CREATE;
	a->props = props;
	ap[0] = a;
	st->n_allocations = 1;
	st->allocations = ap;
}

START_TEST(crc32c_matches_the_castagnoli_check_value)
{
	/* The standard check value of CRC-32C over "123456789". */
	ck_assert_uint_eq(cuip_crc32c(0, "123456789", 9), 0xe3069283u);
	/* Incremental equals one-shot, across unaligned splits. */
	char buf[1000];
	for (unsigned i = 0; i < sizeof(buf); i++)
		buf[i] = (char)(i * 31 + 7);
	uint32_t one = cuip_crc32c(0, buf, sizeof(buf));
	uint32_t inc = cuip_crc32c(cuip_crc32c(0, buf, 333), buf + 333, sizeof(buf) - 333);
	ck_assert_uint_eq(one, inc);
}
END_TEST

START_TEST(phase_names_come_from_the_protocol)
{
	ck_assert_str_eq(cuip_phase_name(CUIP__PHASE__PHASE_ACTIVE), "ACTIVE");
	ck_assert_str_eq(cuip_phase_name(CUIP__PHASE__PHASE_QUIESCED), "QUIESCED");
	ck_assert_str_eq(cuip_phase_name(CUIP__PHASE__PHASE_PREPARED), "PREPARED");
	ck_assert_str_eq(cuip_phase_name(CUIP__PHASE__PHASE_RESTORING), "RESTORING");
	ck_assert_str_eq(cuip_phase_name(CUIP__PHASE__PHASE_FAILED), "FAILED");
	ck_assert_str_eq(cuip_phase_name(0), "unknown");
	ck_assert_str_eq(cuip_phase_name(99), "unknown");
	ck_assert_str_eq(cuip_phase_name(-1), "unknown");
}
END_TEST

START_TEST(frame_header_layout_is_stable)
{
	Cuip__Request req = CUIP__REQUEST__INIT;
	uint8_t *buf;
	ssize_t len;

	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	len = cuip_encode(CUIP_KIND_REQUEST, &req.base, &buf);
	ck_assert_int_eq(len, CUIP_FRAME_SIZE + 2);
	/* magic "CUIP", version 1, kind 1, length 2, then the crc. */
	const uint8_t head[12] = {'C', 'U', 'I', 'P', 1, 0, 1, 0, 2, 0, 0, 0};
	ck_assert_mem_eq(buf, head, sizeof(head));
	uint32_t crc;
	memcpy(&crc, buf + 12, 4);
	ck_assert_uint_eq(crc, cuip_crc32c(0, buf + 16, 2));
	free(buf);
}
END_TEST

START_TEST(decode_round_trips_a_process_state)
{
	Cuip__ProcessState st, *out;
	Cuip__ProcessId self;
	Cuip__Allocation a, *ap[1];
	Cuip__AllocId id;
	Cuip__AllocProps props;
	uint8_t *buf;
	char err[256];

	make_state(&st, &self, &a, ap, &id, &props);
	ssize_t len = cuip_encode(CUIP_KIND_TOPOLOGY, &st.base, &buf);
	ck_assert_int_gt(len, CUIP_FRAME_SIZE);
	ck_assert_int_eq(cuip_decode(buf, (size_t)len, CUIP_KIND_TOPOLOGY, &cuip__process_state__descriptor, NULL,
				     (ProtobufCMessage **)&out, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(out->self->id, 0x1122334455667788ull);
	ck_assert_int_eq(out->self->pid, 4242);
	ck_assert_uint_eq(out->n_allocations, 1);
	ck_assert_uint_eq(out->allocations[0]->id->serial, 7);
	ck_assert_uint_eq(out->allocations[0]->props->size, 2u << 20);
	protobuf_c_message_free_unpacked(&out->base, NULL);
	free(buf);
}
END_TEST

START_TEST(decode_refuses_bad_input_with_reasons)
{
	Cuip__ProcessState st;
	Cuip__ProcessId self;
	Cuip__Allocation a, *ap[1];
	Cuip__AllocId id;
	Cuip__AllocProps props;
	ProtobufCMessage *out;
	uint8_t *buf;
	char err[256];

	make_state(&st, &self, &a, ap, &id, &props);
	ssize_t len = cuip_encode(CUIP_KIND_TOPOLOGY, &st.base, &buf);
	const ProtobufCMessageDescriptor *d = &cuip__process_state__descriptor;

	/* truncated header and truncated payload */
	ck_assert_int_eq(cuip_decode(buf, 10, CUIP_KIND_TOPOLOGY, d, NULL, &out, err, sizeof(err)), -ENODATA);
	ck_assert_ptr_null(out);
	ck_assert_int_eq(cuip_decode(buf, (size_t)len - 1, CUIP_KIND_TOPOLOGY, d, NULL, &out, err, sizeof(err)),
			 -ENODATA);
	ck_assert_ptr_nonnull(strstr(err, "truncated"));
	/* wrong kind */
	ck_assert_int_eq(cuip_decode(buf, (size_t)len, CUIP_KIND_INVENTORY, d, NULL, &out, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "expected a inventory image"));
	/* corrupt payload byte */
	buf[len - 1] ^= 0x40;
	ck_assert_int_eq(cuip_decode(buf, (size_t)len, CUIP_KIND_TOPOLOGY, d, NULL, &out, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "checksum"));
	buf[len - 1] ^= 0x40;
	/* another format version */
	buf[4] = 9;
	ck_assert_int_eq(cuip_decode(buf, (size_t)len, CUIP_KIND_TOPOLOGY, d, NULL, &out, err, sizeof(err)),
			 -EPROTONOSUPPORT);
	ck_assert_ptr_nonnull(strstr(err, "version 9"));
	buf[4] = 1;
	/* not ours at all */
	buf[0] = 'X';
	ck_assert_int_eq(cuip_decode(buf, (size_t)len, CUIP_KIND_TOPOLOGY, d, NULL, &out, err, sizeof(err)), -EPROTO);
	buf[0] = 'C';
	/* a length beyond the bound */
	uint32_t huge = CUIP_MSG_MAX + 1;
	memcpy(buf + 8, &huge, 4);
	ck_assert_int_eq(cuip_decode(buf, (size_t)len, CUIP_KIND_TOPOLOGY, d, NULL, &out, err, sizeof(err)), -EMSGSIZE);
	free(buf);
}
END_TEST

START_TEST(message_carries_one_fd_close_on_exec)
{
	int sv[2], pfd[2], got = -1;
	Cuip__Request req = CUIP__REQUEST__INIT, *in;
	char err[256];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	req.body_case = CUIP__REQUEST__BODY_BYE;
	req.bye = 1;
	ck_assert_int_eq(cuip_msg_send(sv[0], CUIP_KIND_REQUEST, &req.base, pfd[1]), 0);
	ck_assert_int_eq(cuip_msg_recv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL,
				       (ProtobufCMessage **)&in, &got, err, sizeof(err)),
			 0);
	ck_assert_int_eq(in->body_case, CUIP__REQUEST__BODY_BYE);
	ck_assert_int_ge(got, 0);
	ck_assert_int_eq(fcntl(got, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	/* It is the same pipe: bytes written to it arrive at the read end. */
	ck_assert_int_eq(write(got, "ok", 2), 2);
	char two[2];
	ck_assert_int_eq(read(pfd[0], two, 2), 2);
	ck_assert_mem_eq(two, "ok", 2);
	protobuf_c_message_free_unpacked(&in->base, NULL);
	close(got);
	close(pfd[0]);
	close(pfd[1]);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

START_TEST(message_carries_many_fds_and_refuses_too_many)
{
	int sv[2], pfd[2], fds[CUIP_MSG_MAX_FDS + 1], got[CUIP_MSG_MAX_FDS];
	Cuip__Request req = CUIP__REQUEST__INIT;
	ProtobufCMessage *in;
	char err[256], c;
	size_t n;
	int base;

	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	req.body_case = CUIP__REQUEST__BODY_BYE;
	req.bye = 1;
	for (int i = 0; i <= CUIP_MSG_MAX_FDS; i++)
		fds[i] = pfd[1];
	base = count_fds();
	/* The most a message carries: all arrive, in order, close-on-exec. */
	ck_assert_int_eq(cuip_msg_sendv(sv[0], CUIP_KIND_REQUEST, &req.base, fds, CUIP_MSG_MAX_FDS), 0);
	ck_assert_int_eq(cuip_msg_recvv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &in, got,
					CUIP_MSG_MAX_FDS, &n, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(n, CUIP_MSG_MAX_FDS);
	protobuf_c_message_free_unpacked(in, NULL);
	for (size_t i = 0; i < n; i++) {
		ck_assert_int_eq(fcntl(got[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
		ck_assert_int_eq(write(got[i], "x", 1), 1); /* the same pipe */
		close(got[i]);
	}
	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(read(pfd[0], &c, 1), 1);
	ck_assert_int_eq(count_fds(), base);
	/* One more than the bound is refused by the sender. */
	ck_assert_int_eq(cuip_msg_sendv(sv[0], CUIP_KIND_REQUEST, &req.base, fds, CUIP_MSG_MAX_FDS + 1), -E2BIG);
	/* More than the receiver asked for: a protocol error, every one closed. */
	ck_assert_int_eq(cuip_msg_sendv(sv[0], CUIP_KIND_REQUEST, &req.base, fds, 11), 0);
	ck_assert_int_eq(cuip_msg_recvv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &in, got, 10, &n,
					err, sizeof(err)),
			 -EPROTO);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_nonnull(strstr(err, "more than 10 file descriptors"));
	ck_assert_int_eq(count_fds(), base);
	close(sv[0]);
	close(sv[1]);
	close(pfd[0]);
	close(pfd[1]);
}
END_TEST

/*
 * Why one assertion per piece, not per byte: every passing ck_assert_* is a
 * _mark_point(), a write to Check's message file. Asserting on each of the
 * 2 million bytes below took 3-5 s (the test hit Check's timeout under the
 * sanitizers); the scan is plain C and the assertion names the first piece
 * that is wrong.
 */
static const char *arena_piece_fault(const unsigned char *p, size_t n, const unsigned char *prev, size_t prev_n)
{
	if (!p)
		return "NULL";
	if ((uintptr_t)p % _Alignof(max_align_t))
		return "misaligned";
	for (size_t k = 0; k < n; k++)
		if (p[k])
			return "not zeroed";
	if (prev && p < prev + prev_n && prev < p + n)
		return "overlaps the previous piece";
	return NULL;
}

START_TEST(arena_gives_zeroed_aligned_memory_across_blocks)
{
	struct cuip_arena a = {0};
	unsigned char *p = NULL, *prev = NULL, *big;
	size_t n = 0, prev_n = 0, total = 0;
	const char *fault = NULL;
	int i, jumps = 0;

	/* Enough small pieces (2.2 MiB once rounded up) to fill several 1 MiB blocks:
	 * each zeroed, aligned, and not overlapping the previous one. */
	for (i = 0; i < 40000 && !fault; i++) {
		n = 1 + (size_t)(i % 97);
		p = cuip_arena_alloc(&a, n);
		fault = arena_piece_fault(p, n, prev, prev_n);
		if (fault)
			break;
		/* pieces follow each other inside a block: a jump is a new block */
		if (prev &&
		    p != prev + (prev_n + _Alignof(max_align_t) - 1) / _Alignof(max_align_t) * _Alignof(max_align_t))
			jumps++;
		memset(p, 0xa5, n);
		total += n;
		prev = p;
		prev_n = n;
	}
	ck_assert_msg(!fault, "piece %d (%zu bytes) at %p: %s", i, n, (void *)p, fault ? fault : "");
	ck_assert_uint_gt(total, 1u << 20);
	ck_assert_int_ge(jumps, 2);
	/* Bigger than a block: a block of its own. */
	big = cuip_arena_alloc(&a, 3u << 20);
	ck_assert_ptr_nonnull(big);
	ck_assert_ptr_null(arena_piece_fault(big, 3u << 20, prev, prev_n));
	cuip_arena_clear(&a);
	ck_assert_ptr_null(a.head);
	/* Usable again after clearing. */
	p = cuip_arena_alloc(&a, 16);
	ck_assert_ptr_null(arena_piece_fault(p, 16, NULL, 0));
	cuip_arena_clear(&a);
}
END_TEST

/* Send raw bytes with `nfds` descriptors attached, as a hostile peer would. */
static void send_raw(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
	char ctl[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = {(void *)buf, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (nfds) {
		memset(ctl, 0, sizeof(ctl));
		mh.msg_control = ctl;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	ck_assert_int_eq(sendmsg(sock, &mh, MSG_NOSIGNAL), (ssize_t)len);
}

START_TEST(malformed_messages_leak_no_descriptor)
{
	int sv[2], pfd[2], got;
	ProtobufCMessage *in;
	char err[256];
	int base;

	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	base = count_fds();

	/* 1: garbage header with an FD */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	send_raw(sv[0], "XXXXXXXXXXXXXXXX", 16, pfd, 1);
	ck_assert_int_eq(
		cuip_msg_recv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &in, &got, err, sizeof(err)),
		-EPROTO);
	ck_assert_int_eq(got, -1);
	close(sv[0]);
	close(sv[1]);
	ck_assert_int_eq(count_fds(), base);

	/* 2: a valid header with two FDs attached */
	Cuip__Request req = CUIP__REQUEST__INIT;
	uint8_t *buf;
	req.body_case = CUIP__REQUEST__BODY_INSPECT;
	req.inspect = 1;
	ssize_t len = cuip_encode(CUIP_KIND_REQUEST, &req.base, &buf);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	send_raw(sv[0], buf, (size_t)len, pfd, 2);
	ck_assert_int_eq(
		cuip_msg_recv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &in, &got, err, sizeof(err)),
		-EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "more than one"));
	close(sv[0]);
	close(sv[1]);
	ck_assert_int_eq(count_fds(), base);

	/* 3: header promising more payload than arrives, with an FD */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	send_raw(sv[0], buf, CUIP_FRAME_SIZE + 1, pfd, 1);
	shutdown(sv[0], SHUT_WR);
	ck_assert_int_eq(
		cuip_msg_recv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &in, &got, err, sizeof(err)),
		-ENODATA);
	close(sv[0]);
	close(sv[1]);
	ck_assert_int_eq(count_fds(), base);

	/* 4: corrupt payload with an FD */
	buf[len - 1] ^= 1;
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	send_raw(sv[0], buf, (size_t)len, pfd, 1);
	ck_assert_int_eq(
		cuip_msg_recv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &in, &got, err, sizeof(err)),
		-EBADMSG);
	close(sv[0]);
	close(sv[1]);
	ck_assert_int_eq(count_fds(), base);

	/* 5: clean close between messages */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	close(sv[0]);
	ck_assert_int_eq(
		cuip_msg_recv(sv[1], CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &in, &got, err, sizeof(err)),
		-ECONNRESET);
	close(sv[1]);
	ck_assert_int_eq(count_fds(), base);
	free(buf);
	close(pfd[0]);
	close(pfd[1]);
}
END_TEST

START_TEST(send_to_a_closed_peer_returns_epipe_without_signal)
{
	int sv[2];
	Cuip__Request req = CUIP__REQUEST__INIT;

	signal(SIGPIPE, SIG_DFL);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	close(sv[1]);
	req.body_case = CUIP__REQUEST__BODY_BYE;
	req.bye = 1;
	ck_assert_int_eq(cuip_msg_send(sv[0], CUIP_KIND_REQUEST, &req.base, -1), -EPIPE);
	close(sv[0]);
}
END_TEST

START_TEST(image_files_are_atomic_and_checked)
{
	char dir[64], err[512];
	Cuip__Inventory inv = CUIP__INVENTORY__INIT, *out;
	uint8_t idb[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
	struct stat st;
	int dfd;

	ck_assert_ptr_nonnull(mkdtemp(test_tmpname(dir, sizeof(dir), "cuip-wire-XXXXXX")));
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	inv.checkpoint_id.data = idb;
	inv.checkpoint_id.len = 16;
	inv.has_carried_bytes = 1;
	inv.carried_bytes = 12345;
	ck_assert_int_eq(cuip_image_write(dfd, CUIP_INVENTORY_IMG, CUIP_KIND_INVENTORY, &inv.base), 0);
	ck_assert_int_eq(fstatat(dfd, CUIP_INVENTORY_IMG ".tmp", &st, 0), -1);
	ck_assert_int_eq(cuip_image_read(dfd, CUIP_INVENTORY_IMG, CUIP_KIND_INVENTORY, &cuip__inventory__descriptor,
					 NULL, (ProtobufCMessage **)&out, err, sizeof(err)),
			 0);
	ck_assert_mem_eq(out->checkpoint_id.data, idb, 16);
	ck_assert_uint_eq(out->carried_bytes, 12345);
	protobuf_c_message_free_unpacked(&out->base, NULL);

	/* missing */
	ck_assert_int_eq(cuip_image_read(dfd, "cuinterpose-1.img", CUIP_KIND_TOPOLOGY, &cuip__topology__descriptor,
					 NULL, (ProtobufCMessage **)&out, err, sizeof(err)),
			 -ENOENT);
	ck_assert_str_eq(err, "cuinterpose-1.img: missing");
	/* truncated by one byte: named and refused */
	ck_assert_int_eq(fstatat(dfd, CUIP_INVENTORY_IMG, &st, 0), 0);
	int fd = openat(dfd, CUIP_INVENTORY_IMG, O_WRONLY);
	ck_assert_int_eq(ftruncate(fd, st.st_size - 1), 0);
	close(fd);
	ck_assert_int_eq(cuip_image_read(dfd, CUIP_INVENTORY_IMG, CUIP_KIND_INVENTORY, &cuip__inventory__descriptor,
					 NULL, (ProtobufCMessage **)&out, err, sizeof(err)),
			 -ENODATA);
	ck_assert_ptr_nonnull(strstr(err, CUIP_INVENTORY_IMG ": inventory image truncated"));
	unlinkat(dfd, CUIP_INVENTORY_IMG, 0);
	close(dfd);
	rmdir(dir);
}
END_TEST

static Suite *wire_suite(void)
{
	Suite *s = suite_create("wire");
	TCase *tc = tcase_create("core");

	/* Every test here runs in well under 0.1 s; 10 s leaves room for a
	 * sanitizer build (2x) on a loaded 2-core machine without hiding a
	 * hang for long. */
	tcase_set_timeout(tc, 10);

	tcase_add_test(tc, crc32c_matches_the_castagnoli_check_value);
	tcase_add_test(tc, phase_names_come_from_the_protocol);
	tcase_add_test(tc, frame_header_layout_is_stable);
	tcase_add_test(tc, decode_round_trips_a_process_state);
	tcase_add_test(tc, decode_refuses_bad_input_with_reasons);
	tcase_add_test(tc, message_carries_one_fd_close_on_exec);
	tcase_add_test(tc, message_carries_many_fds_and_refuses_too_many);
	tcase_add_test(tc, arena_gives_zeroed_aligned_memory_across_blocks);
	tcase_add_test(tc, malformed_messages_leak_no_descriptor);
	tcase_add_test(tc, send_to_a_closed_peer_returns_epipe_without_signal);
	tcase_add_test(tc, image_files_are_atomic_and_checked);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(wire_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
