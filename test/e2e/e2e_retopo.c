/*
 * e2e_retopo - `e2e_retopo DIR NAME`: rewrite the topology image NAME in
 * DIR with one record changed (the access flags of its first mapping with
 * an access entry), framed and checksummed like the plugin writes it: an
 * image that reads back fine but no longer matches the process it
 * describes. Used by t-verify-mismatch-killed.sh.
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "cuinterpose.pb-c.h"
#include "wire.h"

int main(int argc, char **argv)
{
	Cuip__Topology *t;
	char err[256];
	int dirfd, ret = 1;

	if (argc != 3 || (dirfd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		fprintf(stderr, "usage: e2e_retopo DIR NAME\n");
		return 2;
	}
	if (cuip_image_read(dirfd, argv[2], CUIP_KIND_TOPOLOGY, &cuip__topology__descriptor, NULL,
			    (ProtobufCMessage **)&t, err, sizeof(err))) {
		fprintf(stderr, "e2e_retopo: %s\n", err);
		return 1;
	}
	for (size_t i = 0; i < t->state->n_mappings; i++) {
		Cuip__Mapping *m = t->state->mappings[i];

		if (!m->n_access)
			continue;
		m->access[0]->flags ^= 1;
		printf("mapping at %#llx: access flags %u -> %u\n", (unsigned long long)m->va, m->access[0]->flags ^ 1,
		       m->access[0]->flags);
		ret = cuip_image_write(dirfd, argv[2], CUIP_KIND_TOPOLOGY, &t->base) ? 1 : 0;
		if (ret)
			fprintf(stderr, "e2e_retopo: cannot write %s\n", argv[2]);
		goto out;
	}
	fprintf(stderr, "e2e_retopo: no mapping with an access entry in %s\n", argv[2]);
out:
	/* freed so that LeakSanitizer (sanitizer builds) has nothing to report */
	protobuf_c_message_free_unpacked(&t->base, NULL);
	close(dirfd);
	return ret;
}
