#!/usr/bin/env bash
# The fake driver answers docs/driver-facts.md's native-checkpoint table exactly as
# NVIDIA's driver did on an H200 (580.159.04, recorded by test/gpu/facts.sh
# on 2026-11-29 in test/gpu/facts.expected): the same program, written only
# against cuda.h, gets the same CUresult from the same calls, the same states
# and the same outcome (importers stuck, exporters and private memory intact).
set -u
[ "$(id -u)" = 0 ] || { echo "SKIP: the checkpoint API needs root (as on the real driver)"; exit 77; }
work=$(mktemp -d /tmp/fakecuda-facts.XXXXXX)
trap 'FAKECUDA_SOCKET=$work/devd.sock "$FAKECUDA_RUN" --stop >/dev/null 2>&1; rm -rf "$work"' EXIT
mkdir "$work/bin"
ln -s "$FAKECUDA_FACTS_WORKLOAD" "$work/bin/facts-workload"
ln -s "$FAKECUDA_CKPT" "$work/bin/fakecuda-ckpt"
FAKECUDA_SOCKET=$work/devd.sock bash "$FAKECUDA_FACTS_SH" "$work/bin" >"$work/fake.out" 2>&1
if ! diff -u "$FAKECUDA_FACTS_EXPECTED" "$work/fake.out"; then
	echo "FAIL: the fake driver differs from the H200 (- H200, + fake)"
	exit 1
fi
echo "PASS: $(wc -l <"$work/fake.out") lines identical to the H200's"
