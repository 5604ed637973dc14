/*
 * participants.c - the fake participants of participants.h: each serves the
 * control protocol on its own unix socket in a thread of the test (or a
 * child process), answering HANDSHAKE and INSPECT from its fixture state,
 * writing SAVE's bytes (a pattern of the allocation's serial) with their
 * CRC32C, counting LOAD's bytes, and recording every request and reply as
 * an event (ev_lock).
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
#include <sys/mman.h>
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
#include "participants.h"
#include "../../test/tmpname.h"

struct fake fk[NFAKE];
void (*fake_thread_start)(void);
static char tdir[64];

static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	int fake;
	char what[32];
} ev[1024];
int nev;

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
int ev_first(int fake, const char *what)
{
	for (int i = 0; i < nev; i++)
		if ((fake < 0 || ev[i].fake == fake) && !strcmp(ev[i].what, what))
			return i;
	return -1;
}

int ev_last(int fake, const char *what)
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

/* The progress page (protocol/progress.h), when SAVE brings one: written
 * as a SAVE that scanned and copied everything would. */
static void fill_progress(int page, uint64_t total)
{
	struct cuip_save_progress *pg = mmap(NULL, CUIP_PROGRESS_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, page, 0);

	ck_assert_ptr_ne(pg, MAP_FAILED);
	cuip_progress_store(&pg->scanned, total);
	cuip_progress_store(&pg->copied, total);
	cuip_progress_store(&pg->done, total);
	cuip_progress_store(&pg->magic, CUIP_PROGRESS_MAGIC);
	munmap(pg, CUIP_PROGRESS_PAGE);
}

static void handle_save(struct fake *f, const Cuip__Save *s, int fd, int page, Cuip__Response *resp,
			Cuip__SaveReply *sr)
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
	if (page >= 0) {
		fill_progress(page, total);
		sr->has_scanned_bytes = sr->has_copied_bytes = 1;
		sr->scanned_bytes = sr->copied_bytes = total;
	}
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
		int fds[2] = {-1, -1}, fd = -1, page = -1, bye;
		size_t nfds = 0;

		/* a SAVE's progress page comes after its carrier file */
		if (cuip_msg_recvv(c, CUIP_KIND_REQUEST, &cuip__request__descriptor, NULL, &m, fds, 2, &nfds, err,
				   sizeof(err)))
			break;
		fd = nfds ? fds[0] : -1;
		req = (Cuip__Request *)m;
		if (nfds > 1 && req->body_case == CUIP__REQUEST__BODY_SAVE && req->save->progress_page)
			page = fds[1];
		else if (nfds > 1)
			close(fds[1]);
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
			if (page >= 0)
				close(page);
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
			handle_save(f, req->save, fd, page, &resp, &sr);
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
		if (page >= 0)
			close(page);
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

	if (fake_thread_start)
		fake_thread_start();
	while ((c = accept(f->lfd, NULL, NULL)) >= 0)
		serve(f, c);
	return NULL;
}

void fakes_setup(void)
{
	test_tmpname(tdir, sizeof(tdir), "cuip-coord-XXXXXX");
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

void fakes_teardown(void)
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

struct cuip_opts opts;
struct cuip_group g;

/* Creator 0 (two shared allocations, one not a multiple of the chunk, plus a
 * private one), importers 1..n-1 mapping the first shared one. */
void group_of(int n)
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
	ck_assert(n > 0 && n <= NFAKE);
	g.n = (size_t)n;
	g.p = calloc(NFAKE, sizeof(*g.p));
	for (int i = 0; i < n; i++) {
		g.p[i].pid = fk[i].forked ? fk[i].child : getpid();
		g.p[i].vpid = (pid_t)fk[i].fx.self.pid;
		g.p[i].fd = -1;
		strcpy(g.p[i].sock, fk[i].path);
	}
}

void group_done(void)
{
	close(g.imgdir);
	cuip_group_free(&g);
}

void assert_log(int i, const char *const *want, int n)
{
	ck_assert_int_eq(fk[i].nlog, n);
	for (int k = 0; k < n; k++)
		ck_assert_str_eq(fk[i].log[k], want[k]);
}
