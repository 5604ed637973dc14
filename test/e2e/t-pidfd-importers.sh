# Importers that take the creator's ticket descriptors themselves with
# pidfd_open + pidfd_getfd (PyTorch's expandable_segments) and close them
# after the import: two dump + restore cycles, every byte and address
# checked, a write by the importer seen by the creator, and after the
# restores a new importer takes a ticket from the restored creator.
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

start_proc 3
cmd 3 verify 0
before=$(answers 3)
echo "$before" | sed -n 2p | grep -q " sh0 0x[0-9a-f]* sh1 0x" || fail "rank 1 did not map both imports: $before"
for c in 1 2; do
	note "cycle $c"
	criu_dump "$T/d$c" || fail "criu dump $c"
	has_line "$T/d$c/dump.log" "2 participants, 2 CUDA processes" "wrong participant count"
	wait_gone $(job_pids) || fail "the dumped job did not exit"
	criu_restore "$T/d$c" || fail "criu restore $c"
	cmd 3 verify $((c - 1))
	[ "$(answers 3)" = "$before" ] || fail "addresses changed: $(answers 3) (was $before)"
	cmd 3 write 1 $c
	cmd 3 verify $c
done
note "a new importer takes a ticket from the restored creator"
cmd 3 cuda 2 2
cmd 3 verify 2
cmd 3 write 2 9
cmd 3 verify 9
cmd 3 exit
note done
