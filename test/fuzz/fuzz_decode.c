/*
 * fuzz_decode.c - fuzz target for every decoder that reads outside input
 * through images/wire.c: control requests and responses (from sockets),
 * topology and inventory images (from disk), tickets (from memfds).
 *
 * The first input byte picks the kind (its top bit: fix the checksum so the
 * protobuf parser is reached); the rest is the blob.
 *
 * Built two ways: with clang's libFuzzer (`make fuzz`) and, for `make
 * check` with any compiler, with a replay main() that runs a deterministic
 * mutation loop over valid seeds (fuzz_replay.c).
 */
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct {
	unsigned kind;
	const ProtobufCMessageDescriptor *desc;
} targets[] = {
	{CUIP_KIND_REQUEST, &cuip__request__descriptor},   {CUIP_KIND_RESPONSE, &cuip__response__descriptor},
	{CUIP_KIND_TOPOLOGY, &cuip__topology__descriptor}, {CUIP_KIND_INVENTORY, &cuip__inventory__descriptor},
	{CUIP_KIND_TICKET, &cuip__ticket__descriptor},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ProtobufCMessage *m;
	uint8_t *buf;
	char err[256];
	ssize_t len;

	if (size < 1)
		return 0;
	unsigned t = (data[0] & 0x7f) % (sizeof(targets) / sizeof(targets[0]));
	int rc;
	if ((data[0] & 0x80) && size - 1 >= CUIP_FRAME_SIZE) {
		/* Reach the protobuf parser: make the checksum match. */
		uint8_t *copy = malloc(size - 1);
		struct cuip_frame f;
		memcpy(copy, data + 1, size - 1);
		memcpy(&f, copy, sizeof(f));
		size_t plen = size - 1 - CUIP_FRAME_SIZE;
		f.crc = cuip_crc32c(0, copy + CUIP_FRAME_SIZE, f.len < plen ? f.len : plen);
		memcpy(copy, &f, sizeof(f));
		rc = cuip_decode(copy, size - 1, targets[t].kind, targets[t].desc, NULL, &m, err, sizeof(err));
		free(copy);
	} else {
		rc = cuip_decode(data + 1, size - 1, targets[t].kind, targets[t].desc, NULL, &m, err, sizeof(err));
	}
	if (rc)
		return 0;
	/* Whatever decoded must pack again without a fault. (A re-packed
	 * message may not decode: protobuf-c keeps unknown fields and can
	 * re-emit an out-of-range tag as tag 0, see RESULTS.md; cuinterpose
	 * never forwards a received message without re-validating it.) */
	len = cuip_encode(targets[t].kind, m, &buf);
	if (len < 0 && len != -EMSGSIZE)
		abort();
	if (len > 0)
		free(buf);
	protobuf_c_message_free_unpacked(m, NULL);
	return 0;
}
