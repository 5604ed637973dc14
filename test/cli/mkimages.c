/*
 * mkimages.c - `mkimages DIR`: write a small, valid cuinterpose checkpoint
 * (inventory, two topology images, one carrier file) into DIR with the
 * plugin's own image writer, so that `cuinterpose show` can be tested
 * without CRIU or a driver. Participant 100 created two shared allocations
 * (3 and 2 chunks of 4096 bytes, the second one short), participant 200
 * imported them. Carrier bytes: byte i of allocation s is (i * s) & 0xff.
 * Used only by test/cli/test_show.sh.
 *
 * `mkimages DIR slab|slab-moved|slab-missing`: one participant (pid 100)
 * with a shared slab of small cuMemAlloc pieces (4096 bytes at offset 0,
 * 100 bytes at 0x2000) and one carrier entry per piece; slab-moved names the
 * second piece at a wrong offset, slab-missing leaves its entry out.
 *
 * `mkimages DIR zstd|zstd-count|zstd-len`: the first checkpoint with chunk 0
 * of allocation 1 stored compressed (one zstd frame at the start of its
 * place, zeros after it, its length in the entry's `stored`); zstd-count
 * gives the entry 2 stored lengths for its 3 chunks, zstd-len claims chunk
 * 1 (raw) stored in all of its 4096 bytes.
 */
#include "config.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

#include "images.h"

#define CHUNK 4096

static const uint64_t sizes[2] = {3 * CHUNK, CHUNK + 100};

static int write_slab(int dirfd, const char *mode)
{
	static const uint64_t off[2] = {0, 0x2000}, len[2] = {4096, 100};
	Cuip__ProcessId self = CUIP__PROCESS_ID__INIT;
	Cuip__ProcessState st = CUIP__PROCESS_STATE__INIT;
	Cuip__AllocId id = CUIP__ALLOC_ID__INIT;
	Cuip__AllocProps props = CUIP__ALLOC_PROPS__INIT;
	Cuip__Allocation al = CUIP__ALLOCATION__INIT, *alp = &al;
	Cuip__Piece pc[2] = {CUIP__PIECE__INIT, CUIP__PIECE__INIT}, *pcp[2] = {&pc[0], &pc[1]};
	Cuip__CarrierEntry ce[2] = {CUIP__CARRIER_ENTRY__INIT, CUIP__CARRIER_ENTRY__INIT}, *cep[2] = {&ce[0], &ce[1]};
	uint32_t crcs[2];
	struct cuip_img_proc p;
	uint8_t ckpt[16] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6}, buf[CHUNK];
	char err[256] = "", carrier[64];
	int fd;

	cuip_carrier_name(100, carrier, sizeof(carrier));
	fd = openat(dirfd, carrier, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return 1;
	self.id = 0x1111111111111111ull;
	self.pid = 100;
	id.creator = self.id;
	id.serial = 1;
	props.size = 2u << 20;
	props.handle_types = 1;
	props.location_type = 1;
	for (int k = 0; k < 2; k++) {
		pc[k].offset = off[k];
		pc[k].size = len[k];
		ce[k].alloc = &id;
		ce[k].file = carrier;
		ce[k].offset = k ? len[0] : 0;
		ce[k].size = len[k];
		ce[k].chunk_size = CHUNK;
		ce[k].has_alloc_offset = 1;
		ce[k].alloc_offset = off[k] + (k && !strcmp(mode, "slab-moved") ? 512 : 0);
		for (size_t i = 0; i < len[k]; i++)
			buf[i] = (uint8_t)(i + (size_t)k);
		crcs[k] = cuip_crc32c(0, buf, len[k]);
		ce[k].crc32c = &crcs[k];
		ce[k].n_crc32c = 1;
		if (write(fd, buf, len[k]) != (ssize_t)len[k])
			return 1;
	}
	close(fd);
	al.id = &id;
	al.kind = CUIP__ALLOC_KIND__KIND_UNICAST;
	al.owner = CUIP__OWNER__OWNER_SHARED;
	al.origin = CUIP__ORIGIN__ORIGIN_MALLOC;
	al.props = &props;
	al.has_slab = 1;
	al.slab = 1;
	al.pieces = pcp;
	al.n_pieces = 2;
	st.self = &self;
	st.phase = CUIP__PHASE__PHASE_PREPARED;
	st.version = (char *)"test";
	st.allocations = &alp;
	st.n_allocations = 1;
	p.st = &st;
	p.carriers = cep;
	p.n_carriers = strcmp(mode, "slab-missing") ? 2 : 1;
	if (cuip_images_write(dirfd, ckpt, &p, 1, len[0] + len[1], NULL, err, sizeof(err))) {
		fprintf(stderr, "mkimages: %s\n", err);
		return 1;
	}
	close(dirfd);
	return 0;
}

int main(int argc, char **argv)
{
	Cuip__ProcessId self[2] = {CUIP__PROCESS_ID__INIT, CUIP__PROCESS_ID__INIT};
	Cuip__ProcessState st[2] = {CUIP__PROCESS_STATE__INIT, CUIP__PROCESS_STATE__INIT};
	Cuip__AllocId ids[2] = {CUIP__ALLOC_ID__INIT, CUIP__ALLOC_ID__INIT};
	Cuip__AllocProps props[2] = {CUIP__ALLOC_PROPS__INIT, CUIP__ALLOC_PROPS__INIT};
	Cuip__Allocation al[2][2], *alp[2][2];
	Cuip__CarrierEntry ce[2] = {CUIP__CARRIER_ENTRY__INIT, CUIP__CARRIER_ENTRY__INIT}, *cep[2];
	uint32_t crcs[2][4], stored[3] = {0};
	const char *mode = argc == 3 ? argv[2] : "";
	uint8_t frame[2 * CHUNK];
	struct cuip_img_proc p[2];
	uint8_t ckpt[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, buf[CHUNK];
	char err[256] = "", carrier[64];
	uint64_t off = 0;
	int dirfd, fd;

	if (argc < 2 || argc > 3 || (dirfd = open(argv[1], O_RDONLY | O_DIRECTORY)) < 0) {
		fprintf(stderr, "usage: mkimages DIR [slab|slab-moved|slab-missing|zstd|zstd-count|zstd-len]\n");
		return 2;
	}
	if (!strncmp(mode, "slab", 4))
		return write_slab(dirfd, mode);
	cuip_carrier_name(100, carrier, sizeof(carrier));
	fd = openat(dirfd, carrier, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return 1;
	for (int k = 0; k < 2; k++) {
		self[k].id = k ? 0x2222222222222222ull : 0x1111111111111111ull;
		self[k].pid = k ? 200 : 100;
		st[k].self = &self[k];
		st[k].phase = CUIP__PHASE__PHASE_PREPARED;
		st[k].version = (char *)"test";
		ids[k].creator = self[0].id;
		ids[k].serial = (uint64_t)k + 1;
		props[k].size = sizes[k];
		props[k].handle_types = 1;
		props[k].location_type = 1;
		ce[k].alloc = &ids[k];
		ce[k].file = carrier;
		ce[k].offset = off;
		ce[k].size = sizes[k];
		ce[k].chunk_size = CHUNK;
		ce[k].crc32c = crcs[k];
		for (uint64_t o = 0; o < sizes[k]; o += CHUNK) {
			size_t len = sizes[k] - o < CHUNK ? sizes[k] - o : CHUNK;
			for (size_t i = 0; i < len; i++)
				buf[i] = (uint8_t)((o + i) * ids[k].serial);
			crcs[k][ce[k].n_crc32c++] = cuip_crc32c(0, buf, len);
			if (!strncmp(mode, "zstd", 4) && k == 0 && o == 0) {
				size_t z = ZSTD_compress(frame, sizeof(frame), buf, len, 1);

				if (ZSTD_isError(z) || z >= len)
					return 1;
				stored[0] = (uint32_t)z;
				memcpy(buf, frame, z);
				memset(buf + z, 0, len - z);
			}
			if (write(fd, buf, len) != (ssize_t)len)
				return 1;
		}
		off += sizes[k];
		cep[k] = &ce[k];
	}
	if (!strncmp(mode, "zstd", 4)) {
		ce[0].stored = stored;
		ce[0].n_stored = strcmp(mode, "zstd-count") ? 3 : 2;
		if (!strcmp(mode, "zstd-len"))
			stored[1] = CHUNK;
	} else if (*mode) {
		fprintf(stderr, "mkimages: unknown mode %s\n", mode);
		return 2;
	}
	close(fd);
	for (int k = 0; k < 2; k++) {
		for (int a = 0; a < 2; a++) {
			Cuip__Allocation init = CUIP__ALLOCATION__INIT;
			al[k][a] = init;
			al[k][a].id = &ids[a];
			al[k][a].kind = CUIP__ALLOC_KIND__KIND_UNICAST;
			al[k][a].owner = CUIP__OWNER__OWNER_SHARED;
			al[k][a].origin = k ? CUIP__ORIGIN__ORIGIN_VMM_IMPORT : CUIP__ORIGIN__ORIGIN_VMM_CREATE;
			al[k][a].props = &props[a];
			al[k][a].has_creator_pid = 1;
			al[k][a].creator_pid = 100;
			alp[k][a] = &al[k][a];
		}
		st[k].allocations = alp[k];
		st[k].n_allocations = 2;
		p[k].st = &st[k];
		p[k].carriers = k ? NULL : cep;
		p[k].n_carriers = k ? 0 : 2;
	}
	if (cuip_images_write(dirfd, ckpt, p, 2, sizes[0] + sizes[1], NULL, err, sizeof(err))) {
		fprintf(stderr, "mkimages: %s\n", err);
		return 1;
	}
	close(dirfd);
	return 0;
}
