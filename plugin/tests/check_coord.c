/*
 * check_coord.c - the coordinator against fake participant servers (threads
 * of this test speaking the control protocol on real unix sockets; a child
 * process where the test needs the participant's own /proc/PID/io): phase
 * order, barriers, stop at the first failure, rollback, bytes checks, the
 * restore-side rebuild order, and the stall bound of the data phases.
 */
#include "config.h"

#include <sys/types.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include "client.h"
#include "coord.h"
#include "criulog.h"
#include "fixtures.h"
#include "images.h"
#include "importers.h"

#define NFAKE 4

struct fake {
	int idx;
	char path[108];
	int lfd;
	pthread_t th;
	struct fx_proc fx;
	const char *fail_on; /* request name answered with -EIO */
	const char *delay_on;
	unsigned delay_ms;
	const char *hang_on;	/* request neither answered nor worked on until the connection closes */
	const char *trickle_on; /* request that reads 256 bytes every 20 ms for trickle_ms before its answer */
	unsigned trickle_ms;
	int forked; /* served by a child process (its own /proc/PID/io), not a thread */
	pid_t child;
	int save_short;
	int bad_extent;		/* SAVE answers an extent in a file it was not given (1), one byte short (2) */
	int phase;		/* Cuip__Phase as an interposer would report it; 0: ACTIVE */
	int restored, in_place; /* LOADs and REBUILDs with Load/Rebuild.restored set, and without */
	int sync_loads;		/* LOADs with sync_copies set */
	char log[64][24];
	int nlog;
};

static struct fake fk[NFAKE];
static char tdir[64];

static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	int fake;
	char what[32];
} ev[1024];
static int nev;

static void event(int fake, const char *dir, const char *what)
{
	pthread_mutex_lock(&ev_lock);
	if (nev < 1024) {
		ev[nev].fake = fake;
		snprintf(ev[nev].what, sizeof(ev[nev].what), "%s %s", dir, what);
		nev++;
	}
	pthread_mutex_unlock(&ev_lock);
}

/* index of the first event matching (fake or -1 for any) */
static int ev_first(int fake, const char *what)
{
	for (int i = 0; i < nev; i++)
		if ((fake < 0 || ev[i].fake == fake) && !strcmp(ev[i].what, what))
			return i;
	return -1;
}

static int ev_last(int fake, const char *what)
{
	int r = -1;
	for (int i = 0; i < nev; i++)
		if ((fake < 0 || ev[i].fake == fake) && !strcmp(ev[i].what, what))
			r = i;
	return r;
}

static const char *req_name(const Cuip__Request *r)
{
	static __thread char buf[24];
	if (r->body_case == CUIP__REQUEST__BODY_REBUILD) {
		snprintf(buf, sizeof(buf), "REBUILD%d", (int)r->rebuild->stage);
		return buf;
	}
	return cuip_request_name(r->body_case);
}

static void handle_save(struct fake *f, const Cuip__Save *s, int fd, Cuip__Response *resp, Cuip__SaveReply *sr)
{
	uint64_t total = 0;

	cuip__save_reply__init(sr);
	sr->entries = calloc(s->n_allocs, sizeof(*sr->entries));
	for (size_t i = 0; i < s->n_allocs; i++) {
		uint64_t size = 0;
		for (size_t k = 0; k < f->fx.st.n_allocations; k++)
			if (f->fx.aid[k].serial == s->allocs[i]->serial)
				size = f->fx.props[k].size;
		uint8_t *buf = malloc(size);
		for (uint64_t b = 0; b < size; b++)
			buf[b] = (uint8_t)(b + s->allocs[i]->serial);
		Cuip__CarrierEntry *e = calloc(1, sizeof(*e));
		cuip__carrier_entry__init(e);
		e->alloc = s->allocs[i];
		e->file = s->file;
		e->offset = s->offset + total;
		e->size = size;
		e->chunk_size = s->chunk_size;
		e->n_crc32c = (size + s->chunk_size - 1) / s->chunk_size;
		e->crc32c = calloc(e->n_crc32c, sizeof(uint32_t));
		for (size_t c = 0; c < e->n_crc32c; c++) {
			uint64_t off = c * s->chunk_size;
			uint64_t len = size - off < s->chunk_size ? size - off : s->chunk_size;
			e->crc32c[c] = cuip_crc32c(0, buf + off, len);
		}
		ck_assert_int_eq(cuip_write_all(fd, buf, size), 0);
		free(buf);
		if (f->bad_extent) {
			Cuip__CarrierExtent *x = calloc(1, sizeof(*x));

			cuip__carrier_extent__init(x);
			x->file = f->bad_extent == 1 ? 7 : 0;
			x->offset = e->offset;
			x->size = f->bad_extent == 1 ? e->size : e->size - 1;
			e->extents = calloc(1, sizeof(*e->extents));
			e->extents[e->n_extents++] = x;
		}
		sr->entries[sr->n_entries++] = e;
		total += size;
	}
	sr->bytes = total - (uint64_t)f->save_short;
	resp->body_case = CUIP__RESPONSE__BODY_SAVE;
	resp->save = sr;
}

static void free_save(Cuip__SaveReply *sr)
{
	for (size_t i = 0; i < sr->n_entries; i++) {
		for (size_t k = 0; k < sr->entries[i]->n_extents; k++)
			free(sr->entries[i]->extents[k]);
		free(sr->entries[i]->extents);
		free(sr->entries[i]->crc32c);
		free(sr->entries[i]);
	}
	free(sr->entries);
}

/* A participant stuck in a request: no reply, no byte moved, until the
 * coordinator gives up and shuts the connection down. */
static void hang_until_closed(int c)
{
	struct pollfd pfd = {.fd = c, .events = POLLIN};

	while (poll(&pfd, 1, -1) < 0 && errno == EINTR)
		;
}

/* A slow participant that keeps moving bytes: its rchar grows by 256
 * bytes every 20 ms (12.5 KiB a second: 1.2 s stays within a carrier of
 * 20497 bytes, past which LOAD's meter stops counting). */
static void trickle(unsigned ms)
{
	int z = open("/dev/zero", O_RDONLY | O_CLOEXEC);
	char buf[256];

	ck_assert_int_ge(z, 0);
	for (unsigned t = 0; t < ms; t += 20) {
		ck_assert_int_eq(read(z, buf, sizeof(buf)), (ssize_t)sizeof(buf));
		usleep(20000);
	}
	close(z);
}

static void serve(struct fake *f, int c)
{
	for (;;) {
		ProtobufCMessage *m;
		Cuip__Request *req;
		Cuip__Response resp = CUIP__RESPONSE__INIT;
		Cuip__HandshakeReply hr = CUIP__HANDSHAKE_REPLY__INIT;
		Cuip__LoadReply lr = CUIP__LOAD_REPLY__INIT;
		Cuip__SaveReply sr = CUIP__SAVE_REPLY__INIT;
		char err[128];
		const char *name;
		int fd = -1, bye;

		if (cuip_msg_recv(c, CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &m, &fd, err, sizeof(err)))
			break;
		req = (Cuip__Request *)m;
		name = req_name(req);
		if (f->nlog < 64)
			snprintf(f->log[f->nlog++], sizeof(f->log[0]), "%s", name);
		event(f->idx, "REQ", name);
		bye = req->body_case == CUIP__REQUEST__BODY_BYE;
		if (f->delay_on && !strcmp(f->delay_on, name))
			usleep(f->delay_ms * 1000);
		if (f->hang_on && !strcmp(f->hang_on, name)) {
			hang_until_closed(c);
			protobuf_c_message_free_unpacked(m, NULL);
			if (fd >= 0)
				close(fd);
			break;
		}
		if (f->trickle_on && !strcmp(f->trickle_on, name))
			trickle(f->trickle_ms);
		/* The phase an interposer would be in (ops.c): a failed QUIESCE
		 * reopens the gate, a failed PREPARE_UNICAST leaves it PREPARED. */
		if (req->body_case == CUIP__REQUEST__BODY_QUIESCE && !(f->fail_on && !strcmp(f->fail_on, name)))
			f->phase = CUIP__PHASE__PHASE_QUIESCED;
		else if (req->body_case == CUIP__REQUEST__BODY_PREPARE_UNICAST)
			f->phase = CUIP__PHASE__PHASE_PREPARED;
		else if (req->body_case == CUIP__REQUEST__BODY_LOAD || req->body_case == CUIP__REQUEST__BODY_REBUILD)
			f->phase = CUIP__PHASE__PHASE_RESTORING;
		if (req->body_case == CUIP__REQUEST__BODY_LOAD || req->body_case == CUIP__REQUEST__BODY_REBUILD) {
			bool r = req->body_case == CUIP__REQUEST__BODY_LOAD ? req->load->restored
									    : req->rebuild->restored;

			*(r ? &f->restored : &f->in_place) += 1;
			f->sync_loads += req->body_case == CUIP__REQUEST__BODY_LOAD && req->load->sync_copies;
		} else if (req->body_case == CUIP__REQUEST__BODY_RESUME && !(f->fail_on && !strcmp(f->fail_on, name)))
			f->phase = CUIP__PHASE__PHASE_ACTIVE;
		if (f->fail_on && !strcmp(f->fail_on, name)) {
			resp.status = -EIO;
			resp.error = (char *)"injected failure";
		} else if (req->body_case == CUIP__REQUEST__BODY_HANDSHAKE) {
			hr.self = &f->fx.self;
			hr.phase = f->phase ? (Cuip__Phase)f->phase : CUIP__PHASE__PHASE_ACTIVE;
			hr.version = (char *)"test";
			resp.body_case = CUIP__RESPONSE__BODY_HANDSHAKE;
			resp.handshake = &hr;
		} else if (req->body_case == CUIP__REQUEST__BODY_INSPECT) {
			/* the state says the phase, as inspect.c's does */
			f->fx.st.phase = f->phase ? (Cuip__Phase)f->phase : CUIP__PHASE__PHASE_ACTIVE;
			resp.body_case = CUIP__RESPONSE__BODY_STATE;
			resp.state = &f->fx.st;
		} else if (req->body_case == CUIP__REQUEST__BODY_SAVE) {
			ck_assert_int_ge(fd, 0);
			handle_save(f, req->save, fd, &resp, &sr);
		} else if (req->body_case == CUIP__REQUEST__BODY_LOAD) {
			ck_assert_int_ge(fd, 0);
			for (size_t i = 0; i < req->load->n_entries; i++)
				lr.bytes += req->load->entries[i]->size;
			resp.body_case = CUIP__RESPONSE__BODY_LOAD;
			resp.load = &lr;
		}
		/* recorded before it is sent: once sent, the coordinator may send
		 * the next request (and another fake record it) before this thread
		 * runs again, which made the order checks fail on a loaded machine */
		event(f->idx, "REP", name);
		cuip_msg_send(c, CUIP_KIND_RESPONSE, &resp.base, -1);
		if (resp.body_case == CUIP__RESPONSE__BODY_SAVE) {
			/* entries point into the request: free ours first */
			free_save(&sr);
		}
		if (fd >= 0)
			close(fd);
		protobuf_c_message_free_unpacked(m, NULL);
		if (bye)
			break;
	}
	close(c);
}

static void *fake_main(void *a)
{
	struct fake *f = a;
	int c;

	while ((c = accept(f->lfd, NULL, NULL)) >= 0)
		serve(f, c);
	return NULL;
}

static void fakes_setup(void)
{
	strcpy(tdir, "/tmp/cuip-coord-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tdir));
	memset(fk, 0, sizeof(fk));
	nev = 0;
}

static void fake_listen(int i)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	strcpy(sa.sun_path, fk[i].path);
	fk[i].lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_eq(bind(fk[i].lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(fk[i].lfd, 8), 0);
}

/* The fake in a child process, which dies with the test. It listens itself:
 * the coordinator checks who serves the socket (SO_PEERCRED). */
static void fake_fork(int i)
{
	int ready[2];
	char c;

	ck_assert_int_eq(pipe(ready), 0);
	fk[i].child = fork();
	ck_assert_int_ge(fk[i].child, 0);
	if (fk[i].child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		fake_listen(i);
		if (write(ready[1], "", 1) != 1)
			_exit(1);
		fake_main(&fk[i]);
		_exit(0);
	}
	close(ready[1]);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	close(ready[0]);
	fk[i].lfd = -1;
}

static void fake_start(int i)
{
	fk[i].idx = i;
	snprintf(fk[i].path, sizeof(fk[i].path), "%s/%d-%016llx.sock", tdir, (int)fk[i].fx.self.pid,
		 (unsigned long long)fk[i].fx.self.id);
	if (fk[i].forked) {
		fake_fork(i);
		return;
	}
	fake_listen(i);
	ck_assert_int_eq(pthread_create(&fk[i].th, NULL, fake_main, &fk[i]), 0);
}

static void fakes_teardown(void)
{
	char cmd[128];
	for (int i = 0; i < NFAKE; i++) {
		if (fk[i].child > 0) {
			kill(fk[i].child, SIGKILL);
			waitpid(fk[i].child, NULL, 0);
		}
		if (!fk[i].th)
			continue;
		shutdown(fk[i].lfd, SHUT_RDWR);
		pthread_join(fk[i].th, NULL);
		close(fk[i].lfd);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tdir);
	ck_assert_int_eq(system(cmd), 0);
}

static struct cuip_opts opts;
static struct cuip_group g;

/* Creator 0 (two shared allocations, one not a multiple of the chunk, plus a
 * private one), importers 1..n-1 mapping the first shared one. */
static void group_of(int n)
{
	fx_init(&fk[0].fx, 0xc0, 1000);
	fx_create(&fk[0].fx, 1, 3 * 4096 + 17, 1, 0x10000000);
	fx_create(&fk[0].fx, 2, 8192, 1, 0x20000000);
	fx_create(&fk[0].fx, 3, 4096, 0, 0x30000000);
	for (int i = 1; i < n; i++) {
		fx_init(&fk[i].fx, 0xa0 + (uint64_t)i, 1000 + i);
		fx_import(&fk[i].fx, 0xc0, 1, 3 * 4096 + 17, 0x40000000);
	}
	for (int i = 0; i < n; i++)
		fake_start(i);
	memset(&opts, 0, sizeof(opts));
	opts.op_timeout_ms = 5000;
	opts.quiesce_timeout_ms = 1000;
	opts.chunk_size = 4096;
	memset(&g, 0, sizeof(g));
	g.o = &opts;
	g.imgdir = open(tdir, O_RDONLY | O_DIRECTORY);
	g.n = (size_t)n;
	g.p = calloc((size_t)n, sizeof(*g.p));
	for (int i = 0; i < n; i++) {
		g.p[i].pid = fk[i].forked ? fk[i].child : getpid();
		g.p[i].vpid = (pid_t)fk[i].fx.self.pid;
		g.p[i].fd = -1;
		strcpy(g.p[i].sock, fk[i].path);
	}
}

static void group_done(void)
{
	close(g.imgdir);
	cuip_group_free(&g);
}

static void assert_log(int i, const char *const *want, int n)
{
	ck_assert_int_eq(fk[i].nlog, n);
	for (int k = 0; k < n; k++)
		ck_assert_str_eq(fk[i].log[k], want[k]);
}

START_TEST(dump_runs_every_phase_in_order_on_every_participant)
{
	/* INSPECT again once quiesced: SAVE goes by the records the closed gate froze. */
	static const char *creator[] = {"HANDSHAKE",	     "INSPECT", "QUIESCE",	   "INSPECT",
					"PREPARE_MULTICAST", "SAVE",	"PREPARE_UNICAST", "BYE"};
	static const char *importer[] = {"HANDSHAKE",	      "INSPECT",	 "QUIESCE", "INSPECT",
					 "PREPARE_MULTICAST", "PREPARE_UNICAST", "BYE"};
	struct cuip_ckpt c;
	char err[256];

	group_of(3);
	ck_assert_int_eq(cuip_group_dump(&g), 0);
	assert_log(0, creator, 8);
	assert_log(1, importer, 7);
	assert_log(2, importer, 7);
	ck_assert_uint_eq(g.carried_bytes, 3 * 4096 + 17 + 8192);
	/* every connection closed */
	for (size_t i = 0; i < g.n; i++)
		ck_assert_int_eq(g.p[i].fd, -1);
	/* the images read back and the carrier bytes check out */
	ck_assert_int_eq(cuip_images_read(g.imgdir, &c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.n, 3);
	ck_assert_uint_eq(c.topo[0]->n_carriers, 2);
	ck_assert_int_eq(cuip_images_verify_carriers(g.imgdir, &c, err, sizeof(err)), 0);
	cuip_images_free(&c);
	group_done();
}
END_TEST

START_TEST(a_participant_holding_its_reply_blocks_everyones_next_phase)
{
	group_of(3);
	fk[1].delay_on = "QUIESCE";
	fk[1].delay_ms = 300;
	ck_assert_int_eq(cuip_group_dump(&g), 0);
	int held = ev_first(1, "REP QUIESCE");
	int next = ev_first(-1, "REQ PREPARE_MULTICAST");
	ck_assert_int_ge(held, 0);
	ck_assert_int_gt(next, held);
	/* and the same for SAVE -> PREPARE_UNICAST */
	ck_assert_int_gt(ev_first(-1, "REQ PREPARE_UNICAST"), ev_last(0, "REP SAVE"));
	group_done();
}
END_TEST

START_TEST(dump_stops_at_the_first_failing_participant_and_reopens_the_gates)
{
	group_of(3);
	fk[2].fail_on = "PREPARE_MULTICAST";
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	ck_assert_ptr_nonnull(strstr(g.err, "PREPARE_MULTICAST failed on pid"));
	ck_assert_ptr_nonnull(strstr(g.err, "injected failure"));
	ck_assert_int_lt(ev_first(-1, "REQ SAVE"), 0);
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	ck_assert_int_lt(ev_first(-1, "REQ LOAD"), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_ge(ev_first(i, "REQ RESUME"), 0);
	group_done();
}
END_TEST

START_TEST(failure_after_teardown_rebuilds_from_the_saved_bytes)
{
	group_of(3);
	fk[2].fail_on = "PREPARE_UNICAST";
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	/* the creator reloads its bytes; everyone rebuilds, creators first */
	ck_assert_int_ge(ev_first(0, "REQ LOAD"), 0);
	ck_assert_int_lt(ev_first(1, "REQ LOAD"), 0);
	int last_creators = ev_last(-1, "REP REBUILD1");
	int first_importers = ev_first(-1, "REQ REBUILD2");
	ck_assert_int_ge(last_creators, 0);
	ck_assert_int_gt(first_importers, last_creators);
	ck_assert_int_gt(ev_first(-1, "REQ VERIFY"), ev_last(-1, "REP REBUILD2"));
	for (int i = 0; i < 3; i++)
		ck_assert_int_gt(ev_first(i, "REQ RESUME"), ev_last(-1, "REP VERIFY"));
	group_done();
}
END_TEST

/* A second rollback over a rebuild that died half-way (the guardian's,
 * after criu died in its own): participants say RESTORING, their LOAD ran;
 * it goes on from REBUILD, never LOADs twice. */
START_TEST(a_rollback_over_a_half_done_rebuild_does_not_load_again)
{
	int loads;

	group_of(3);
	fk[2].fail_on = "PREPARE_UNICAST";
	fk[1].fail_on = "REBUILD2"; /* the first rollback dies in REBUILD_IMPORTERS */
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	ck_assert(g.rollback_failed);
	ck_assert_int_ge(ev_first(0, "REQ LOAD"), 0);
	loads = ev_last(0, "REQ LOAD");
	fk[1].fail_on = NULL;
	fk[2].fail_on = NULL;
	ck_assert_int_eq(cuip_group_rollback(&g), 0);
	ck_assert_int_eq(ev_last(0, "REQ LOAD"), loads);
	/* rollbacks of the running job: never "restored" */
	ck_assert_int_gt(fk[0].in_place + fk[1].in_place, 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(fk[i].restored, 0);
	ck_assert_int_eq(fk[0].sync_loads, 0);
	ck_assert_int_gt(ev_last(1, "REQ REBUILD2"), loads);
	for (int i = 0; i < 3; i++)
		ck_assert_int_gt(ev_last(i, "REQ RESUME"), ev_last(-1, "REP VERIFY"));
	group_done();
}
END_TEST

START_TEST(save_moving_fewer_bytes_than_expected_is_refused)
{
	group_of(2);
	fk[0].save_short = 1;
	ck_assert_int_eq(cuip_group_dump(&g), -EIO);
	ck_assert_ptr_nonnull(strstr(g.err, "SAVE failed"));
	ck_assert_ptr_nonnull(strstr(g.err, "expected"));
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	ck_assert_int_ge(ev_first(1, "REQ RESUME"), 0);
	group_done();
}
END_TEST

START_TEST(save_reply_with_an_extent_beyond_its_files_is_refused)
{
	group_of(2);
	fk[0].bad_extent = 1;
	ck_assert_int_eq(cuip_group_dump(&g), -EPROTO);
	ck_assert_msg(strstr(g.err, "with an extent in file 7 of 1"), "%s", g.err);
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	ck_assert_int_ge(ev_first(1, "REQ RESUME"), 0);
	group_done();
}
END_TEST

START_TEST(save_reply_whose_extents_miss_a_byte_is_refused)
{
	group_of(2);
	fk[0].bad_extent = 2;
	ck_assert_int_eq(cuip_group_dump(&g), -EPROTO);
	ck_assert_msg(strstr(g.err, "whose extents hold"), "%s", g.err);
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	group_done();
}
END_TEST

START_TEST(preflight_refusal_changes_nothing)
{
	group_of(2);
	fk[1].fx.counters.has_raw_imports = 1;
	fk[1].fx.counters.raw_imports = 1;
	ck_assert_int_eq(cuip_group_dump(&g), -EPERM);
	ck_assert_ptr_nonnull(strstr(g.err, "raw"));
	ck_assert_int_lt(ev_first(-1, "REQ QUIESCE"), 0);
	ck_assert_int_lt(ev_first(-1, "REQ RESUME"), 0);
	group_done();
}
END_TEST

START_TEST(restore_rebuilds_creators_before_importers_then_verifies_and_resumes)
{
	static const char *creator[] = {"HANDSHAKE", "LOAD", "REBUILD1", "REBUILD2", "VERIFY", "RESUME", "BYE"};
	static const char *importer[] = {"HANDSHAKE", "REBUILD1", "REBUILD2", "VERIFY", "RESUME", "BYE"};
	struct cuip_ckpt c;
	char err[256];

	group_of(3);
	ck_assert_int_eq(cuip_group_dump(&g), 0);
	ck_assert_int_eq(cuip_images_read(g.imgdir, &c, err, sizeof(err)), 0);
	for (int i = 0; i < 3; i++) {
		fk[i].nlog = 0;
		fk[i].restored = fk[i].in_place = fk[i].sync_loads = 0;
	}
	nev = 0;
	opts.load_sync = 1;
	ck_assert_int_eq(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo), 0);
	opts.load_sync = 0;
	assert_log(0, creator, 7);
	assert_log(1, importer, 6);
	assert_log(2, importer, 6);
	/* A restore from images says so in every LOAD and REBUILD (the
	 * interposer holds its log until RESUME), and passes the copy mode. */
	ck_assert_int_eq(fk[0].restored, 3);
	ck_assert_int_eq(fk[1].restored, 2);
	ck_assert_int_eq(fk[2].restored, 2);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(fk[i].in_place, 0);
	ck_assert_int_eq(fk[0].sync_loads, 1);
	ck_assert_int_gt(ev_first(-1, "REQ REBUILD2"), ev_last(-1, "REP REBUILD1"));
	ck_assert_int_gt(ev_first(-1, "REQ REBUILD1"), ev_last(-1, "REP LOAD"));

	/* a different process answering at a checkpointed pid is refused */
	fk[2].fx.self.id = 0xdead;
	nev = 0;
	ck_assert_int_eq(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo), -ESRCH);
	ck_assert_ptr_nonnull(strstr(g.err, "identity"));
	ck_assert_int_lt(ev_first(-1, "REQ LOAD"), 0);
	cuip_images_free(&c);
	group_done();
}
END_TEST

START_TEST(an_importer_outside_the_group_refuses_the_dump)
{
	uint64_t start = 0;
	char want[160];
	pid_t kid;
	int st;

	/* a live process outside the group fetched the creator's allocation
	 * 1 (the creator recorded it): refused before QUIESCE, naming both */
	kid = fork();
	ck_assert_int_ge(kid, 0);
	if (kid == 0) {
		pause();
		_exit(0);
	}
	ck_assert_int_eq(cuip_proc_stat_start(kid, &start, NULL), 0);
	group_of(2);
	fx_importer(&fk[0].fx, 0, 0xa1, kid, start);
	/* the group is the creator alone */
	g.n = 1;
	ck_assert_int_eq(cuip_group_dump(&g), -EPERM);
	snprintf(want, sizeof(want), "pid %d allocation c0:1 is imported by pid %d (identity 00000000000000a1)",
		 (int)getpid(), (int)kid);
	ck_assert_msg(strstr(g.err, want), "%s", g.err);
	ck_assert_ptr_nonnull(strstr(g.err, "outside the dumped tree"));
	ck_assert_int_lt(ev_first(-1, "REQ QUIESCE"), 0);
	/* an importer that exited before the dump does not block it */
	ck_assert_int_eq(kill(kid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(kid, &st, 0), kid);
	nev = 0;
	ck_assert_msg(cuip_group_dump(&g) == 0, "%s", g.err);
	g.n = 2;
	fk[0].fx.a[0].n_importers = 0;
	group_done();
}
END_TEST

/* ---- the stall bound of the data phases ----------------------------------- */

/* How long the phase named `timed` took, from its start to its barrier. */
static const char *timed;
static double timed_t0, timed_s = -1;

static int time_phase(struct cuip_group *grp, const char *phase, bool after, int status)
{
	(void)grp;
	(void)status;
	if (strcmp(phase, timed))
		return 0;
	if (!after)
		timed_t0 = cuip_now();
	else
		timed_s = cuip_now() - timed_t0;
	return 0;
}

/* Dump group_of(n) (the creator's carrier is 3 * 4096 + 17 + 8192 bytes),
 * read its images back and set up the restore: every log cleared, PHASE
 * timed, the stall bound at STALL_MS. */
#define STALL_MS 300
#define CARRIED	 "20497"
static void dumped_for_restore(int n, struct cuip_ckpt *c, const char *phase)
{
	char err[256];

	group_of(n);
	ck_assert_msg(cuip_group_dump(&g) == 0, "%s", g.err);
	ck_assert_int_eq(cuip_images_read(g.imgdir, c, err, sizeof(err)), 0);
	for (int i = 0; i < n; i++)
		fk[i].nlog = 0;
	nev = 0;
	opts.stall_timeout_ms = STALL_MS;
	timed = phase;
	timed_s = -1;
	g.on_phase = time_phase;
}

START_TEST(the_stall_bound_defaults_to_a_minute_and_refuses_a_bad_value)
{
	struct cuip_opts o;
	char err[256];

	unsetenv("CUINTERPOSE_STALL_TIMEOUT_MS");
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_uint_eq(o.stall_timeout_ms, 60000);
	ck_assert_uint_eq(o.data_timeout_ms, 0); /* the total stays unbounded */
	setenv("CUINTERPOSE_STALL_TIMEOUT_MS", "0", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_uint_eq(o.stall_timeout_ms, 0);
	setenv("CUINTERPOSE_STALL_TIMEOUT_MS", "a while", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "CUINTERPOSE_STALL_TIMEOUT_MS=\"a while\": want a number"), "%s", err);
	unsetenv("CUINTERPOSE_STALL_TIMEOUT_MS");
}
END_TEST

/* The creator (a child process: the coordinator reads its /proc/PID/io)
 * takes LOAD and then neither answers nor reads a byte. */
START_TEST(a_load_that_stops_moving_bytes_fails_within_the_stall_bound)
{
	struct cuip_ckpt c;
	char want[128];

	fk[0].forked = 1;
	fk[0].hang_on = "LOAD";
	dumped_for_restore(2, &c, "LOAD");
	opts.progress_ms = 0; /* the watchdog does not need the progress lines */
	ck_assert_int_eq(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo), -ETIMEDOUT);
	snprintf(want, sizeof(want), "LOAD failed on pid %d: no progress for 0.3 s in LOAD (", (int)fk[0].child);
	ck_assert_msg(strstr(g.err, want), "%s", g.err);
	ck_assert_msg(strstr(g.err, " of " CARRIED " bytes moved)"), "%s", g.err);
	ck_assert_msg(timed_s >= STALL_MS / 1000.0 && timed_s < STALL_MS / 1000.0 + 2.0, "LOAD took %.3f s", timed_s);
	ck_assert_int_lt(ev_first(-1, "REQ REBUILD1"), 0); /* nothing after the failed phase */
	cuip_images_free(&c);
	group_done();
}
END_TEST

/* The same creator reads on through four stall bounds before it answers:
 * slow, not stalled. */
START_TEST(a_slow_load_that_keeps_moving_bytes_is_not_failed)
{
	struct cuip_ckpt c;

	fk[0].forked = 1;
	fk[0].trickle_on = "LOAD";
	fk[0].trickle_ms = 4 * STALL_MS;
	dumped_for_restore(2, &c, "LOAD");
	opts.progress_ms = 50; /* progress lines and the watchdog together */
	ck_assert_msg(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo) == 0, "%s", g.err);
	ck_assert_msg(timed_s >= 4 * STALL_MS / 1000.0, "LOAD took %.3f s", timed_s);
	ck_assert_int_ge(ev_first(1, "REP RESUME"), 0);
	cuip_images_free(&c);
	group_done();
}
END_TEST

/* REBUILD has no byte count: the bound applies to its replies. */
START_TEST(a_rebuild_without_a_reply_fails_within_the_stall_bound)
{
	struct cuip_ckpt c;
	char want[128];

	dumped_for_restore(3, &c, "REBUILD_CREATORS");
	fk[1].hang_on = "REBUILD1";
	ck_assert_int_eq(cuip_group_rebuild(&g, (const Cuip__Topology *const *)c.topo), -ETIMEDOUT);
	snprintf(want, sizeof(want),
		 "REBUILD_CREATORS failed on pid %d: no progress for 0.3 s in REBUILD_CREATORS (no reply)",
		 (int)getpid());
	ck_assert_msg(strstr(g.err, want), "%s", g.err);
	ck_assert_msg(timed_s >= STALL_MS / 1000.0 && timed_s < STALL_MS / 1000.0 + 2.0, "took %.3f s", timed_s);
	/* the others answered and only the silent one failed */
	ck_assert_int_ge(ev_first(0, "REP REBUILD1"), 0);
	ck_assert_int_ge(ev_first(2, "REP REBUILD1"), 0);
	ck_assert_int_lt(ev_first(-1, "REQ REBUILD2"), 0);
	fk[1].hang_on = NULL;
	cuip_images_free(&c);
	group_done();
}
END_TEST

/* At dump, a SAVE that stalls is a failed SAVE: rolled back, every gate
 * reopened, nothing torn down. */
START_TEST(a_save_that_stops_moving_bytes_fails_and_rolls_the_dump_back)
{
	char want[160];

	group_of(3);
	opts.stall_timeout_ms = STALL_MS;
	timed = "SAVE";
	timed_s = -1;
	g.on_phase = time_phase;
	fk[0].hang_on = "SAVE";
	ck_assert_int_eq(cuip_group_dump(&g), -ETIMEDOUT);
	snprintf(want, sizeof(want),
		 "SAVE failed on pid %d: no progress for 0.3 s in SAVE (0 of " CARRIED " bytes moved)", (int)getpid());
	ck_assert_msg(strstr(g.err, want), "%s", g.err);
	ck_assert_msg(timed_s >= STALL_MS / 1000.0 && timed_s < STALL_MS / 1000.0 + 2.0, "SAVE took %.3f s", timed_s);
	ck_assert_int_lt(ev_first(-1, "REQ PREPARE_UNICAST"), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_gt(ev_last(i, "REQ RESUME"), ev_first(0, "REQ SAVE"));
	ck_assert(!g.rollback_failed);
	fk[0].hang_on = NULL;
	group_done();
}
END_TEST

Suite *coord_suite(void);

Suite *coord_suite(void)
{
	Suite *s = suite_create("coordinator");
	TCase *t = tcase_create("phases");

	tcase_set_timeout(t, 30);
	tcase_add_checked_fixture(t, fakes_setup, fakes_teardown);
	tcase_add_test(t, dump_runs_every_phase_in_order_on_every_participant);
	tcase_add_test(t, a_participant_holding_its_reply_blocks_everyones_next_phase);
	tcase_add_test(t, dump_stops_at_the_first_failing_participant_and_reopens_the_gates);
	tcase_add_test(t, failure_after_teardown_rebuilds_from_the_saved_bytes);
	tcase_add_test(t, a_rollback_over_a_half_done_rebuild_does_not_load_again);
	tcase_add_test(t, save_moving_fewer_bytes_than_expected_is_refused);
	tcase_add_test(t, save_reply_with_an_extent_beyond_its_files_is_refused);
	tcase_add_test(t, save_reply_whose_extents_miss_a_byte_is_refused);
	tcase_add_test(t, preflight_refusal_changes_nothing);
	tcase_add_test(t, an_importer_outside_the_group_refuses_the_dump);
	tcase_add_test(t, restore_rebuilds_creators_before_importers_then_verifies_and_resumes);
	suite_add_tcase(s, t);

	t = tcase_create("stall bound");
	tcase_set_timeout(t, 30);
	tcase_add_checked_fixture(t, fakes_setup, fakes_teardown);
	tcase_add_test(t, the_stall_bound_defaults_to_a_minute_and_refuses_a_bad_value);
	tcase_add_test(t, a_load_that_stops_moving_bytes_fails_within_the_stall_bound);
	tcase_add_test(t, a_slow_load_that_keeps_moving_bytes_is_not_failed);
	tcase_add_test(t, a_rebuild_without_a_reply_fails_within_the_stall_bound);
	tcase_add_test(t, a_save_that_stops_moving_bytes_fails_and_rolls_the_dump_back);
	suite_add_tcase(s, t);
	return s;
}
