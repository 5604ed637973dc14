/*
 * check_rules.c - unit tests of what the plugin decides without any other
 * process: option and GPU remap parsing, preflight rules, image writing and
 * validation (corrupt, truncated, wrong version, mismatched participants).
 */
#include "config.h"

#include <sys/types.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixtures.h"
#include "images.h"
#include "options.h"
#include "preflight.h"
#include "outside.h"
#include "importers.h"
#include "procstat.h"
#include "sha256.h"
#include "../../test/tmpname.h"

/* ---- options -------------------------------------------------------------- */

START_TEST(remap_parses_pairs_in_every_uuid_form)
{
	struct cuip_gpu_pair p[4];
	char err[256];
	int n = cuip_parse_remap("GPU-00112233-4455-6677-8899-aabbccddeeff=ffeeddccbbaa99887766554433221100,"
				 "0123456789ABCDEF0123456789abcdef=GPU-fedcba98-7654-3210-fedc-ba9876543210",
				 p, 4, err, sizeof(err));
	ck_assert_int_eq(n, 2);
	ck_assert_int_eq(p[0].old_uuid[0], 0x00);
	ck_assert_int_eq(p[0].old_uuid[15], 0xff);
	ck_assert_int_eq(p[0].new_uuid[0], 0xff);
	ck_assert_int_eq(p[1].old_uuid[8], 0x01);
	ck_assert_int_eq(p[1].new_uuid[15], 0x10);
	char buf[64];
	cuip_format_uuid(p[0].old_uuid, buf, sizeof(buf));
	ck_assert_str_eq(buf, "GPU-00112233-4455-6677-8899-aabbccddeeff");
}
END_TEST

START_TEST(remap_refuses_malformed_entries)
{
	struct cuip_gpu_pair p[2];
	char err[256];

	ck_assert_int_eq(cuip_parse_remap("", p, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_parse_remap("00112233445566778899aabbccddeeff", p, 2, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "OLDUUID=NEWUUID"));
	ck_assert_int_eq(cuip_parse_remap("0011=00112233445566778899aabbccddeeff", p, 2, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "malformed UUID"));
	ck_assert_int_eq(cuip_parse_remap("00112233445566778899aabbccddeeffa=00112233445566778899aabbccddeeff", p, 2,
					  err, sizeof(err)),
			 -EINVAL);
	ck_assert_int_eq(cuip_parse_remap("00112233445566778899aabbccddeefx=00112233445566778899aabbccddeeff", p, 2,
					  err, sizeof(err)),
			 -EINVAL);
	ck_assert_int_eq(cuip_parse_remap("00112233445566778899aabbccddeeff=00112233445566778899aabbccddeeff,,", p, 2,
					  err, sizeof(err)),
			 -EINVAL);
	ck_assert_int_eq(cuip_parse_remap("00112233445566778899aabbccddeeff=00112233445566778899aabbccddeeff,"
					  "00112233445566778899aabbccddeeff=ffffffffffffffffffffffffffffffff",
					  p, 2, err, sizeof(err)),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "twice"));
	/* one trailing comma is tolerated */
	ck_assert_int_eq(cuip_parse_remap("00112233445566778899aabbccddeeff=00112233445566778899aabbccddeeff,", p, 2,
					  err, sizeof(err)),
			 1);
	/* more pairs than room */
	ck_assert_int_eq(cuip_parse_remap("00000000000000000000000000000001=00000000000000000000000000000002,"
					  "00000000000000000000000000000003=00000000000000000000000000000004,"
					  "00000000000000000000000000000005=00000000000000000000000000000006",
					  p, 2, err, sizeof(err)),
			 -EINVAL);
}
END_TEST

START_TEST(options_come_from_the_environment_and_bad_values_are_named)
{
	struct cuip_opts o;
	char err[256];

	unsetenv("CUINTERPOSE_LOCK_TIMEOUT_MS");
	unsetenv("CUINTERPOSE_GPU_REMAP");
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_uint_eq(o.lock_timeout_ms, 0);
	ck_assert_uint_eq(o.chunk_size, 1u << 20);
	ck_assert_int_eq(o.verify_carriers, 0);
	ck_assert_int_eq(o.leave_running, -1);
	ck_assert_int_eq(o.load_sync, 0);
	ck_assert_str_eq(o.libcuda, "libcuda.so.1");

	setenv("CUINTERPOSE_LOCK_TIMEOUT_MS", "2500", 1);
	setenv("CUINTERPOSE_TEST_LEAVE_RUNNING", "yes", 1);
	setenv("CUINTERPOSE_GPU_REMAP", "00112233445566778899aabbccddeeff=ffeeddccbbaa99887766554433221100", 1);
	setenv("CUINTERPOSE_VERIFY_BEFORE_RESTORE", "1", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	unsetenv("CUINTERPOSE_VERIFY_BEFORE_RESTORE");
	ck_assert_int_eq(o.verify_carriers, 1);
	ck_assert_uint_eq(o.lock_timeout_ms, 2500);
	ck_assert_int_eq(o.leave_running, 1);
	ck_assert_uint_eq(o.n_remap, 1);

	setenv("CUINTERPOSE_LOCK_TIMEOUT_MS", "soon", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "CUINTERPOSE_LOCK_TIMEOUT_MS"));
	unsetenv("CUINTERPOSE_LOCK_TIMEOUT_MS");
	setenv("CUINTERPOSE_TEST_CHUNK_SIZE", "12", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "CUINTERPOSE_TEST_CHUNK_SIZE"));
	unsetenv("CUINTERPOSE_TEST_CHUNK_SIZE");
	setenv("CUINTERPOSE_TEST_LOAD_COPIES", "sync", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_int_eq(o.load_sync, 1);
	setenv("CUINTERPOSE_TEST_LOAD_COPIES", "synchronous", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "CUINTERPOSE_TEST_LOAD_COPIES=synchronous: want async|sync");
	unsetenv("CUINTERPOSE_TEST_LOAD_COPIES");
	/* the restore's read-ahead budget: off (0) unless asked, auto (-1), MiB */
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_int_eq(o.prefetch_mb, 0);
	setenv("CUINTERPOSE_PREFETCH_MB", "512", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_int_eq(o.prefetch_mb, 512);
	setenv("CUINTERPOSE_PREFETCH_MB", "0", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_int_eq(o.prefetch_mb, 0);
	setenv("CUINTERPOSE_PREFETCH_MB", "auto", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_int_eq(o.prefetch_mb, -1);
	for (const char *const *v = (const char *const[]){"-1", "12x", "", " 5", "1099511627777", NULL}; *v; v++) {
		char want[128];

		setenv("CUINTERPOSE_PREFETCH_MB", *v, 1);
		if (!**v) { /* empty: the default */
			ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
			ck_assert_int_eq(o.prefetch_mb, 0);
			continue;
		}
		ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), -EINVAL);
		snprintf(want, sizeof(want), "CUINTERPOSE_PREFETCH_MB=%s: want MiB, 0 .. 1099511627776, or auto", *v);
		ck_assert_str_eq(err, want);
	}
	unsetenv("CUINTERPOSE_PREFETCH_MB");
	unsetenv("CUINTERPOSE_TEST_LEAVE_RUNNING");
	unsetenv("CUINTERPOSE_GPU_REMAP");
}
END_TEST

/* One policy: a bad value of any variable the plugin reads, those read
 * outside options.c too, fails the init naming it and its range. */
START_TEST(every_plugin_variable_is_refused_with_its_range)
{
	static const char *const bad[][3] = {
		{"CUINTERPOSE_DRIVER_TIMEOUT_MS", "5s", "CUINTERPOSE_DRIVER_TIMEOUT_MS=5s: want ms, 0 .. 2147483647"},
		{"CUINTERPOSE_GUARDIAN_STOP_MS", "-1", "CUINTERPOSE_GUARDIAN_STOP_MS=-1: want ms, 0 .. 3600000"},
		{"CUINTERPOSE_LOG", "debug", "CUINTERPOSE_LOG=debug: want level, 0 .. 3"},
		{"CUINTERPOSE_VERIFY_BEFORE_RESTORE", "maybe",
		 "CUINTERPOSE_VERIFY_BEFORE_RESTORE=maybe: want 1|yes|true|on or 0|no|false|off"},
		{"CUINTERPOSE_TEST_FAULT", "zap@SAVE", "CUINTERPOSE_TEST_FAULT=zap@SAVE: want kill@POINT|"},
		{"CUINTERPOSE_GPU_REMAP", "0011=22", "CUINTERPOSE_GPU_REMAP=0011=22: want OLDUUID=NEWUUID"},
	};
	struct cuip_opts o;
	char err[256];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv(bad[i][0], bad[i][1], 1);
		ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), -EINVAL);
		ck_assert_msg(!strncmp(err, bad[i][2], strlen(bad[i][2])), "%s: %s", bad[i][0], err);
		unsetenv(bad[i][0]);
	}
	/* CUINTERPOSE_LOG 2 or more: the per-participant lines at info */
	setenv("CUINTERPOSE_LOG", "2", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_int_eq(o.verbose, 1);
	setenv("CUINTERPOSE_LOG", "1", 1);
	ck_assert_int_eq(cuip_opts_load(&o, err, sizeof(err)), 0);
	ck_assert_int_eq(o.verbose, 0);
	unsetenv("CUINTERPOSE_LOG");
}
END_TEST

/* ---- preflight -------------------------------------------------------------- */

static struct fx_proc cr, im;

static void two_procs(void)
{
	fx_init(&cr, 0xc1, 101);
	fx_create(&cr, 1, 1 << 20, 1, 0x10000000);
	fx_create(&cr, 2, 4096, 0, 0x20000000); /* never shared: native */
	fx_init(&im, 0xa1, 102);
	fx_import(&im, 0xc1, 1, 1 << 20, 0x30000000);
}

static int preflight2(char *err, size_t len)
{
	struct cuip_pf_proc p[] = {{101, &cr.st, false}, {102, &im.st, false}};
	return cuip_preflight(p, 2, NULL, NULL, err, len);
}

static pid_t resolve_777(uint64_t id, void *arg)
{
	return id == 0xe1 ? 777 : 0;
}

START_TEST(preflight_accepts_a_creator_and_its_importer)
{
	char err[512] = "";
	two_procs();
	ck_assert_int_eq(preflight2(err, sizeof(err)), 0);
	ck_assert_str_eq(err, "");
}
END_TEST

/* Which allocations SAVE carries: the interposer's `carried` flag where it
 * reports one (private memory too, by default), else the shared ones; only
 * the creator's. A state taken after QUIESCE must say QUIESCED. */
START_TEST(carried_follows_the_interposer_and_a_quiesced_state_must_be_quiesced)
{
	struct cuip_pf_proc p[] = {{101, &cr.st, true}, {102, &im.st, true}};
	Cuip__Allocation *sh, *priv;
	char err[512] = "";

	two_procs();
	sh = cr.st.allocations[0];
	priv = cr.st.allocations[1];
	ck_assert_uint_eq(priv->id->serial, 2);
	ck_assert(cuip_alloc_carried_by(sh, 0xc1));
	ck_assert(!cuip_alloc_carried_by(priv, 0xc1));
	priv->has_carried = 1;
	priv->carried = 1;
	ck_assert(cuip_alloc_carried_by(priv, 0xc1));
	ck_assert_uint_eq(cuip_alloc_carried_bytes(priv), 4096);
	priv->carried = 0; /* CUINTERPOSE_PRIVATE=native */
	ck_assert(!cuip_alloc_carried_by(priv, 0xc1));
	ck_assert(!cuip_alloc_carried_by(im.st.allocations[0], 0xa1)); /* imported: its creator carries it */
	ck_assert(!cuip_alloc_carried_by(sh, 0xa1));

	ck_assert_int_eq(cuip_preflight(p, 2, NULL, NULL, err, sizeof(err)), -EPERM);
	ck_assert_msg(strstr(err, "pid 101 is in interposer phase ACTIVE, not QUIESCED"), "%s", err);
	cr.st.phase = im.st.phase = CUIP__PHASE__PHASE_QUIESCED;
	err[0] = 0;
	ck_assert_int_eq(cuip_preflight(p, 2, NULL, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM); /* not after QUIESCE: ACTIVE expected */
}
END_TEST

START_TEST(preflight_refuses_live_raw_imports_naming_the_process)
{
	char err[512];
	two_procs();
	im.counters.has_raw_imports = 1;
	im.counters.raw_imports = 2;
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "pid 102 holds 2 raw"));
}
END_TEST

START_TEST(preflight_refuses_unsupported_allocations_with_the_reason)
{
	char err[512];
	two_procs();
	int i = fx_create(&cr, 3, 8192, 1, 0);
	cr.a[i].owner = CUIP__OWNER__OWNER_UNSUPPORTED;
	cr.a[i].unsupported_reason = (char *)"FABRIC handle type";
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "pid 101 allocation c1:3"));
	ck_assert_ptr_nonnull(strstr(err, "FABRIC handle type"));
}
END_TEST

START_TEST(preflight_keeps_private_pools_and_refuses_shared_ones_naming_pid_and_pool)
{
	Cuip__Pool priv = CUIP__POOL__INIT, exp = CUIP__POOL__INIT, imp = CUIP__POOL__INIT;
	Cuip__Pool *cp[2] = {&priv, &exp}, *ip[1] = {&imp};
	char err[1024] = "";

	two_procs();
	priv.serial = 1;
	priv.handle_types = 1; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: capable, never exported */
	cr.st.pools = cp;
	cr.st.n_pools = 1;
	ck_assert_int_eq(preflight2(err, sizeof(err)), 0);
	ck_assert_str_eq(err, "");

	imp.serial = 4;
	imp.device = -1;
	imp.has_imported = imp.imported = 1;
	imp.has_live = 1;
	imp.live = 1;
	im.st.pools = ip;
	im.st.n_pools = 1;
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "pid 102 memory pool 4 (device -1) is imported"));
	ck_assert_ptr_nonnull(strstr(err, "cannot be rebuilt at the same addresses"));

	exp.serial = 2;
	exp.has_exported = exp.exported = 1;
	exp.has_destroyed = exp.destroyed = 1;
	cr.st.n_pools = 2;
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	/* the first refusal is the one reported: the creator's */
	ck_assert_ptr_nonnull(strstr(err, "pid 101 memory pool 2 (device 0) is exported"));
	ck_assert_ptr_nonnull(strstr(err, "and destroyed"));
	cr.st.n_pools = 0;
	im.st.n_pools = 0;
}
END_TEST

START_TEST(preflight_refuses_a_sharing_peer_outside_the_tree_naming_both)
{
	struct cuip_pf_proc p[] = {{102, &im.st, false}};
	char err[512];

	two_procs();
	fx_import(&im, 0xe1, 9, 4096, 0x40000000);
	p[0].st = &im.st;
	struct cuip_pf_proc both[] = {{101, &cr.st, false}, {102, &im.st, false}};
	ck_assert_int_eq(cuip_preflight(both, 2, resolve_777, NULL, err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "pid 102 imports allocation e1:9 from pid 777"));
	ck_assert_ptr_nonnull(strstr(err, "outside the dumped tree"));
	/* creator not resolvable: still refused, naming the identity */
	ck_assert_int_eq(cuip_preflight(p, 1, NULL, NULL, err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "00000000000000c1"));
}
END_TEST

/* where() stand-in: pid 555 is a live outsider, 556 gone, 557 unknown, 102
 * is the importer participant; 0 (invisible) cannot be told. */
static pid_t where_stub(const struct cuip_pf_proc *creator, const Cuip__Importer *rec, void *arg)
{
	(void)arg;
	ck_assert_int_eq(creator->pid, 101);
	switch (rec->pid) {
	case 555:
		return 555;
	case 556:
		return 0;
	case 102:
		return 102;
	default:
		return -1;
	}
}

START_TEST(preflight_refuses_a_live_importer_outside_the_tree_naming_both_pids)
{
	struct cuip_pf_proc both[] = {{101, &cr.st, false}, {102, &im.st, false}};
	char err[512];

	two_procs();
	/* the participant importer (by identity, or by pid) and a gone one pass */
	fx_importer(&cr, 0, 0xa1, 4242, 9);
	fx_importer(&cr, 0, 0, 102, 9);
	fx_importer(&cr, 0, 0xbb, 556, 9);
	ck_assert_int_eq(cuip_preflight_importers(both, 2, where_stub, NULL, err, sizeof(err)), 0);
	/* a live outsider is refused, naming the creator, the allocation and it */
	fx_importer(&cr, 0, 0xbc, 555, 9);
	ck_assert_int_eq(cuip_preflight_importers(both, 2, where_stub, NULL, err, sizeof(err)), -EPERM);
	ck_assert_msg(strstr(err, "pid 101 allocation c1:1 is imported by pid 555 (identity 00000000000000bc), a live "
				  "process outside the dumped tree"),
		      "%s", err);
	/* an importer that cannot be placed is refused too */
	cr.a[0].n_importers = 3;
	fx_importer(&cr, 0, 0xbd, 0, 0);
	ck_assert_int_eq(cuip_preflight_importers(both, 2, where_stub, NULL, err, sizeof(err)), -EPERM);
	ck_assert_msg(strstr(err, "pid 101 allocation c1:1 is imported by a process outside the dumped tree that "
				  "cannot be found from here (pid 0 in pid 101's pid namespace"),
		      "%s", err);
	ck_assert_ptr_nonnull(strstr(err, "identity 00000000000000bd"));
	/* the importer's own record (not its creator) is not checked */
	cr.a[0].n_importers = 0;
	fx_importer(&im, 0, 0xbc, 555, 9);
	ck_assert_int_eq(cuip_preflight_importers(both, 2, where_stub, NULL, err, sizeof(err)), 0);
	im.a[0].n_importers = 0;
	/* more importers than recorded: cannot tell, refused */
	cr.a[0].has_importers_dropped = 1;
	cr.a[0].importers_dropped = 3;
	ck_assert_int_eq(cuip_preflight_importers(both, 2, where_stub, NULL, err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "pid 101 allocation c1:1 was imported by more processes than it records (3"));
	cr.a[0].has_importers_dropped = 0;
	cr.a[0].importers_dropped = 0;
	/* a multicast object says so */
	cr.a[0].kind = CUIP__ALLOC_KIND__KIND_MULTICAST;
	fx_importer(&cr, 0, 0xbc, 555, 9);
	ck_assert_int_eq(cuip_preflight_importers(both, 2, where_stub, NULL, err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "pid 101 multicast object c1:1 is imported by pid 555"));
	cr.a[0].kind = CUIP__ALLOC_KIND__KIND_UNICAST;
	cr.a[0].n_importers = 0;
}
END_TEST

START_TEST(importers_are_placed_in_our_pid_namespace_and_the_gone_are_told)
{
	pid_t v[4], kid;
	uint64_t start = 0, kstart = 0;
	struct stat ns;
	int st;

	ck_assert_int_ge(cuip_proc_nspid(getpid(), v, 4), 1);
	ck_assert_int_eq(cuip_proc_stat_start(getpid(), &start, NULL), 0);
	if (cuip_proc_nspid(getpid(), v, 4) == 1) {
		/* the same pid namespace: the pid itself, if it is the same process */
		ck_assert_int_eq(cuip_importer_here(getpid(), getpid(), start), getpid());
		ck_assert_int_eq(cuip_importer_here(getpid(), getpid(), start + 1), 0);
	}
	ck_assert_int_eq(cuip_importer_here(getpid(), 0, start), -1);
	/* by what an invisible importer told of itself */
	ck_assert_int_eq(stat("/proc/self/ns/pid", &ns), 0);
	ck_assert_int_eq(cuip_importer_by_ns(ns.st_ino, v[cuip_proc_nspid(getpid(), v, 4) - 1], start), getpid());
	ck_assert_int_eq(cuip_importer_by_ns(ns.st_ino + 1000000, getpid(), start), 0);
	ck_assert_int_eq(cuip_importer_by_ns(0, getpid(), start), -1);
	/* an exited importer is gone */
	kid = fork();
	ck_assert_int_ge(kid, 0);
	if (kid == 0)
		_exit(0);
	ck_assert_int_eq(waitpid(kid, &st, 0), kid);
	ck_assert_int_eq(cuip_proc_stat_start(kid, &kstart, NULL), -ENOENT);
	ck_assert_int_eq(cuip_importer_here(getpid(), kid, 1), 0);
}
END_TEST

START_TEST(preflight_refuses_a_missing_creator_anchor)
{
	char err[512];
	two_procs();
	cr.st.n_allocations = 0; /* creator released everything */
	cr.st.n_mappings = 0;
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "missing creator anchor"));
}
END_TEST

START_TEST(preflight_refuses_mappings_out_of_bounds)
{
	char err[512];
	two_procs();
	im.m[0].offset = 4096; /* 1 MiB mapping at offset 4 KiB of a 1 MiB allocation */
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "outside allocation c1:1"));
	two_procs();
	im.m[0].va = UINT64_MAX - 10;
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
}
END_TEST

START_TEST(preflight_refuses_processes_not_active_and_duplicate_identities)
{
	char err[512];
	two_procs();
	im.st.phase = CUIP__PHASE__PHASE_FAILED;
	im.st.failure = (char *)"copy failed";
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "FAILED: copy failed"));
	two_procs();
	im.self.id = 0xc1;
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "same interposer identity"));
}
END_TEST

START_TEST(preflight_refuses_multicast_without_a_binding_or_with_two_creators)
{
	Cuip__McProps mcp = CUIP__MC_PROPS__INIT;
	Cuip__McDevice dev = CUIP__MC_DEVICE__INIT, *devp = &dev;
	char err[512];
	int i;

	two_procs();
	i = fx_create(&cr, 7, 2 << 20, 1, 0);
	cr.a[i].kind = CUIP__ALLOC_KIND__KIND_MULTICAST;
	cr.a[i].origin = CUIP__ORIGIN__ORIGIN_MC_CREATE;
	cr.a[i].props = NULL;
	mcp.requested_size = 2 << 20;
	mcp.num_devices = 1;
	cr.a[i].mc = &mcp;
	dev.mc = &cr.aid[i];
	dev.participant = 0xc1;
	dev.device = 0;
	cr.st.mc_devices = &devp;
	cr.st.n_mc_devices = 1;
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "has no binding"));

	/* a second "creator" of the same object in the importer */
	cr.st.n_mc_devices = 0;
	i = fx_import(&im, 0xc1, 7, 2 << 20, 0);
	im.a[i].kind = CUIP__ALLOC_KIND__KIND_MULTICAST;
	im.a[i].origin = CUIP__ORIGIN__ORIGIN_MC_CREATE;
	im.a[i].props = NULL;
	im.a[i].mc = &mcp;
	ck_assert_int_eq(preflight2(err, sizeof(err)), -EPERM);
	ck_assert_ptr_nonnull(strstr(err, "2 creators"));
}
END_TEST

/* ---- images ------------------------------------------------------------------ */

static char dir[64];
static int dirfd_;
static const uint8_t ckid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static Cuip__CarrierEntry ce;
static Cuip__CarrierEntry *cep = &ce;
static Cuip__AllocId ceid;
static uint32_t crcs[2];
static uint8_t shas[2 * CUIP_SHA256_LEN];

static void img_setup(void)
{
	test_tmpname(dir, sizeof(dir), "cuip-img-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	dirfd_ = open(dir, O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(dirfd_, 0);
}

static void img_teardown(void)
{
	char cmd[128];
	close(dirfd_);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* Creator 101 carries 1 MiB + 100 bytes in two chunks of 1 MiB. */
static void write_ckpt(void)
{
	uint64_t size = (1 << 20) + 100;
	uint8_t *buf = malloc(size);
	struct cuip_img_proc ip[2];
	char err[256];
	int fd;

	fx_init(&cr, 0xc1, 101);
	fx_create(&cr, 1, size, 1, 0x10000000);
	fx_init(&im, 0xa1, 102);
	fx_import(&im, 0xc1, 1, size, 0x30000000);
	for (uint64_t i = 0; i < size; i++)
		buf[i] = (uint8_t)(i * 7);
	fd = openat(dirfd_, "cuinterpose-carrier-101.img", O_CREAT | O_WRONLY | O_TRUNC, 0600);
	ck_assert_int_eq(cuip_write_all(fd, buf, size), 0);
	close(fd);
	cuip__carrier_entry__init(&ce);
	cuip__alloc_id__init(&ceid);
	ceid.creator = 0xc1;
	ceid.serial = 1;
	ce.alloc = &ceid;
	ce.file = (char *)"cuinterpose-carrier-101.img";
	ce.offset = 0;
	ce.size = size;
	ce.chunk_size = 1 << 20;
	crcs[0] = cuip_crc32c(0, buf, 1 << 20);
	crcs[1] = cuip_crc32c(0, buf + (1 << 20), 100);
	ce.crc32c = crcs;
	ce.n_crc32c = 2;
	cuip_sha256(buf, 1 << 20, shas);
	cuip_sha256(buf + (1 << 20), 100, shas + CUIP_SHA256_LEN);
	ce.has_sha256 = 1;
	ce.sha256.data = shas;
	ce.sha256.len = sizeof(shas);
	free(buf);
	ip[0] = (struct cuip_img_proc){.st = &cr.st, .carriers = &cep, .n_carriers = 1};
	ip[1] = (struct cuip_img_proc){.st = &im.st};
	ck_assert_int_eq(cuip_images_write(dirfd_, ckid, ip, 2, size, NULL, err, sizeof(err)), 0);
}

static void poke(const char *name, off_t off, uint8_t x)
{
	int fd = openat(dirfd_, name, O_RDWR);
	uint8_t b;
	ck_assert_int_eq(pread(fd, &b, 1, off), 1);
	b ^= x;
	ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

START_TEST(images_round_trip_and_match_the_participant_set)
{
	struct cuip_ckpt c;
	char err[256];
	pid_t same[] = {102, 101}, fewer[] = {101}, other[] = {101, 102, 103};

	write_ckpt();
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.n, 2);
	ck_assert_uint_eq(c.carried_bytes, (1 << 20) + 100);
	ck_assert_uint_eq(c.topo[0]->n_carriers, 1);
	ck_assert_uint_eq(c.topo[1]->state->n_mappings, 1);
	ck_assert_uint_eq(c.topo[1]->state->mappings[0]->va, 0x30000000);
	ck_assert_int_eq(cuip_images_verify_carriers(dirfd_, &c, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_images_match(&c, same, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_images_match(&c, fewer, 1, err, sizeof(err)), -ESRCH);
	ck_assert_ptr_nonnull(strstr(err, "pid 102"));
	ck_assert_int_eq(cuip_images_match(&c, other, 3, err, sizeof(err)), -EEXIST);
	ck_assert_ptr_nonnull(strstr(err, "pid 103"));
	cuip_images_free(&c);
}
END_TEST

START_TEST(images_refuse_a_corrupt_carrier_naming_the_file_and_chunk)
{
	struct cuip_ckpt c;
	char err[256];

	write_ckpt();
	poke("cuinterpose-carrier-101.img", (1 << 20) + 50, 0x40);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_images_verify_carriers(dirfd_, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "cuinterpose-carrier-101.img: corrupt"));
	ck_assert_ptr_nonnull(strstr(err, "chunk 1"));
	cuip_images_free(&c);
}
END_TEST

START_TEST(images_refuse_a_truncated_carrier)
{
	struct cuip_ckpt c;
	char err[256];

	write_ckpt();
	ck_assert_int_eq(truncate(strcat(strcpy((char[128]){0}, dir), "/cuinterpose-carrier-101.img"), 4096), 0);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -ENODATA);
	ck_assert_ptr_nonnull(strstr(err, "cuinterpose-carrier-101.img: truncated"));
}
END_TEST

/* The same carrier striped: chunk 0 in cuinterpose-carrier-101.img, the
 * 100 bytes of chunk 1 in cuinterpose-carrier-101-1.img. `bad` spoils the
 * index: 1 an extent in a third file, 2 a first extent that splits a chunk,
 * 3 a stripe file of another name, 4 65 carrier files. */
static Cuip__CarrierExtent xt[2];
static Cuip__CarrierExtent *xtp[2] = {&xt[0], &xt[1]};
static char *stripe_files[2] = {"cuinterpose-carrier-101.img", "cuinterpose-carrier-101-1.img"};

static void write_striped_ckpt(int bad)
{
	uint64_t size = (1 << 20) + 100;
	uint8_t *buf = malloc(size);
	struct cuip_img_proc ip[2];
	char err[256];
	int fd;

	write_ckpt();
	fd = openat(dirfd_, "cuinterpose-carrier-101.img", O_RDONLY);
	ck_assert_int_eq(cuip_read_all(fd, buf, size), 0);
	close(fd);
	fd = openat(dirfd_, "cuinterpose-carrier-101-1.img", O_CREAT | O_WRONLY | O_TRUNC, 0600);
	ck_assert_int_eq(cuip_write_all(fd, buf + (1 << 20), 100), 0);
	close(fd);
	ck_assert_int_eq(truncate(strcat(strcpy((char[128]){0}, dir), "/cuinterpose-carrier-101.img"), 1 << 20), 0);
	free(buf);
	for (int k = 0; k < 2; k++)
		cuip__carrier_extent__init(&xt[k]);
	xt[0].file = 0;
	xt[0].size = bad == 2 ? (1 << 20) - 4 : 1 << 20;
	xt[1].file = bad == 1 ? 2 : 1;
	xt[1].size = bad == 2 ? 104 : 100;
	ce.extents = xtp;
	ce.n_extents = 2;
	stripe_files[1] = bad == 3 ? "cuinterpose-carrier-101-x.img" : "cuinterpose-carrier-101-1.img";
	ip[0] = (struct cuip_img_proc){
		.st = &cr.st, .carriers = &cep, .n_carriers = 1, .carrier_files = stripe_files, .n_carrier_files = 2};
	if (bad == 4) { /* more files than a SAVE may carry */
		static char *many[CUIP_CARRIER_FILES_MAX + 1];

		for (int k = 0; k <= CUIP_CARRIER_FILES_MAX; k++)
			many[k] = stripe_files[0];
		ip[0].carrier_files = many;
		ip[0].n_carrier_files = CUIP_CARRIER_FILES_MAX + 1;
	}
	ip[1] = (struct cuip_img_proc){.st = &im.st};
	ck_assert_int_eq(cuip_images_write(dirfd_, ckid, ip, 2, size, NULL, err, sizeof(err)), 0);
	ce.extents = NULL;
	ce.n_extents = 0;
}

START_TEST(striped_images_are_read_and_verified_extent_by_extent)
{
	struct cuip_ckpt c;
	char err[256];

	write_striped_ckpt(0);
	ck_assert_msg(cuip_images_read(dirfd_, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.carried_bytes, (1 << 20) + 100);
	ck_assert_uint_eq(c.topo[0]->n_carrier_files, 2);
	ck_assert_uint_eq(c.topo[0]->carriers[0]->n_extents, 2);
	ck_assert_msg(cuip_images_verify_carriers(dirfd_, &c, err, sizeof(err)) == 0, "%s", err);
	cuip_images_free(&c);
	/* A flipped byte in the second stripe: that file, chunk 1. */
	poke("cuinterpose-carrier-101-1.img", 50, 0x40);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_images_verify_carriers(dirfd_, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "cuinterpose-carrier-101-1.img: corrupt: checksum mismatch in chunk 1"), "%s", err);
	cuip_images_free(&c);
	/* Both chunks corrupt: the chunks are checked in parallel, and the one
	 * reported is the first in image order, every time. */
	poke("cuinterpose-carrier-101.img", 10, 0x01);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), 0);
	for (int r = 0; r < 50; r++) {
		err[0] = 0;
		ck_assert_int_eq(cuip_images_verify_carriers(dirfd_, &c, err, sizeof(err)), -EBADMSG);
		ck_assert_msg(strstr(err, "cuinterpose-carrier-101.img: corrupt: checksum mismatch in chunk 0"), "%s",
			      err);
	}
	cuip_images_free(&c);
}
END_TEST

START_TEST(striped_images_refuse_a_bad_index_and_a_missing_stripe)
{
	struct cuip_ckpt c;
	char err[256];

	write_striped_ckpt(1);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "extents do not cover its 1048676 bytes in whole chunks (byte 1048576)"), "%s", err);
	img_teardown();
	img_setup();
	write_striped_ckpt(2);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "extents do not cover its 1048676 bytes in whole chunks (byte 0)"), "%s", err);
	img_teardown();
	img_setup();
	write_striped_ckpt(3);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "carrier file 1 is \"cuinterpose-carrier-101-x.img\", expected "
				  "cuinterpose-carrier-101-1.img"),
		      "%s", err);
	img_teardown();
	img_setup();
	write_striped_ckpt(4);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "cuinterpose-101.img: 65 carrier files, at most 64"), "%s", err);
	img_teardown();
	img_setup();
	write_striped_ckpt(0);
	ck_assert_int_eq(unlinkat(dirfd_, "cuinterpose-carrier-101-1.img", 0), 0);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "cuinterpose-carrier-101-1.img: missing (allocation c1:1 chunk 1)"), "%s", err);
}
END_TEST

START_TEST(images_refuse_corrupt_truncated_and_wrong_version_topologies)
{
	struct cuip_ckpt c;
	char err[256], path[128];
	struct stat sb;

	write_ckpt();
	poke("cuinterpose-102.img", 20, 0x01);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "cuinterpose-102.img"));
	ck_assert_ptr_nonnull(strstr(err, "checksum"));

	write_ckpt();
	snprintf(path, sizeof(path), "%s/cuinterpose-102.img", dir);
	ck_assert_int_eq(stat(path, &sb), 0);
	ck_assert_int_eq(truncate(path, sb.st_size - 3), 0);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -ENODATA);
	ck_assert_ptr_nonnull(strstr(err, "cuinterpose-102.img"));
	ck_assert_ptr_nonnull(strstr(err, "truncated"));

	write_ckpt();
	poke("cuinterpose-inventory.img", 4, 0x02); /* version 1 -> 3 */
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -EPROTONOSUPPORT);
	ck_assert_ptr_nonnull(strstr(err, "cuinterpose-inventory.img"));
	ck_assert_ptr_nonnull(strstr(err, "version"));

	write_ckpt();
	ck_assert_int_eq(unlinkat(dirfd_, "cuinterpose-101.img", 0), 0);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "cuinterpose-101.img: missing"));
}
END_TEST

START_TEST(images_refuse_topologies_from_another_checkpoint)
{
	uint8_t other[16] = {9};
	struct cuip_img_proc ip[1];
	struct cuip_ckpt c;
	char err[256];

	write_ckpt();
	/* rewrite 102's topology under another checkpoint id (mixed dirs) */
	ip[0] = (struct cuip_img_proc){.st = &im.st};
	int fd = openat(dirfd_, "save-inv", O_CREAT | O_WRONLY, 0600);
	close(fd);
	ck_assert_int_eq(renameat(dirfd_, "cuinterpose-inventory.img", dirfd_, "save-inv"), 0);
	ck_assert_int_eq(cuip_images_write(dirfd_, other, ip, 1, 0, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(renameat(dirfd_, "save-inv", dirfd_, "cuinterpose-inventory.img"), 0);
	ck_assert_int_eq(cuip_images_read(dirfd_, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "cuinterpose-102.img belongs to another checkpoint"));
}
END_TEST

/* ---- incremental checkpoints: the parent chain ------------------------------ */

static char cdir[64];
static int cdirfd = -1;
static const uint8_t child_id[16] = {0xc4, 0x11, 0xd0};

/*
 * An incremental checkpoint in cdir of write_ckpt()'s (in `parent`, id
 * pid): chunk 0 is the parent's (a hole here), chunk 1 was written anew.
 * bad: 1 a bitmap of the wrong length, 2 chunk 0's hash not the parent's,
 * 3 another chunk size than the parent's.
 */
static void write_child(const char *parent, const uint8_t *pid, int bad)
{
	static uint32_t ccrc[3];
	static uint8_t csha[3 * CUIP_SHA256_LEN], bits[2] = {0x01, 0};
	uint64_t size = (1 << 20) + 100;
	uint32_t chunk = bad == 3 ? 1 << 19 : 1 << 20;
	uint8_t *buf = malloc(size);
	struct cuip_img_parent par = {.dir = parent};
	struct cuip_img_proc ip[2];
	Cuip__CarrierEntry cc, *ccp = &cc;
	size_t n = (size + chunk - 1) / chunk;
	char err[256], rel[128];
	int fd;

	if (cdirfd < 0) {
		test_tmpname(cdir, sizeof(cdir), "cuip-child-XXXXXX");
		ck_assert_ptr_nonnull(mkdtemp(cdir));
		cdirfd = open(cdir, O_RDONLY | O_DIRECTORY);
		ck_assert_int_ge(cdirfd, 0);
	}
	memcpy(par.id, pid, 16);
	if (parent[0] == '/' && cuip_path_relative(cdir, parent, rel, sizeof(rel)))
		par.rel = rel;
	for (uint64_t i = 0; i < size; i++)
		buf[i] = i < (1 << 20) ? (uint8_t)(i * 7) : (uint8_t)(i * 11);
	for (size_t k = 0; k < n; k++) {
		uint64_t len = size - k * chunk < chunk ? size - k * chunk : chunk;
		ccrc[k] = cuip_crc32c(0, buf + k * chunk, len);
		cuip_sha256(buf + k * chunk, len, csha + k * CUIP_SHA256_LEN);
	}
	if (bad == 2)
		csha[3] ^= 1;
	fd = openat(cdirfd, "cuinterpose-carrier-101.img", O_CREAT | O_WRONLY | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, buf + chunk, size - chunk, chunk), (ssize_t)(size - chunk));
	close(fd);
	free(buf);
	cuip__carrier_entry__init(&cc);
	cc.alloc = &ceid;
	cc.file = (char *)"cuinterpose-carrier-101.img";
	cc.size = size;
	cc.chunk_size = chunk;
	cc.crc32c = ccrc;
	cc.n_crc32c = n;
	cc.has_sha256 = 1;
	cc.sha256.data = csha;
	cc.sha256.len = n * CUIP_SHA256_LEN;
	cc.has_inherited = 1;
	cc.inherited.data = bits;
	cc.inherited.len = bad == 1 ? 2 : (n + 7) / 8;
	ip[0] = (struct cuip_img_proc){.st = &cr.st, .carriers = &ccp, .n_carriers = 1};
	ip[1] = (struct cuip_img_proc){.st = &im.st};
	ck_assert_int_eq(cuip_images_write(cdirfd, child_id, ip, 2, size, &par, err, sizeof(err)), 0);
}

static void chain_teardown(void)
{
	char cmd[128];

	if (cdirfd >= 0) {
		close(cdirfd);
		cdirfd = -1;
		snprintf(cmd, sizeof(cmd), "rm -rf %s", cdir);
		ck_assert_int_eq(system(cmd), 0);
	}
	img_teardown();
}

/* A grandchild in a new directory whose every chunk is the child's. */
static int write_grandchild(char *gdir)
{
	static const uint8_t gid[16] = {0x99};
	static uint8_t all[1] = {0x03};
	struct cuip_img_parent par = {.dir = cdir};
	struct cuip_img_proc ip[2] = {{.st = &cr.st}, {.st = &im.st}};
	Cuip__CarrierEntry gc, *gcp = &gc;
	struct cuip_ckpt c;
	char err[512];
	int gfd, f;

	ck_assert_ptr_nonnull(mkdtemp(gdir));
	gfd = open(gdir, O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(gfd, 0);
	memcpy(par.id, child_id, 16);
	f = openat(gfd, "cuinterpose-carrier-101.img", O_CREAT | O_WRONLY, 0600);
	ck_assert_int_eq(ftruncate(f, (1 << 20) + 100), 0);
	close(f);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), 0);
	gc = *c.topo[0]->carriers[0];
	gc.n_extents = 0;
	gc.extents = NULL;
	gc.inherited.data = all;
	gc.inherited.len = 1;
	ip[0].carriers = &gcp;
	ip[0].n_carriers = 1;
	ck_assert_int_eq(cuip_images_write(gfd, gid, ip, 2, (1 << 20) + 100, &par, err, sizeof(err)), 0);
	cuip_images_free(&c);
	return gfd;
}

START_TEST(a_chain_is_read_flattened_onto_its_parent_and_verified_through_it)
{
	struct cuip_ckpt c;
	const Cuip__CarrierEntry *e;
	char err[512], pfile[128], gdir[64], cmd[128];
	int gfd;

	write_ckpt();
	write_child(dir, ckid, 0);
	ck_assert_msg(cuip_images_read(cdirfd, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.depth, 1);
	e = c.topo[0]->carriers[0];
	/* Chunk 0 from the parent's file (by its path from here), chunk 1
	 * from its own. */
	snprintf(pfile, sizeof(pfile), "../%s/cuinterpose-carrier-101.img", strrchr(dir, '/') + 1);
	ck_assert_uint_eq(c.topo[0]->n_carrier_files, 2);
	ck_assert_str_eq(c.topo[0]->carrier_files[0], "cuinterpose-carrier-101.img");
	ck_assert_str_eq(c.topo[0]->carrier_files[1], pfile);
	ck_assert_uint_eq(e->n_extents, 2);
	ck_assert_uint_eq(e->extents[0]->file, 1);
	ck_assert_uint_eq(e->extents[0]->offset, 0);
	ck_assert_uint_eq(e->extents[0]->size, 1 << 20);
	ck_assert_uint_eq(e->extents[1]->file, 0);
	ck_assert_uint_eq(e->extents[1]->offset, 1 << 20);
	ck_assert_uint_eq(e->extents[1]->size, 100);
	ck_assert_msg(cuip_images_verify_carriers(cdirfd, &c, err, sizeof(err)) == 0, "%s", err);
	cuip_images_free(&c);
	/* Two deep: chunk 0 from the grandparent, chunk 1 from the child. */
	gfd = write_grandchild(test_tmpname(gdir, sizeof(gdir), "cuip-grand-XXXXXX"));
	ck_assert_msg(cuip_images_read(gfd, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.depth, 2);
	e = c.topo[0]->carriers[0];
	ck_assert_uint_eq(c.topo[0]->n_carrier_files, 3);
	snprintf(pfile, sizeof(pfile), "%s/../%s/cuinterpose-carrier-101.img", cdir, strrchr(dir, '/') + 1);
	ck_assert_str_eq(c.topo[0]->carrier_files[1], pfile);
	ck_assert_uint_eq(e->n_extents, 2);
	ck_assert_uint_eq(e->extents[0]->file, 1);
	ck_assert_uint_eq(e->extents[1]->file, 2);
	ck_assert_msg(cuip_images_verify_carriers(gfd, &c, err, sizeof(err)) == 0, "%s", err);
	snprintf(pfile, sizeof(pfile), "%s/cuinterpose-carrier-101.img", cdir);
	ck_assert_str_eq(c.topo[0]->carrier_files[2], pfile);
	cuip_images_free(&c);
	/* The grandparent's chunk 0 damaged: verification names its file. */
	poke("cuinterpose-carrier-101.img", 5, 0x10);
	ck_assert_int_eq(cuip_images_read(gfd, &c, err, sizeof(err)), 0);
	ck_assert_int_eq(cuip_images_verify_carriers(gfd, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, strrchr(dir, '/')) && strstr(err, "chunk 0"), "%s", err);
	cuip_images_free(&c);
	close(gfd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", gdir);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(a_broken_chain_is_refused_naming_the_directory_at_fault)
{
	static const uint8_t other[16] = {0xee};
	struct cuip_ckpt c;
	char err[512], moved[80];

	write_ckpt();
	/* Missing. */
	write_child(dir, ckid, 0);
	snprintf(moved, sizeof(moved), "%s.moved", dir);
	ck_assert_int_eq(rename(dir, moved), 0);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), -ESTALE);
	ck_assert_msg(strstr(err, "of this incremental checkpoint is missing") && strstr(err, dir), "%s", err);
	ck_assert_int_eq(rename(moved, dir), 0);
	/* Another checkpoint there now. */
	write_child(dir, other, 0);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), -ESTALE);
	ck_assert_msg(strstr(err, "is not the one this checkpoint was made against") && strstr(err, "changed parent"),
		      "%s", err);
	/* The parent holds other bytes for an inherited chunk. */
	write_child(dir, ckid, 2);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), -ESTALE);
	ck_assert_msg(strstr(err, "chunk 0 is inherited, but the parent checkpoint") && strstr(err, "changed parent"),
		      "%s", err);
	/* Another chunk size. */
	write_child(dir, ckid, 3);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), -ESTALE);
	ck_assert_msg(
		strstr(err, "holds no such chunks (no such allocation, another size or chunk size, or no hashes)"),
		"%s", err);
	/* A bitmap that does not fit the chunks. */
	write_child(dir, ckid, 1);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "inherits chunks but has 64 SHA-256, 0 device hash and 2 bitmap bytes for 2 chunks"),
		      "%s", err);
	/* Not an absolute directory. */
	write_child("relative/dir", ckid, 0);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, "\"relative/dir\" is not an absolute directory"), "%s", err);
	/* A directory that holds no checkpoint. */
	write_child("/", ckid, 0);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), -ESTALE);
	ck_assert_msg(strstr(err, "/ cannot be read: it holds no cuinterpose inventory"), "%s", err);
	/* Its own parent: the loop ends at CUIP_CHAIN_MAX. */
	write_child(cdir, child_id, 0);
	ck_assert_int_eq(cuip_images_read(cdirfd, &c, err, sizeof(err)), -ELOOP);
	ck_assert_msg(strstr(err, "more than 32 checkpoints in the parent chain"), "%s", err);
}
END_TEST

START_TEST(relative_paths_between_directories)
{
	static const struct {
		const char *from, *to, *want;
	} v[] = {
		{"/x/a", "/x/b", "../b"}, {"/x/a", "/x/a/b", "b"},	     {"/x", "/y", "../y"},
		{"/", "/a", "a"},	  {"/x/ab", "/x/a", "../a"},	     {"/a/b/c", "/a", "../.."},
		{"/a", "/a", "."},	  {"/a/b", "/c/d/e", "../../c/d/e"},
	};
	char out[64];

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		ck_assert_msg(cuip_path_relative(v[i].from, v[i].to, out, sizeof(out)), "%s -> %s", v[i].from, v[i].to);
		ck_assert_msg(!strcmp(out, v[i].want), "%s -> %s: \"%s\", want \"%s\"", v[i].from, v[i].to, out,
			      v[i].want);
	}
	ck_assert(!cuip_path_relative("/a/b/c", "/x", out, 6));
}
END_TEST

/* A chain moved as a whole (its directories keep their places relative to
 * each other) is followed through its relative path; the absolute one is
 * gone. */
START_TEST(a_chain_moved_as_a_whole_is_followed)
{
	char mv[64], pdir[160], cpath[160], err[512], want[160];
	struct cuip_ckpt c;
	int fd;

	write_ckpt();
	write_child(dir, ckid, 0);
	ck_assert_ptr_nonnull(mkdtemp(test_tmpname(mv, sizeof(mv), "cuip-mv-XXXXXX")));
	snprintf(pdir, sizeof(pdir), "%s/%s", mv, strrchr(dir, '/') + 1);
	snprintf(cpath, sizeof(cpath), "%s/%s", mv, strrchr(cdir, '/') + 1);
	ck_assert_int_eq(rename(dir, pdir), 0);
	ck_assert_int_eq(rename(cdir, cpath), 0);
	fd = open(cpath, O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(fd, 0);
	ck_assert_msg(cuip_images_read(fd, &c, err, sizeof(err)) == 0, "%s", err);
	snprintf(want, sizeof(want), "../%s/cuinterpose-carrier-101.img", strrchr(dir, '/') + 1);
	ck_assert_str_eq(c.topo[0]->carrier_files[1], want);
	ck_assert_msg(cuip_images_verify_carriers(fd, &c, err, sizeof(err)) == 0, "%s", err);
	cuip_images_free(&c);
	close(fd);
	ck_assert_int_eq(rename(pdir, dir), 0);
	ck_assert_int_eq(rename(cpath, cdir), 0);
	ck_assert_int_eq(rmdir(mv), 0);
}
END_TEST

/* A child moved alone: where its relative path now leads is no checkpoint,
 * then another checkpoint (a copy of the child itself); the parent is read
 * at its absolute path, which still holds it. */
START_TEST(a_relative_path_to_something_else_falls_back_to_the_absolute_one)
{
	char mv[64], there[160], cpath[160], cmd[512], err[512], want[160], gone[64];
	struct cuip_ckpt c;
	int fd;

	write_ckpt();
	write_child(dir, ckid, 0);
	ck_assert_ptr_nonnull(mkdtemp(test_tmpname(mv, sizeof(mv), "cuip-mv-XXXXXX")));
	snprintf(there, sizeof(there), "%s/%s", mv, strrchr(dir, '/') + 1);
	snprintf(cpath, sizeof(cpath), "%s/%s", mv, strrchr(cdir, '/') + 1);
	ck_assert_int_eq(rename(cdir, cpath), 0);
	ck_assert_int_eq(mkdir(there, 0700), 0); /* no checkpoint where "../<parent>" leads */
	snprintf(want, sizeof(want), "%s/cuinterpose-carrier-101.img", dir);
	for (int round = 0; round < 2; round++) {
		fd = open(cpath, O_RDONLY | O_DIRECTORY);
		ck_assert_int_ge(fd, 0);
		ck_assert_msg(cuip_images_read(fd, &c, err, sizeof(err)) == 0, "round %d: %s", round, err);
		ck_assert_str_eq(c.topo[0]->carrier_files[1], want);
		ck_assert_msg(cuip_images_verify_carriers(fd, &c, err, sizeof(err)) == 0, "%s", err);
		cuip_images_free(&c);
		close(fd);
		/* round 1: another checkpoint there (the child's own files) */
		snprintf(cmd, sizeof(cmd), "cp %s/* %s/", cpath, there);
		ck_assert_int_eq(system(cmd), 0);
	}
	/* Both gone: the message names the absolute path and the relative one. */
	ck_assert_int_eq(rename(dir, test_tmpname(gone, sizeof(gone), "cuip-parent-gone")), 0);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", there);
	ck_assert_int_eq(system(cmd), 0);
	fd = open(cpath, O_RDONLY | O_DIRECTORY);
	ck_assert_int_eq(cuip_images_read(fd, &c, err, sizeof(err)), -ESTALE);
	ck_assert_msg(strstr(err, "is missing (nor is it at ../") && strstr(err, dir), "%s", err);
	close(fd);
	ck_assert_int_eq(rename(gone, dir), 0);
	ck_assert_int_eq(rename(cpath, cdir), 0);
	ck_assert_int_eq(rmdir(mv), 0);
}
END_TEST

Suite *rules_suite(void);

Suite *rules_suite(void)
{
	Suite *s = suite_create("rules");
	TCase *t = tcase_create("options");

	/* Parsing and rule checks over in-memory records: milliseconds each.
	 * 10 s (images: 20 s, they write and re-read files) absorbs a
	 * sanitizer build (2x) on a loaded 2-core machine. */
	tcase_set_timeout(t, 10);

	tcase_add_test(t, remap_parses_pairs_in_every_uuid_form);
	tcase_add_test(t, remap_refuses_malformed_entries);
	tcase_add_test(t, options_come_from_the_environment_and_bad_values_are_named);
	tcase_add_test(t, every_plugin_variable_is_refused_with_its_range);
	suite_add_tcase(s, t);
	t = tcase_create("preflight");
	tcase_set_timeout(t, 60); /* one test forks and reads /proc: a loaded machine is slow */
	tcase_add_test(t, preflight_accepts_a_creator_and_its_importer);
	tcase_add_test(t, carried_follows_the_interposer_and_a_quiesced_state_must_be_quiesced);
	tcase_add_test(t, preflight_refuses_live_raw_imports_naming_the_process);
	tcase_add_test(t, preflight_refuses_unsupported_allocations_with_the_reason);
	tcase_add_test(t, preflight_keeps_private_pools_and_refuses_shared_ones_naming_pid_and_pool);
	tcase_add_test(t, preflight_refuses_a_sharing_peer_outside_the_tree_naming_both);
	tcase_add_test(t, preflight_refuses_a_live_importer_outside_the_tree_naming_both_pids);
	tcase_add_test(t, importers_are_placed_in_our_pid_namespace_and_the_gone_are_told);
	tcase_add_test(t, preflight_refuses_a_missing_creator_anchor);
	tcase_add_test(t, preflight_refuses_mappings_out_of_bounds);
	tcase_add_test(t, preflight_refuses_processes_not_active_and_duplicate_identities);
	tcase_add_test(t, preflight_refuses_multicast_without_a_binding_or_with_two_creators);
	suite_add_tcase(s, t);
	t = tcase_create("images");
	tcase_set_timeout(t, 20);
	tcase_add_checked_fixture(t, img_setup, img_teardown);
	tcase_add_test(t, images_round_trip_and_match_the_participant_set);
	tcase_add_test(t, images_refuse_a_corrupt_carrier_naming_the_file_and_chunk);
	tcase_add_test(t, images_refuse_a_truncated_carrier);
	tcase_add_test(t, striped_images_are_read_and_verified_extent_by_extent);
	tcase_add_test(t, striped_images_refuse_a_bad_index_and_a_missing_stripe);
	tcase_add_test(t, images_refuse_corrupt_truncated_and_wrong_version_topologies);
	tcase_add_test(t, images_refuse_topologies_from_another_checkpoint);
	suite_add_tcase(s, t);
	t = tcase_create("chain");
	tcase_set_timeout(t, 20);
	tcase_add_checked_fixture(t, img_setup, chain_teardown);
	tcase_add_test(t, a_chain_is_read_flattened_onto_its_parent_and_verified_through_it);
	tcase_add_test(t, a_broken_chain_is_refused_naming_the_directory_at_fault);
	tcase_add_test(t, relative_paths_between_directories);
	tcase_add_test(t, a_chain_moved_as_a_whole_is_followed);
	tcase_add_test(t, a_relative_path_to_something_else_falls_back_to_the_absolute_one);
	suite_add_tcase(s, t);
	return s;
}
