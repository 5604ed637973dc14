/*
 * fuzz_replay.c - runs the fuzz target without libFuzzer, for `make check`
 * with any compiler (and under the sanitizers): valid seeds of every kind,
 * then a deterministic mutation loop (bit flips, byte overwrites,
 * truncations, length-field edits, with and without a matching checksum),
 * then any files named on the command line (a saved corpus or crash).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern unsigned long fuzz_round_trips;

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Seeds: one valid, non-trivial message per kind, framed. */
#define N_SEEDS 7

static size_t seeds(uint8_t *out[N_SEEDS], size_t lens[N_SEEDS])
{
	static uint8_t token[16] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
	static uint32_t crcs[3] = {1, 2, 3};
	Cuip__ProcessId self = CUIP__PROCESS_ID__INIT;
	Cuip__AllocId id = CUIP__ALLOC_ID__INIT;
	Cuip__AllocProps props = CUIP__ALLOC_PROPS__INIT;
	Cuip__Allocation a = CUIP__ALLOCATION__INIT, *ap[1] = {&a};
	Cuip__Access acc = CUIP__ACCESS__INIT, *accp[1] = {&acc};
	Cuip__Mapping mp = CUIP__MAPPING__INIT, *mpp[1] = {&mp};
	Cuip__ProcessState st = CUIP__PROCESS_STATE__INIT;
	Cuip__CarrierEntry ce = CUIP__CARRIER_ENTRY__INIT, *cep[1] = {&ce};
	Cuip__Topology topo = CUIP__TOPOLOGY__INIT;
	Cuip__Inventory inv = CUIP__INVENTORY__INIT;
	Cuip__ProcessId *parts[1] = {&self};
	Cuip__Ticket t = CUIP__TICKET__INIT;
	Cuip__Request req = CUIP__REQUEST__INIT;
	Cuip__Fetch fetch = CUIP__FETCH__INIT, *fetchp[1] = {&fetch};
	Cuip__FetchMany fm = CUIP__FETCH_MANY__INIT;
	Cuip__Response resp = CUIP__RESPONSE__INIT;
	static uint8_t uuid_a[16] = {0xaa, 1}, uuid_b[16] = {0xbb, 2};
	static int32_t pids[3] = {1234, 1235, 40000};
	Cuip__GpuPair pair = CUIP__GPU_PAIR__INIT, *pairp[1] = {&pair};
	Cuip__AgentRequest areq = CUIP__AGENT_REQUEST__INIT;
	Cuip__AgentMessage am = CUIP__AGENT_MESSAGE__INIT;
	Cuip__GuardianTopology gt = CUIP__GUARDIAN_TOPOLOGY__INIT;
	Cuip__GuardianMessage gm = CUIP__GUARDIAN_MESSAGE__INIT;

	self.id = 77;
	self.pid = 1234;
	id.creator = 77;
	id.serial = 3;
	props.size = 4 << 20;
	a.id = &id;
	a.kind = CUIP__ALLOC_KIND__KIND_UNICAST;
	a.owner = CUIP__OWNER__OWNER_SHARED;
	a.origin = CUIP__ORIGIN__ORIGIN_VMM_CREATE;
	a.props = &props;
	acc.va = 0x7f0000000000;
	acc.size = 4 << 20;
	acc.flags = 3;
	mp.va = acc.va;
	mp.size = acc.size;
	mp.alloc = &id;
	mp.n_access = 1;
	mp.access = accp;
	st.self = &self;
	st.phase = CUIP__PHASE__PHASE_ACTIVE;
	st.n_allocations = 1;
	st.allocations = ap;
	st.n_mappings = 1;
	st.mappings = mpp;
	ce.alloc = &id;
	ce.file = "cuinterpose-carrier-1234.img";
	ce.size = 5 << 20;
	ce.chunk_size = 2 << 20;
	ce.n_crc32c = 3;
	ce.crc32c = crcs;
	topo.checkpoint_id.data = token;
	topo.checkpoint_id.len = 16;
	topo.state = &st;
	topo.n_carriers = 1;
	topo.carriers = cep;
	inv.checkpoint_id = topo.checkpoint_id;
	inv.n_participants = 1;
	inv.participants = parts;
	t.alloc = &id;
	t.kind = CUIP__ALLOC_KIND__KIND_UNICAST;
	t.token.data = token;
	t.token.len = 16;
	t.creator = &self;
	t.creator_socket = "/run/cuinterpose/1234-000000000000004d.sock";
	fetch.alloc = &id;
	fetch.token = t.token;
	fm.n_items = 1;
	fm.items = fetchp;
	req.body_case = CUIP__REQUEST__BODY_FETCH_MANY;
	req.fetch_many = &fm;
	resp.status = 0;
	resp.body_case = CUIP__RESPONSE__BODY_STATE;
	resp.state = &st;

	pair.old_uuid = (ProtobufCBinaryData){16, uuid_a};
	pair.new_uuid = (ProtobufCBinaryData){16, uuid_b};
	areq.op = 5;
	areq.has_timeout_ms = true;
	areq.timeout_ms = 1000;
	areq.n_remap = 1;
	areq.remap = pairp;
	areq.n_pids = 3;
	areq.pids = pids;
	am.body_case = CUIP__AGENT_MESSAGE__BODY_REQUEST;
	am.request = &areq;
	gt.index = 2;
	gt.topology = &topo;
	gm.body_case = CUIP__GUARDIAN_MESSAGE__BODY_TOPOLOGY;
	gm.topology = &gt;

	const ProtobufCMessage *msgs[N_SEEDS] = {&req.base, &resp.base, &topo.base, &inv.base,
						 &t.base,   &am.base,	&gm.base};
	const unsigned kinds[N_SEEDS] = {CUIP_KIND_REQUEST, CUIP_KIND_RESPONSE, CUIP_KIND_TOPOLOGY, CUIP_KIND_INVENTORY,
					 CUIP_KIND_TICKET,  CUIP_KIND_AGENT,	CUIP_KIND_GUARDIAN};
	for (int i = 0; i < N_SEEDS; i++) {
		uint8_t *enc;
		ssize_t n = cuip_encode(kinds[i], msgs[i], &enc);
		if (n < 0)
			abort();
		out[i] = malloc((size_t)n + 1);
		out[i][0] = (uint8_t)i;
		memcpy(out[i] + 1, enc, (size_t)n);
		lens[i] = (size_t)n + 1;
		free(enc);
	}
	return N_SEEDS;
}

static void run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (!f) {
		perror(path);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = malloc((size_t)n + 1);
	if (fread(buf, 1, (size_t)n, f) != (size_t)n)
		exit(1);
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)n);
	free(buf);
}

int main(int argc, char **argv)
{
	uint8_t *seed[N_SEEDS];
	size_t len[N_SEEDS], n = seeds(seed, len);
	unsigned long rounds = 0;
	const char *env = getenv("FUZZ_ROUNDS");
	unsigned long per_seed = env ? strtoul(env, NULL, 10) : 20000;

	if (argc == 3 && !strcmp(argv[1], "--write-seeds")) {
		/* Seed a libFuzzer corpus: each seed with and without the
		 * checksum-fixing bit. */
		for (size_t s = 0; s < n; s++) {
			for (int fix = 0; fix < 2; fix++) {
				char path[4096];
				snprintf(path, sizeof(path), "%s/seed-%zu-%d", argv[2], s, fix);
				FILE *f = fopen(path, "wb");
				if (!f)
					return 1;
				seed[s][0] = (uint8_t)(s | (fix ? 0x80 : 0));
				fwrite(seed[s], 1, len[s], f);
				fclose(f);
			}
		}
		return 0;
	}
	for (int i = 1; i < argc; i++)
		run_file(argv[i]);
	for (size_t s = 0; s < n; s++) {
		LLVMFuzzerTestOneInput(seed[s], len[s]);
		uint8_t *m = malloc(len[s]);
		for (unsigned long r = 0; r < per_seed; r++, rounds++) {
			size_t mlen = len[s];
			memcpy(m, seed[s], mlen);
			unsigned edits = 1 + next() % 4;
			for (unsigned e = 0; e < edits; e++) {
				size_t pos = 1 + next() % (mlen - 1);
				switch (next() % 4) {
				case 0:
					m[pos] ^= (uint8_t)(1u << (next() % 8));
					break;
				case 1:
					m[pos] = (uint8_t)next();
					break;
				case 2:
					mlen = 1 + next() % mlen;
					break;
				case 3: /* lie about the payload length */
					if (mlen > 13)
						m[9 + next() % 4] = (uint8_t)next();
					break;
				}
				if (mlen < 2)
					break;
			}
			/* half the time, fix the checksum so protobuf-c sees it */
			m[0] = (uint8_t)(s | ((next() & 1) ? 0x80 : 0));
			LLVMFuzzerTestOneInput(m, mlen);
		}
		free(m);
		free(seed[s]);
	}
	printf("fuzz_replay: %lu mutated inputs decoded or refused without a fault; %lu decoded ones encoded, "
	       "decoded and encoded again to the same bytes\n",
	       rounds, fuzz_round_trips);
	if (fuzz_round_trips < n + rounds / 100) { /* the seeds and 1% of the mutants (4.7% today) */
		fprintf(stderr, "fuzz_replay: only %lu inputs reached the round trip\n", fuzz_round_trips);
		return 1;
	}
	return 0;
}
