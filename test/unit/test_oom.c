/*
 * test_oom.c - out-of-memory injection over the protocol library (protocol/,
 * compiled into this test with test/harness/failalloc.h): for each path, a
 * clean run counts its allocations, then the path runs again with the 1st,
 * the 2nd, ... the last of them failing. Each such run must return an error
 * that names what failed, or succeed with the same result; it must not
 * crash or leak (the sanitizer build checks leaks), and the images on disk
 * stay readable afterwards. Paths: framing (encode, send and receive over a
 * socket), writing a checkpoint with a parent, reading it back through its
 * parent chain with verification and flattening (also of an entry that
 * inherits nothing), the importer sets. Flattening refuses stored lengths
 * an entry (the child's or its parent's) cannot have.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "failalloc.h"
#include "fixtures.h"
#include "images.h"
#include "importers.h"
#include "sha256.h"
#include "wire.h"
#include "../tmpname.h"

#define SIZE  ((1u << 20) + 100) /* creator 101 carries two chunks of 1 MiB */
#define CHUNK (1u << 20)

typedef int path_fn(char *err, size_t errlen);

/*
 * Run fn clean (it must succeed), then with each of its allocations failing
 * in turn. check(), when given, verifies what a successful run produced.
 * Returns how many allocations the clean run made.
 */
static unsigned long exhaust(const char *name, path_fn *fn, void (*check)(void))
{
	char err[512];
	unsigned long total, failed = 0;

	failalloc_arm(0);
	err[0] = 0;
	ck_assert_msg(fn(err, sizeof(err)) == 0, "%s, clean: %s", name, err);
	total = failalloc_count();
	ck_assert_msg(total > 0, "%s: no allocation counted: the injection reaches nothing", name);
	for (unsigned long n = 1; n <= total; n++) {
		int rc;

		err[0] = 0;
		failalloc_arm(n);
		rc = fn(err, sizeof(err));
		ck_assert_msg(failalloc_fired(), "%s: allocation %lu of %lu not reached", name, n, total);
		failalloc_arm(0);
		if (rc) {
			ck_assert_msg(rc < 0, "%s: allocation %lu failed: returned %d", name, n, rc);
			ck_assert_msg(err[0], "%s: allocation %lu failed: error %d without a message", name, n, rc);
			/* Memory that ran out is never blamed on the bytes. */
			ck_assert_msg(!strstr(err, "corrupt") && !strstr(err, "does not decode"),
				      "%s: allocation %lu failed, reported as damage: %s", name, n, err);
			failed++;
		} else if (check) {
			check();
		}
		/* Nothing lost: the path works again right after. */
		err[0] = 0;
		ck_assert_msg(fn(err, sizeof(err)) == 0, "%s, after allocation %lu failed: %s", name, n, err);
	}
	ck_assert_msg(failed > 0, "%s: no failed allocation made the path fail", name);
	printf("%s: %lu allocations, %lu failures reported\n", name, total, failed);
	return total;
}

/* ---- framing ---------------------------------------------------------------- */

static struct fx_proc cr, im;

static int frame_path(char *err, size_t errlen)
{
	Cuip__Response resp = CUIP__RESPONSE__INIT, *got = NULL;
	ProtobufCMessage *m = NULL;
	uint8_t *buf;
	ssize_t len;
	int sv[2], rc, fd = -1;

	resp.body_case = CUIP__RESPONSE__BODY_STATE;
	resp.state = &cr.st;
	len = cuip_encode(CUIP_KIND_RESPONSE, &resp.base, &buf);
	if (len < 0) {
		snprintf(err, errlen, "encode: %s", strerror((int)-len));
		return (int)len;
	}
	rc = cuip_decode(buf, (size_t)len, CUIP_KIND_RESPONSE, &cuip__response__descriptor, NULL, &m, err, errlen);
	free(buf);
	if (rc)
		return rc;
	protobuf_c_message_free_unpacked(m, NULL);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	rc = cuip_msg_send(sv[0], CUIP_KIND_RESPONSE, &resp.base, -1);
	if (rc)
		snprintf(err, errlen, "send: %s", strerror(-rc));
	else
		rc = cuip_msg_recv(sv[1], CUIP_KIND_RESPONSE, &cuip__response__descriptor, NULL, &m, &fd, err, errlen);
	close(sv[0]);
	close(sv[1]);
	if (rc)
		return rc;
	got = (Cuip__Response *)m;
	ck_assert_int_eq(fd, -1);
	ck_assert_uint_eq(got->state->self->pid, 101);
	ck_assert_uint_eq(got->state->n_allocations, 1);
	protobuf_c_message_free_unpacked(m, NULL);
	return 0;
}

/* ---- a checkpoint and its parent ---------------------------------------------- */

static char pdir[64], cdir[64];
static int pfd = -1, cfd = -1;
static const uint8_t pid_[16] = {1, 2, 3}, cid[16] = {4, 5, 6};
static Cuip__AllocId ceid = CUIP__ALLOC_ID__INIT;
static uint32_t pcrc[2], ccrc[2];
static uint8_t psha[2 * CUIP_SHA256_LEN], csha[2 * CUIP_SHA256_LEN], bits[1] = {0x01};
static Cuip__CarrierEntry pe = CUIP__CARRIER_ENTRY__INIT, ce = CUIP__CARRIER_ENTRY__INIT, *pep = &pe, *cep = &ce;

/* Byte i of the carried allocation in the parent (gen 0) and the child (1):
 * chunk 0 is the same in both. */
static uint8_t byte_at(uint64_t i, int gen)
{
	return i < CHUNK || !gen ? (uint8_t)(i * 7) : (uint8_t)(i * 11);
}

static void entry(Cuip__CarrierEntry *e, int gen, uint32_t *crc, uint8_t *sha, int fd)
{
	uint8_t *buf = malloc(SIZE);

	ck_assert_ptr_nonnull(buf);
	for (uint64_t i = 0; i < SIZE; i++)
		buf[i] = byte_at(i, gen);
	crc[0] = cuip_crc32c(0, buf, CHUNK);
	crc[1] = cuip_crc32c(0, buf + CHUNK, SIZE - CHUNK);
	cuip_sha256(buf, CHUNK, sha);
	cuip_sha256(buf + CHUNK, SIZE - CHUNK, sha + CUIP_SHA256_LEN);
	/* The child's file holds only what it did not inherit (a hole first). */
	ck_assert_int_eq(pwrite(fd, buf + (gen ? CHUNK : 0), gen ? SIZE - CHUNK : SIZE, gen ? CHUNK : 0),
			 (ssize_t)(gen ? SIZE - CHUNK : SIZE));
	free(buf);
	e->alloc = &ceid;
	e->file = (char *)"cuinterpose-carrier-101.img";
	e->size = SIZE;
	e->chunk_size = CHUNK;
	e->crc32c = crc;
	e->n_crc32c = 2;
	e->has_sha256 = 1;
	e->sha256.data = sha;
	e->sha256.len = 2 * CUIP_SHA256_LEN;
	if (gen) {
		e->has_inherited = 1;
		e->inherited.data = bits;
		e->inherited.len = 1;
	}
}

static int write_child(char *err, size_t errlen)
{
	struct cuip_img_parent par = {.dir = pdir};
	struct cuip_img_proc ip[2] = {{.st = &cr.st, .carriers = &cep, .n_carriers = 1}, {.st = &im.st}};

	memcpy(par.id, pid_, 16);
	return cuip_images_write(cfd, cid, ip, 2, SIZE, &par, err, errlen);
}

static void setup(void)
{
	struct cuip_img_proc ip[2] = {{.st = &cr.st, .carriers = &pep, .n_carriers = 1}, {.st = &im.st}};
	char err[512];
	int f;

	fx_init(&cr, 0xc1, 101);
	fx_create(&cr, 1, SIZE, 1, 0x10000000);
	fx_init(&im, 0xa1, 102);
	fx_import(&im, 0xc1, 1, SIZE, 0x30000000);
	ceid.creator = 0xc1;
	ceid.serial = 1;
	test_tmpname(pdir, sizeof(pdir), "cuip-oom-p-XXXXXX");
	test_tmpname(cdir, sizeof(cdir), "cuip-oom-c-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(pdir));
	ck_assert_ptr_nonnull(mkdtemp(cdir));
	pfd = open(pdir, O_RDONLY | O_DIRECTORY);
	cfd = open(cdir, O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(pfd, 0);
	ck_assert_int_ge(cfd, 0);
	f = openat(pfd, "cuinterpose-carrier-101.img", O_CREAT | O_WRONLY | O_TRUNC, 0600);
	entry(&pe, 0, pcrc, psha, f);
	close(f);
	ck_assert_msg(cuip_images_write(pfd, pid_, ip, 2, SIZE, NULL, err, sizeof(err)) == 0, "%s", err);
	f = openat(cfd, "cuinterpose-carrier-101.img", O_CREAT | O_WRONLY | O_TRUNC, 0600);
	entry(&ce, 1, ccrc, csha, f);
	close(f);
	ck_assert_msg(write_child(err, sizeof(err)) == 0, "%s", err);
}

static void teardown(void)
{
	char cmd[192];

	close(pfd);
	close(cfd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s %s", pdir, cdir);
	ck_assert_int_eq(system(cmd), 0);
}

/* Read the child through its parent, verify every byte, flatten its
 * creator's topology again as a rollback does. */
static int read_child(char *err, size_t errlen)
{
	struct cuip_ckpt c, par;
	Cuip__Topology *flat = NULL;
	const char *via;
	int rc;

	rc = cuip_images_read(cfd, &c, err, errlen);
	if (rc)
		return rc;
	ck_assert_uint_eq(c.depth, 1);
	ck_assert_uint_eq(c.n, 2);
	ck_assert_uint_eq(c.topo[0]->carriers[0]->n_extents, 2);
	ck_assert_uint_eq(c.topo[0]->carriers[0]->extents[0]->file, 1); /* chunk 0: the parent's file */
	ck_assert_uint_eq(c.topo[0]->carriers[0]->extents[1]->file, 0);
	rc = cuip_images_verify_carriers(cfd, &c, err, errlen);
	if (!rc)
		rc = cuip_images_read_parent(cfd, c.inv, &par, &via, err, errlen);
	if (!rc) {
		ck_assert_uint_eq(par.depth, 0);
		rc = cuip_images_flatten(c.topo[0], pdir, &par, &flat, err, errlen);
		cuip_images_free(&par);
	}
	if (!rc) {
		ck_assert_uint_eq(flat->carriers[0]->n_extents, 2);
		cuip__topology__free_unpacked(flat, NULL);
	}
	cuip_images_free(&c);
	return rc;
}

/* The child with a second allocation beside the one that inherits chunk 0,
 * written whole (its entry inherits nothing): flattening keeps it in its
 * own file, both chunks as one run, and looks up no parent entry for it. */
static int flatten_own(char *err, size_t errlen)
{
	struct cuip_ckpt c, par;
	Cuip__Topology *flat = NULL, two;
	Cuip__CarrierEntry fresh, *both[2];
	Cuip__AllocId id2 = CUIP__ALLOC_ID__INIT;
	const char *via;
	int rc;

	rc = cuip_images_read(cfd, &c, err, errlen);
	if (rc)
		return rc;
	two = *c.topo[0];
	fresh = *c.topo[0]->carriers[0];
	id2.creator = 0xc1;
	id2.serial = 2;
	fresh.alloc = &id2;
	fresh.has_inherited = 0;
	fresh.n_extents = 0;
	both[0] = c.topo[0]->carriers[0];
	both[1] = &fresh;
	two.carriers = both;
	two.n_carriers = 2;
	rc = cuip_images_read_parent(cfd, c.inv, &par, &via, err, errlen);
	if (!rc) {
		rc = cuip_images_flatten(&two, pdir, &par, &flat, err, errlen);
		cuip_images_free(&par);
	}
	if (!rc) {
		ck_assert_uint_eq(flat->n_carriers, 2);
		ck_assert_uint_eq(flat->carriers[0]->extents[0]->file, 1); /* chunk 0: the parent's file */
		ck_assert_uint_eq(flat->carriers[1]->n_extents, 1);	   /* both chunks, one run of its own file */
		ck_assert_uint_eq(flat->carriers[1]->extents[0]->file, 0);
		ck_assert_uint_eq(flat->carriers[1]->extents[0]->size, SIZE);
		ck_assert_uint_eq(flat->carriers[1]->n_stored, 0);
		cuip__topology__free_unpacked(flat, NULL);
	}
	cuip_images_free(&c);
	return rc;
}

/* Flatten the child after giving the child's (or the parent's) entry n
 * stored lengths for its 2 chunks; returns flatten's answer. */
static int flatten_stored(int parent, size_t n, char *err, size_t errlen)
{
	static uint32_t lens[3] = {4096, 0, 0};
	struct cuip_ckpt c, par;
	Cuip__Topology *flat = NULL;
	const char *via;
	int rc;

	ck_assert_int_eq(cuip_images_read(cfd, &c, err, errlen), 0);
	ck_assert_int_eq(cuip_images_read_parent(cfd, c.inv, &par, &via, err, errlen), 0);
	Cuip__CarrierEntry *e = parent ? par.topo[0]->carriers[0] : c.topo[0]->carriers[0];
	size_t had = e->n_stored;
	uint32_t *was = e->stored;

	e->n_stored = n;
	e->stored = lens;
	rc = cuip_images_flatten(c.topo[0], pdir, &par, &flat, err, errlen);
	e->n_stored = had;
	e->stored = was;
	if (flat) {
		ck_assert_uint_eq(flat->carriers[0]->n_stored, 2);
		/* chunk 0 is inherited: its length is the parent's */
		ck_assert_uint_eq(flat->carriers[0]->stored[0], parent ? 4096 : 0);
		ck_assert_uint_eq(flat->carriers[0]->stored[1], 0);
		cuip__topology__free_unpacked(flat, NULL);
	}
	cuip_images_free(&par);
	cuip_images_free(&c);
	return rc;
}

START_TEST(flattening_an_entry_that_inherits_nothing_survives_each_failed_allocation)
{
	exhaust("flatten own", flatten_own, NULL);
}
END_TEST

START_TEST(flattening_refuses_stored_lengths_of_the_wrong_count)
{
	char err[512];

	ck_assert_msg(flatten_stored(1, 2, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(flatten_stored(0, 2, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(flatten_stored(0, 3, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "carrier entry 0 has 3 stored lengths for 2 chunks"), "%s", err);
	ck_assert_int_eq(flatten_stored(1, 1, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, pdir) &&
			      strstr(err, "topology of pid 101: carrier entry 0 has 1 stored lengths for 2"),
		      "%s", err);
}
END_TEST

START_TEST(framing_survives_each_failed_allocation)
{
	fx_init(&cr, 0xc1, 101);
	fx_create(&cr, 1, SIZE, 1, 0x10000000);
	exhaust("framing", frame_path, NULL);
}
END_TEST

START_TEST(writing_a_checkpoint_with_a_parent_survives_each_failed_allocation)
{
	exhaust("write", write_child, NULL);
}
END_TEST

START_TEST(reading_a_chain_survives_each_failed_allocation)
{
	exhaust("read", read_child, NULL);
}
END_TEST

/* ---- importer sets ---------------------------------------------------------- */

static int alive_all(const struct cuip_importer *p)
{
	(void)p;
	return 1;
}

static struct cuip_importers set_got;

static int importers_path(char *err, size_t errlen)
{
	struct cuip_importers s = {0};
	int rc = 0;

	for (pid_t p = 1; p <= 40 && rc >= 0; p++) {
		struct cuip_importer e = {.pid = p, .start = (uint64_t)p * 10, .id = (uint64_t)p};
		rc = cuip_importers_add(&s, &e, alive_all);
	}
	if (rc < 0) {
		snprintf(err, errlen, "cuip_importers_add: %s", strerror(-rc));
		cuip_importers_free(&s);
		return rc;
	}
	set_got.n = s.n;
	set_got.dropped = s.dropped;
	cuip_importers_free(&s);
	return 0;
}

static void importers_check(void)
{
	ck_assert_uint_eq(set_got.n, 40);
	ck_assert_uint_eq(set_got.dropped, 0);
}

START_TEST(importer_sets_survive_each_failed_allocation)
{
	exhaust("importers", importers_path, importers_check);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("oom");
	TCase *t = tcase_create("protocol library");
	SRunner *sr;
	int failed;

	tcase_set_timeout(t, 120);
	tcase_add_test(t, framing_survives_each_failed_allocation);
	tcase_add_checked_fixture(t, setup, teardown);
	tcase_add_test(t, writing_a_checkpoint_with_a_parent_survives_each_failed_allocation);
	tcase_add_test(t, reading_a_chain_survives_each_failed_allocation);
	tcase_add_test(t, flattening_an_entry_that_inherits_nothing_survives_each_failed_allocation);
	tcase_add_test(t, flattening_refuses_stored_lengths_of_the_wrong_count);
	tcase_add_test(t, importer_sets_survive_each_failed_allocation);
	suite_add_tcase(s, t);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
