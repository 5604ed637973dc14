/*
 * fuzz_decode.c - fuzz target for every decoder that reads outside input
 * through protocol/wire.c: control requests and responses (from sockets),
 * topology and inventory images (from disk), tickets (from memfds).
 *
 * The first input byte picks the kind (its top bit: fix the checksum so the
 * protobuf parser is reached); the rest is the blob.
 *
 * Built two ways: with clang's libFuzzer (`make fuzz`) and, for `make
 * check` with any compiler, with a replay main() that runs a deterministic
 * mutation loop over valid seeds (fuzz_replay.c). The oracle: no fault, and
 * a message without unknown fields decodes from its own encoding to the
 * same bytes again (round_trip).
 */
#include <stdbool.h>
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
	{CUIP_KIND_REQUEST, &cuip__request__descriptor},
	{CUIP_KIND_RESPONSE, &cuip__response__descriptor},
	{CUIP_KIND_TOPOLOGY, &cuip__topology__descriptor},
	{CUIP_KIND_INVENTORY, &cuip__inventory__descriptor},
	{CUIP_KIND_TICKET, &cuip__ticket__descriptor},
	{CUIP_KIND_AGENT, &cuip__agent_message__descriptor},
	{CUIP_KIND_GUARDIAN, &cuip__guardian_message__descriptor},
};

/* Inputs whose decoded message went through the whole round trip. */
unsigned long fuzz_round_trips;

/* Whether m or any message inside it kept fields this version does not know. */
static bool has_unknown(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	if (m->n_unknown_fields)
		return true;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const char *base = (const char *)m;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)(base + f->quantifier_offset);
			ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);

			for (size_t k = 0; k < n; k++)
				if (v[k] && has_unknown(v[k]))
					return true;
			continue;
		}
		if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    *(const uint32_t *)(base + f->quantifier_offset) != f->id)
			continue;
		const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
		if (sub && has_unknown(sub))
			return true;
	}
	return false;
}

static void oracle_failed(const char *what, const char *detail)
{
	fprintf(stderr, "fuzz oracle: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
	abort();
}

/*
 * The oracle. Whatever decoded must encode again without a fault. A message
 * that kept no unknown fields must also survive the round trip: its encoding
 * decodes, and encoding that again gives the same bytes. (protobuf-c keeps
 * unknown fields and can re-emit an out-of-range tag as tag 0, see
 * RESULTS.md; cuinterpose never forwards a received message without
 * re-validating it, so those only have to encode.)
 */
static void round_trip(unsigned kind, const ProtobufCMessageDescriptor *desc, const ProtobufCMessage *m)
{
	ProtobufCMessage *m2;
	uint8_t *buf, *buf2;
	char err[256];
	ssize_t len, len2;

	len = cuip_encode(kind, m, &buf);
	if (len < 0 && len != -EMSGSIZE)
		oracle_failed("a decoded message does not encode", strerror((int)-len));
	if (len < 0 || has_unknown(m)) {
		if (len > 0)
			free(buf);
		return;
	}
	if (cuip_decode(buf, (size_t)len, kind, desc, NULL, &m2, err, sizeof(err)))
		oracle_failed("a re-encoded message does not decode", err);
	len2 = cuip_encode(kind, m2, &buf2);
	if (len2 != len || memcmp(buf, buf2, (size_t)len))
		oracle_failed("decoding and encoding again changed the bytes", NULL);
	fuzz_round_trips++;
	free(buf2);
	free(buf);
	protobuf_c_message_free_unpacked(m2, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ProtobufCMessage *m;
	char err[256];

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
	round_trip(targets[t].kind, targets[t].desc, m);
	protobuf_c_message_free_unpacked(m, NULL);
	return 0;
}
