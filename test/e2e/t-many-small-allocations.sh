# Three processes with 600 allocations each, every one shared with the other
# two (1,200 imports per process: three batched fetches of up to 250 FDs per
# creator, pipelined; carrier runs of many 4 KiB items; VERIFY by digest
# over thousands of records), driven through the dump phases, native
# checkpoint/restore of each process alone and of all three at once, and the
# rebuild by the plugin's own coordinator (test/bench/scale-bench.sh at a
# small size); every worker then checks the tag of every mapping.
. "$srcdir/lib.sh"

export SCALE_NATIVE_ROUNDS=1
bash "$srcdir/../bench/scale-bench.sh" -p 3 -s 1 -d 0 600 >"$T/bench.out" 2>&1 ||
	{ cat "$T/bench.out"; fail "scale-bench"; }
cat "$T/bench.out"
grep -q "every tag checked in every process: ok" "$T/bench.out" || fail "tags not checked"
grep -q "REBUILD_IMPORTERS" "$T/bench.out" || fail "no rebuild"
note done
